"""Turn one sequence's generated tokens into output text: UTF-8-safe, stop tokens, stop strings.

Stop strings are found by containment in a held-back window (the last
len(longest stop) - 1 characters are never emitted early), so a stop string
split across tokens or streaming chunks is still cut, and never appears in
the output.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from .detokenize import IncrementalDetokenizer


class TextStream:
    def __init__(self, processor, stop: Sequence[str] | None = None, stop_token_ids: Iterable[int] = (),
                 skip_special_tokens: bool = True, prompt_ids: Sequence[int] = ()):
        self.detok = IncrementalDetokenizer(processor, skip_special_tokens=skip_special_tokens,
                                            prompt_ids=prompt_ids)
        self.stop = [s for s in (stop or []) if s]
        self.stop_token_ids = set(int(t) for t in stop_token_ids)
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.pending = ""  # decoded text not yet emitted: it may be the start of a stop string
        self.text = ""  # everything emitted
        self.token_ids: list[int] = []  # tokens consumed, including a final stop token
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None  # the stop string or stop token that ended it

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def _emit(self, upto: int) -> str:
        out, self.pending = self.pending[:upto], self.pending[upto:]
        self.text += out
        return out

    def _cut_at_stop(self) -> bool:
        hits = [(self.pending.find(s), s) for s in self.stop]
        hits = [(i, s) for i, s in hits if i >= 0]
        if not hits:
            return False
        index, stop = min(hits)
        self.pending = self.pending[:index]
        self.finish_reason, self.stop_reason = "stop", stop
        return True

    def add(self, token_ids: Iterable[int]) -> str:
        """Feed generated tokens; returns the text that may now be shown. Stops consuming once finished."""
        for token in token_ids:
            if self.finished:
                break
            token = int(token)
            self.token_ids.append(token)
            if token in self.stop_token_ids:
                self.finish_reason, self.stop_reason = "stop", token
                self.pending += self.detok.flush()
                break
            self.pending += self.detok.add([token])
            if self.stop and self._cut_at_stop():
                break
        if self.finished:
            return self._emit(len(self.pending))
        return self._emit(max(0, len(self.pending) - self.hold))

    def finish(self, reason: str = "length") -> str:
        """End of generation (if not already stopped): flush held text; returns the last piece."""
        if not self.finished:
            self.pending += self.detok.flush()
            if not (self.stop and self._cut_at_stop()):
                self.finish_reason = reason
        return self._emit(len(self.pending))
