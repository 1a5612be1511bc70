"""CompiledGrammar: one compiled constraint, shared by every sequence that uses it.

Apart from compiler.py so the matcher (which reads it) and the compiler (which builds it and
hands out matchers) do not import each other.
"""

from __future__ import annotations

import threading


class CompiledGrammar:
    """A compiled constraint: a pristine llguidance matcher that new sequences copy."""

    def __init__(self, key: tuple[str, str], template, eos_token_ids: list[int], vocab_size: int):
        self.key = key
        self.eos_token_ids = eos_token_ids  # the ids llguidance allows when the output may end
        self.vocab_size = vocab_size
        self._template = template
        self._lock = threading.Lock()  # llguidance objects are not shared across threads unguarded

    def new_llmatcher(self):
        with self._lock:
            return self._template.deep_copy()
