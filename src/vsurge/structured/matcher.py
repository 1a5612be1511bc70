"""GrammarMatcher: one sequence's position in its grammar, on the host.

Per step the engine asks each constrained row's matcher to fill that row of the
(B, ceil(V/32)) int32 bitmask (`fill_bitmask`, or `fill_bitmasks` for all rows
at once, in parallel), applies the bitmask in the compiled step, then feeds the
sampled token back (`accept`).

End tokens. The grammar is compiled with the model's EOS ids; a request ends on
its own ids (`SamplingParams.eos_ids(model_eos)`: EOS unless ignore_eos, plus
stop_token_ids). The matcher rewrites those bits in every row it fills: all of
the request's end ids are allowed exactly when the output so far is complete,
and none otherwise (so a stop token id that is also an ordinary token cannot cut
the output short). When the grammar cannot go on at all (`is_finished` after an
accept, e.g. the closing brace of an object), the next mask allows only the end
ids, or the engine ends the row at once (finish_reason "stop") and saves that
step. A request with no end ids (ignore_eos and no stop_token_ids) must be ended
on `is_finished`; one whose grammar is complete but could go on (a top-level
number, `a+`) is allowed its model EOS rather than nothing, so a row is never
all -inf.
"""

from __future__ import annotations

import os
import threading
from typing import Sequence

import numpy as np

from .bitmask import set_tokens
from .compiled import CompiledGrammar


class GrammarMatcher:
    def __init__(self, compiled: CompiledGrammar, end_token_ids: Sequence[int] | None = None):
        self.compiled = compiled
        self._llm = compiled.new_llmatcher()
        self.grammar_eos_ids = list(compiled.eos_token_ids)
        self.end_token_ids = list(self.grammar_eos_ids if end_token_ids is None else end_token_ids)
        self._end_set = frozenset(self.end_token_ids)
        self._fallback_ids = self.end_token_ids or self.grammar_eos_ids
        self._ended = False  # an end token was accepted
        self.num_accepted = 0  # tokens accepted (end token included): what rollback can undo

    # ------------------------------------------------------------ state
    @property
    def is_finished(self) -> bool:
        """The row must end now: an end token was accepted, the grammar cannot go on, or the
        matcher failed (see `error`)."""
        return self._ended or self._llm.is_stopped()

    @property
    def is_accepting(self) -> bool:
        """The output so far is complete (ending here would be valid)."""
        return self._ended or self._llm.is_accepting()

    @property
    def error(self) -> str | None:
        """Why the matcher failed (a token outside its mask was accepted, a parser limit), or None."""
        return _short(self._llm.get_error()) if self._llm.is_error() else None

    # ------------------------------------------------------------ masks
    def fill_bitmask(self, bitmask: np.ndarray, row: int) -> None:
        """Write the allowed next tokens into bitmask[row]; bitmask (B, ceil(V/32)) int32, C-contiguous."""
        words = bitmask[row]
        if words.size != (self.compiled.vocab_size + 31) // 32 or not words.flags["C_CONTIGUOUS"]:
            raise ValueError(f"bitmask rows need {(self.compiled.vocab_size + 31) // 32} contiguous int32 words "
                             f"(the compiler's vocab_size is {self.compiled.vocab_size}), got {words.size}")
        if self._ended:
            words[:] = 0
            set_tokens(words, self._fallback_ids, True)
            return
        self._llm.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
        self._fix_end_tokens(words)

    def _fix_end_tokens(self, words: np.ndarray) -> None:
        """llguidance allowed (or not) the grammar's EOS ids; move that to the request's end ids."""
        may_end = any((int(words[t // 32]) >> (t % 32)) & 1 for t in self.grammar_eos_ids)
        if self.end_token_ids != self.grammar_eos_ids:
            set_tokens(words, self.grammar_eos_ids, False)
            set_tokens(words, self.end_token_ids, may_end)
        # With end ids a row is never empty (llguidance allows EOS when nothing else fits).
        if not self.end_token_ids and not words.any():  # complete, no end ids: end on EOS
            set_tokens(words, self._fallback_ids, True)

    # ------------------------------------------------------------ tokens
    def accept(self, token: int) -> bool:
        """Advance by the sampled token. False: the token was not allowed (the matcher is then
        in error and `is_finished`; the engine should end the row)."""
        token = int(token)
        if self._ended:
            return False
        if self._is_end(token):
            if not self._llm.is_accepting():
                return False
            self._ended = True
        elif not self._llm.consume_token(token):
            return False
        self.num_accepted += 1
        return True

    def _is_end(self, token: int) -> bool:
        return token in self._end_set or (not self.end_token_ids and token in self.grammar_eos_ids)

    def accept_tokens(self, tokens: Sequence[int]) -> int:
        """Accept tokens in order until one is refused; returns how many were accepted."""
        for i, token in enumerate(tokens):
            if not self.accept(token):
                return i
        return len(tokens)

    def validate_tokens(self, tokens: Sequence[int]) -> int:
        """How many of `tokens` (e.g. draft tokens) would be accepted in order; the state is unchanged."""
        if self._ended:
            return 0
        tokens = [int(t) for t in tokens]
        cut = next((i for i, t in enumerate(tokens) if self._is_end(t)), len(tokens))
        count = self._llm.validate_tokens(tokens[:cut])
        if count < cut or cut == len(tokens):
            return count
        # tokens[cut] ends the output: valid when the tokens before it complete it
        self._llm.consume_tokens(tokens[:cut])
        complete = self._llm.is_accepting()
        self._llm.rollback(cut)
        return cut + 1 if complete else cut

    def rollback(self, num_tokens: int) -> bool:
        """Undo the last `num_tokens` accepted tokens (speculative decoding, recompute)."""
        if num_tokens < 0 or num_tokens > self.num_accepted:
            return False
        remaining = num_tokens
        if remaining and self._ended:
            self._ended = False
            remaining -= 1
        if remaining and not self._llm.rollback(remaining):
            return False
        self.num_accepted -= num_tokens
        return True

    def reset(self) -> None:
        self._llm.reset()
        self._ended = False
        self.num_accepted = 0


def _short(message: str) -> str:
    return message.strip().split("\n<state>")[0].strip()


PARALLEL_MIN_ROWS, PARALLEL_MIN_CPUS = 8, 4
_EXECUTOR = None
_EXECUTOR_LOCK = threading.Lock()


def _executor():
    global _EXECUTOR
    with _EXECUTOR_LOCK:
        if _EXECUTOR is None:
            import llguidance

            _EXECUTOR = llguidance.LLExecutor()
        return _EXECUTOR


def fill_bitmasks(bitmask: np.ndarray, rows: Sequence[tuple[int, GrammarMatcher]]) -> None:
    """Fill the rows of several matchers at once; bitmask (B, ceil(V/32)) int32, C-contiguous.

    rows: (row index, matcher) pairs; rows not listed are left as they are (all ones for free
    rows). With enough rows and cores llguidance computes the masks on its own threads without
    the GIL; on a 2-core machine threads cost more than they save (docs/structured_outputs.md)."""
    if len(rows) < PARALLEL_MIN_ROWS or (os.cpu_count() or 1) < PARALLEL_MIN_CPUS:
        for row, matcher in rows:
            matcher.fill_bitmask(bitmask, row)
        return
    if bitmask.dtype != np.int32 or bitmask.ndim != 2 or not bitmask.flags["C_CONTIGUOUS"]:
        raise ValueError("the bitmask must be a C-contiguous (B, ceil(V/32)) int32 array")
    batch, words = bitmask.shape
    live = [(m._llm, row) for row, m in rows if not m._ended]
    if live:
        _executor().unsafe_compute_mask_ptr(live, bitmask.ctypes.data, words * 4, batch)
    for row, matcher in rows:
        if matcher._ended:
            matcher.fill_bitmask(bitmask, row)
        else:
            matcher._fix_end_tokens(bitmask[row])
