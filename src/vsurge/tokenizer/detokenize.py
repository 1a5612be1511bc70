"""Incremental detokenization that never emits half of a multi-byte character.

Byte-level BPE splits emoji and CJK characters across tokens; decoding one
token at a time yields U+FFFD. We decode a small window [prefix, end) and
emit only the new text, and only once it no longer ends in U+FFFD. The prefix
window also keeps SentencePiece's leading-space handling right.
"""

from __future__ import annotations

from typing import Sequence

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, processor, skip_special_tokens: bool = True, prompt_ids: Sequence[int] = ()):
        self.processor = processor
        self.skip_special_tokens = skip_special_tokens
        # A few prompt tokens give the first generated token its context
        # (e.g. whether a leading space is kept).
        self.ids: list[int] = list(prompt_ids[-4:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""  # everything emitted so far

    def _decode(self, ids) -> str:
        return self.processor.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, token_ids: Sequence[int]) -> str:
        """Feed new token ids; return the newly completed text (may be "")."""
        self.ids.extend(int(t) for t in token_ids)
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        if len(full) > len(prefix) and not full.endswith(REPLACEMENT):
            delta = full[len(prefix) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            self.text += delta
            return delta
        return ""

    def flush(self) -> str:
        """At the end of generation: whatever is still held back (even if incomplete bytes)."""
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        delta = full[len(prefix) :] if len(full) > len(prefix) else ""
        if delta.endswith(REPLACEMENT):
            delta = delta.rstrip(REPLACEMENT)  # an unfinished character is dropped, never emitted broken
        self.text += delta
        return delta
