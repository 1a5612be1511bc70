"""Token-budget scheduler for the paged engine (pure Python, no device work).

Each step it builds a NextIterationPlan: every running sequence with exactly
one token left to compute decodes it; then at most one prefill chunk (a new
prompt, the rest of a long prompt, or a preempted sequence being recomputed)
fills the remaining token budget. New sequences are admitted FIFO while a
sampling slot and pages are free. When a decoding sequence needs a page and
none is left, the most recently admitted sequence is preempted: its pages are
freed and it goes back to the front of the queue with everything it generated,
to be recomputed later (vLLM's recompute preemption). Full pages are
committed to the prefix cache as soon as their tokens are computed.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq

from .page_manager import HBMPageManager


@dataclasses.dataclass(eq=False)
class Sequence:
    """One request inside the paged engine."""

    request: object  # an ActiveRequest
    tokens: list[int]  # prompt, then every generated token
    num_prompt: int
    num_computed: int = 0  # tokens whose K/V are in the cache
    slot: int | None = None  # row of the engine's sampling state while admitted
    needs_slot_setup: bool = False  # the engine must (re)load this slot's sampling state

    @property
    def seq_id(self) -> int:
        return self.request.request_id

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.num_prompt:]

    @property
    def remaining(self) -> int:
        return len(self.tokens) - self.num_computed


@dataclasses.dataclass
class NextIterationPlan:
    """What one engine step computes."""

    decode: list[Sequence]  # each computes its last token and samples the next
    prefill: Sequence | None = None
    chunk_start: int = 0
    chunk_length: int = 0

    @property
    def prefill_samples(self) -> bool:
        """The chunk reaches the end of the sequence, so its last token's logits give a new token."""
        return self.prefill is not None and self.chunk_start + self.chunk_length == len(self.prefill.tokens)

    @property
    def empty(self) -> bool:
        return not self.decode and self.prefill is None


class Scheduler:
    def __init__(self, manager: HBMPageManager, max_running: int, chunk_size: int, token_budget: int | None = None):
        self.manager = manager
        self.max_running = max_running
        self.chunk_size = chunk_size
        self.token_budget = token_budget or chunk_size + max_running
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: list[Sequence] = []  # in admission order: the last one is preempted first
        self._free_slots = list(range(max_running))
        self.num_preemptions = 0

    # ------------------------------------------------------------ membership
    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def finish(self, seq: Sequence) -> None:
        """Remove a sequence for good (done, cancelled or failed) and free its pages and slot."""
        if seq in self.running:
            self._release(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    def _release(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.manager.free_sequence(seq.seq_id)
        heapq.heappush(self._free_slots, seq.slot)
        seq.slot = None

    def _preempt(self, seq: Sequence) -> None:
        self._release(seq)
        seq.num_computed = 0
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ------------------------------------------------------------ planning
    def schedule(self) -> NextIterationPlan:
        decode = self._schedule_decodes()
        budget = self.token_budget - len(decode)
        prefill = next((s for s in self.running if s.remaining > 1), None)
        if prefill is None:
            prefill = self._admit()
        if prefill is None or prefill.remaining == 1:
            # a just-admitted one-token prompt decodes directly
            if prefill is not None and self.manager.reserve(prefill.seq_id, len(prefill.tokens)):
                decode.append(prefill)
            return NextIterationPlan(decode)
        start = prefill.num_computed
        length = min(prefill.remaining, self.chunk_size, budget)
        # a chunk that stops short of the end samples nothing; the sequence then decodes
        length = self._fit_pages(prefill, length)
        if length <= 0:
            return NextIterationPlan(decode)
        return NextIterationPlan(decode, prefill, start, length)

    def _schedule_decodes(self) -> list[Sequence]:
        decode: list[Sequence] = []
        for seq in list(self.running):
            if seq not in self.running or seq.remaining != 1:
                continue
            while not self.manager.reserve(seq.seq_id, len(seq.tokens)):
                victim = self.running[-1]
                self._preempt(victim)
                if victim in decode:
                    decode.remove(victim)
                if victim is seq:
                    break
            else:
                decode.append(seq)
        return decode

    def _admit(self) -> Sequence | None:
        if not self.waiting or not self._free_slots:
            return None
        seq = self.waiting[0]
        cached = self.manager.add_sequence(seq.seq_id, seq.tokens)
        first = min(seq.remaining if seq.remaining > 0 else 1, self.chunk_size)
        # admit only if the first chunk fits, or nothing else could ever free pages for it
        if not self.manager.can_reserve(seq.seq_id, cached + first) and self.running:
            self.manager.free_sequence(seq.seq_id)
            return None
        self.waiting.popleft()
        seq.num_computed = cached
        seq.slot = heapq.heappop(self._free_slots)
        seq.needs_slot_setup = True
        self.running.append(seq)
        return seq

    def _fit_pages(self, seq: Sequence, length: int) -> int:
        """Shrink a chunk to the pages that can be had now (whole pages beyond the table)."""
        if self.manager.reserve(seq.seq_id, seq.num_computed + length):
            return length
        ps = self.manager.page_size
        have = len(self.manager.page_table(seq.seq_id)) + self.manager.num_free_pages
        length = min(length, have * ps - seq.num_computed)
        if length > 0 and self.manager.reserve(seq.seq_id, seq.num_computed + length):
            return length
        return 0

    # ------------------------------------------------------------ results
    def step_done(self, plan: NextIterationPlan, sampled: dict[Sequence, int]) -> None:
        """Account a finished step: computed tokens, new tokens, prefix-cache commits."""
        for seq in plan.decode:
            seq.num_computed += 1
        if plan.prefill is not None:
            plan.prefill.num_computed += plan.chunk_length
        for seq, token in sampled.items():
            seq.tokens.append(token)
        for seq in {*plan.decode, *([plan.prefill] if plan.prefill else [])}:
            if seq in self.running:  # not preempted by this plan
                self.manager.commit(seq.seq_id, seq.tokens, seq.num_computed)
