"""Generation state: the device pytree the compiled steps carry, and the host snapshot users see."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from ..ops.sampling import SamplingArrays


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class DecodeState:
    """Everything one batch needs between decode steps (all device arrays)."""

    sequences: jax.Array  # (B, max_new) i32 generated tokens, row-aligned at 0
    generated: jax.Array  # (B,) i32 tokens generated so far
    running_token: jax.Array  # (B,) i32 last generated token (next step's input)
    position: jax.Array  # (B,) i32 position of `running_token`
    finished: jax.Array  # (B,) bool
    max_new: jax.Array  # (B,) i32 per-row token budget
    eos: jax.Array  # (B, E) i32 ids that finish a row (-1 = unused)
    counts: jax.Array  # (B, V) i32 how often each token was generated (penalties)
    prompt_mask: jax.Array  # (B, V) bool tokens present in the prompt (repetition penalty)
    bias: jax.Array  # (B, V) f32 logit bias
    sampling: SamplingArrays
    cache: Any  # DenseKVCache (L, B, KVH, S, hd)


@dataclasses.dataclass
class SampleState:
    """What `vInference.generate` yields every `streaming_chunks` tokens (host copies, seed field names).

    sequences[b, :generated_tokens_per_row[b]] are row b's generated tokens.
    """

    sequences: np.ndarray  # (B, max_new) i32
    current_length: np.ndarray  # (B,) prompt length + generated tokens
    running_token: np.ndarray  # (B, 1) i32
    is_sequence_finished: np.ndarray  # (B,) bool
    generated_tokens: int  # tokens generated so far by the longest row
    tokens_per_second: float  # decode speed over the whole batch so far
    padded_length: int  # the prefill bucket the prompts were padded to
    generated_tokens_per_row: np.ndarray  # (B,) i32
    prompt_lengths: np.ndarray  # (B,) i32
    prng_key: Any = None  # (B, 2) uint32 per-row key data
    cache: Any = None  # the device KV cache, for callers that continue from it

    def row_tokens(self, row: int) -> list[int]:
        return self.sequences[row, : self.generated_tokens_per_row[row]].tolist()
