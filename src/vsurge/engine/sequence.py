"""Sequence: one generated sequence inside an engine, from admission to its last token.

It carries everything the scheduler needs (tokens, how many have their K/V
written, its slot and page table) and its output stream, which turns tokens
into text and is the one place that decides the sequence is finished (an end
token, max_tokens, a stop string, or an abort).
"""

from __future__ import annotations

import dataclasses
import enum
import time

from ..kv.page_table import PageTable
from .outputs import SequenceOutput
from .request import ActiveRequest


class Status(enum.Enum):
    WAITING = "waiting"  # queued, or preempted and waiting to be recomputed
    RUNNING = "running"  # holds a slot and pages
    FINISHED = "finished"


@dataclasses.dataclass(eq=False)
class Sequence:
    request: ActiveRequest
    output: SequenceOutput
    tokens: list[int]  # prompt, then every generated token
    num_prompt: int
    num_computed: int = 0  # leading tokens whose K/V are written
    slot: int | None = None  # row of the engine's per-slot sampling state while running
    adapter_slot: int = -1  # its LoRA adapter's device slot while running (lora/slots.py); -1: the base model
    pages: PageTable = dataclasses.field(default_factory=PageTable)
    status: Status = Status.WAITING
    needs_setup: bool = False  # the engine must (re)load this slot's sampling state before its next step
    # the request's trace (perf_counter times; arrival is request.submitted_at): admitted to a slot, and
    # when the first step computing its prompt began on the device (metrics: queue, step wait, prefill)
    admitted_at: float | None = None
    prefill_started_at: float | None = None
    matcher: object | None = None  # a GrammarMatcher when the output is constrained (structured outputs)
    speculate_after: int = 0  # no drafts before the sequence holds this many tokens (after a miss)
    prefix_waits: int = 0  # steps it waited for a prefix another sequence was computing
    preempted: bool = False  # preempted at least once (its resumption's tier hits are swap-ins)
    # tokens sampled by the step in flight (the overlapped loop plans the next step before reading
    # them: they count as tokens, and their K/V as computed, but `tokens` holds only those read)
    pending: int = 0
    # a speculating hybrid model: the draft-state row holding its states after the drafts its last step
    # accepted, which its next step starts from (kv/recurrent.py); None: its slot holds them
    state_restore: int | None = None

    @classmethod
    def of(cls, request: ActiveRequest, processor, vocab_size: int | None = None) -> "Sequence":
        """vocab_size: the model's logits width (needed by constrained requests' matchers)."""
        matcher = None
        if request.params.structured is not None:
            from ..structured.compiler import compiler_for

            matcher = compiler_for(processor, vocab_size).matcher(request.params.structured, request.eos_token_ids)
        pages = PageTable(root=None if request.adapter is None else request.adapter.key)  # (adapters' KV apart)
        tokens = list(request.cache_ids or request.prompt_ids)  # (an image's positions: its pseudo-tokens)
        return cls(request, SequenceOutput(request, processor), tokens, len(tokens), pages=pages, matcher=matcher)

    @property
    def seq_id(self) -> int:
        return self.request.request_id

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.num_prompt:]

    @property
    def num_tokens(self) -> int:
        """Tokens, the ones in flight included."""
        return len(self.tokens) + self.pending

    @property
    def num_generated(self) -> int:
        return self.num_tokens - self.num_prompt

    @property
    def remaining(self) -> int:
        """Tokens whose K/V still have to be computed (1 = decoding: the last sampled token)."""
        return self.num_tokens - self.num_computed

    @property
    def tokens_left(self) -> int:
        """Tokens it may still generate (after those in flight)."""
        return self.request.max_new_tokens - self.num_generated

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def mark_admitted(self, slot: int) -> None:
        self.slot, self.status, self.needs_setup = slot, Status.RUNNING, True
        self.admitted_at = self.admitted_at or time.perf_counter()
