"""Compiled executables per (batch, prefill_length) bucket.

Inputs are padded to a bucket so a handful of shapes serve every request.
`choose` picks the smallest compiled bucket that fits and otherwise names a
new power-of-two bucket, compiled on demand.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from functools import partial
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ..ops.sampling import SamplingArrays
from . import steps

EOS_WIDTH = 32  # most end-of-sequence ids (eos + stop_token_ids) one row may have


def next_power_of_two(n: int, minimum: int = 1) -> int:
    size = minimum
    while size < n:
        size *= 2
    return size


@dataclasses.dataclass
class Bucket:
    batch: int
    prefill_length: int
    prefill: Callable  # compiled: (graphstate, graphother, tokens, lengths, sampling, bias, eos, max_new) -> state
    decode: Callable  # compiled: (graphstate, graphother, state) -> state (state donated)


class BucketCompiler:
    def __init__(self, graphdef, graphstate, graphother, vocab_size: int, max_new_tokens: int,
                 streaming_chunks: int, on_compile: Callable[[float], None] | None = None):
        self.graphdef = graphdef
        self.abstract_state = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), graphstate)
        self.abstract_other = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), graphother)
        self.vocab_size = vocab_size
        self.max_new_tokens = max_new_tokens
        self.streaming_chunks = streaming_chunks
        self.on_compile = on_compile
        self.buckets: dict[tuple[int, int], Bucket] = {}
        self._lock = threading.Lock()

    def choose(self, batch: int, length: int, max_length: int) -> tuple[int, int]:
        """Smallest compiled bucket with room for `batch` rows of `length` tokens, else a new one."""
        fits = [k for k in self.buckets if k[0] >= batch and k[1] >= length]
        if fits:
            return min(fits, key=lambda k: (k[0] * k[1], k))
        return next_power_of_two(batch), min(next_power_of_two(length, 16), max(max_length, length))

    def input_specs(self, batch: int, prefill_length: int):
        s = jax.ShapeDtypeStruct
        sampling = jax.tree.map(lambda x: s(x.shape, x.dtype), SamplingArrays.neutral(batch))
        return (s((batch, prefill_length), jnp.int32), s((batch,), jnp.int32), sampling,
                s((batch, self.vocab_size), jnp.float32), s((batch, EOS_WIDTH), jnp.int32), s((batch,), jnp.int32))

    def get(self, batch: int, prefill_length: int) -> Bucket:
        key = (batch, prefill_length)
        with self._lock:
            if key not in self.buckets:
                self.buckets[key] = self._compile(batch, prefill_length)
            return self.buckets[key]

    def _compile(self, batch: int, prefill_length: int) -> Bucket:
        start = time.perf_counter()
        prefill_fn = jax.jit(partial(steps.prefill, self.graphdef, cache_length=prefill_length + self.max_new_tokens,
                                     max_new_cap=self.max_new_tokens))
        args = (self.abstract_state, self.abstract_other, *self.input_specs(batch, prefill_length))
        prefill_exe = prefill_fn.lower(*args).compile()
        state_spec = jax.eval_shape(prefill_fn, *args)
        decode_fn = jax.jit(partial(steps.decode_chunk, self.graphdef, num_steps=self.streaming_chunks),
                            donate_argnums=(2,))
        decode_exe = decode_fn.lower(self.abstract_state, self.abstract_other, state_spec).compile()
        if self.on_compile:
            self.on_compile(time.perf_counter() - start)
        return Bucket(batch, prefill_length, prefill_exe, decode_exe)


def pad_rows(values: list[np.ndarray], batch: int, fill) -> np.ndarray:
    """Stack per-row arrays and pad to `batch` rows with `fill`."""
    arr = np.stack(values)
    if len(values) < batch:
        pad = np.full((batch - len(values), *arr.shape[1:]), fill, arr.dtype)
        arr = np.concatenate([arr, pad])
    return arr
