"""SampleState: the host snapshot `vInference.generate` yields (the seed's field names)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np


@dataclasses.dataclass
class SampleState:
    """What `vInference.generate` yields every `streaming_chunks` tokens (host copies).

    The seed's layout: `sequences[b]` is row b's prompt, left-padded (pad_token_id) to end at
    `padded_length`, then its generated tokens, then padding; so `sequences[:, padded_length:]`
    are the generated tokens and `row_tokens(b)` row b's without the padding.
    """

    sequences: np.ndarray  # (B, padded_length + max_new_tokens) i32
    current_length: np.ndarray  # (B,) prompt length + generated tokens
    running_token: np.ndarray  # (B, 1) i32
    is_sequence_finished: np.ndarray  # (B,) bool
    generated_tokens: int  # tokens generated so far by the longest row
    tokens_per_second: float  # decode speed over the whole batch so far
    padded_length: int  # the prefill bucket the prompts were padded to
    generated_tokens_per_row: np.ndarray  # (B,) i32
    prompt_lengths: np.ndarray  # (B,) i32
    prng_key: Any = None  # (B, 2) uint32 per-row key data
    cache: Any = None  # unused: a bucket engine keeps its KV pages (kept for the seed's field list)
    run: Any = dataclasses.field(default=None, repr=False)  # the steps.BatchRun execute_* advance

    def row_tokens(self, row: int) -> list[int]:
        start = self.padded_length
        return self.sequences[row, start: start + self.generated_tokens_per_row[row]].tolist()
