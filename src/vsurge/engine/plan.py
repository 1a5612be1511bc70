"""What one engine step computes (`StepPlan`: decode rows, prompt chunk rows, drafts) and what the
scheduler reads back from it (`HostStepOutput`): the scheduler makes plans (scheduler.py),
batch.py turns them into padded arrays, the engine runs them, the driver passes them along."""

from __future__ import annotations

import dataclasses

from .sequence import Sequence


@dataclasses.dataclass
class HostStepOutput:
    """What postprocess reads from a step: numpy arrays (engine/programs.py StepOutput.to_host, or a
    remote engine's reply)."""

    tokens: object  # (K, R) int: token of row r at decode step k (K = 1 for prompt steps)
    valid: object  # (K, R) bool
    logprobs: tuple | None  # None, or (chosen (K, R), top ids (K, R, 20), top values (K, R, 20))
    chunk_offset: int = 0  # row of plan.chunks[0] (decode rows come first, padded)


@dataclasses.dataclass
class ChunkRow:
    """One prompt row of a step: tokens [start, start + length) of `seq`."""

    seq: Sequence
    start: int
    length: int
    # recurrent-state snapshot rows (kv/state_snapshots.py): the row resumes its cached prefix from
    # `restore`, and leaves its end states (a page boundary) in `save`; -1 = none
    restore: int = -1
    save: int = -1

    @property
    def samples(self) -> bool:
        """The row ends the sequence's tokens, so its last logits give the next token."""
        return self.start + self.length == len(self.seq.tokens)


@dataclasses.dataclass
class StepPlan:
    """What one engine step computes (the seed calls it NextIterationPlan)."""

    decode: list[Sequence] = dataclasses.field(default_factory=list)  # one row each
    chunks: list[ChunkRow] = dataclasses.field(default_factory=list)  # prompt rows, in order
    chunk_shape: tuple[int, int] | None = None  # (rows, tokens per row) of the prompt part
    num_steps: int = 1  # decode steps the device runs (decode-only plans)
    drafts: dict = dataclasses.field(default_factory=dict)  # sequence -> speculative tokens (extra rows)
    dispatched: bool = False  # `Scheduler.advance` has counted its tokens as computed and in flight

    @property
    def draft_rows(self) -> list[tuple[Sequence, int, int]]:
        """(sequence, draft index, token) of the rows after the decode rows, in row order."""
        return [(seq, i, token) for seq, tokens in self.drafts.items() for i, token in enumerate(tokens)]

    @property
    def decode_row_count(self) -> int:
        return len(self.decode) + sum(len(t) for t in self.drafts.values())

    @property
    def empty(self) -> bool:
        return not self.decode and not self.chunks

    @property
    def sequences(self) -> list[Sequence]:
        """Every sequence in the plan, once, in row order."""
        return list(dict.fromkeys([*self.decode, *(row.seq for row in self.chunks)]))


NextIterationPlan = StepPlan
