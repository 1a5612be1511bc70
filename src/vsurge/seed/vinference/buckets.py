"""One small engine per compiled (batch, prefill_length) bucket.

A bucket's engine has `batch` slots, each with a fixed run of pages for
`prefill_length + max_new_tokens` tokens, one prompt row of `prefill_length`
tokens per slot (the whole batch prefills in one step) and one decode program
(`streaming_chunks` steps per call). `choose` picks the smallest compiled
bucket that fits, else names a new power-of-two bucket, compiled on demand.
All buckets share the model's weights and run where they are (its mesh, if any).
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from typing import Callable

from ...engine.engine_config import EngineConfig
from ...engine.core import EngineCore, multiplies_in_blocks
from ...kv.slot_pages import SlotPages

PAGE_SIZE = 128


def next_power_of_two(n: int, minimum: int = 1) -> int:
    size = minimum
    while size < n:
        size *= 2
    return size


@dataclasses.dataclass
class Bucket:
    batch: int
    prefill_length: int
    engine: EngineCore
    state: object  # the engine state between runs (donated through every step); None while a run holds it

    def take_state(self):
        """The bucket's state for one run, or a fresh one while another (suspended) run holds it."""
        state, self.state = self.state, None
        return state if state is not None else self.engine.init_state()

    def give_back(self, state) -> None:
        self.state = state


class BucketEngines:
    def __init__(self, model, processor, max_new_tokens: int, streaming_chunks: int, seed: int,
                 on_compile: Callable[[float], None] | None = None, input_partition_spec=None,
                 kv_cache_dtype: str | None = None):
        self.model = model
        self.kv_cache_dtype = kv_cache_dtype
        self.input_partition_spec = input_partition_spec  # splits each step's input rows on the mesh
        self.processor = processor
        self.max_new_tokens = max_new_tokens
        self.streaming_chunks = streaming_chunks
        self.seed = seed
        self.on_compile = on_compile
        self.buckets: dict[tuple[int, int], Bucket] = {}
        self._lock = threading.Lock()

    def choose(self, batch: int, length: int, max_length: int) -> tuple[int, int]:
        """Smallest compiled bucket with room for `batch` rows of `length` tokens, else a new one."""
        fits = [k for k in self.buckets if k[0] >= batch and k[1] >= length]
        if fits:
            return min(fits, key=lambda k: (k[0] * k[1], k))
        return next_power_of_two(batch), min(next_power_of_two(length, 16), max(max_length, length))

    def config(self, batch: int, prefill_length: int) -> EngineConfig:
        total = prefill_length + self.max_new_tokens
        return EngineConfig(max_slots=batch, max_length=total, max_prompt_length=prefill_length,
                            prefill_tokens=batch * prefill_length, chunk_lengths=(prefill_length,),
                            max_prefill_rows=batch, decode_steps=self.streaming_chunks, page_size=PAGE_SIZE,
                            seed=self.seed, row_buckets=(self._rows(batch),),
                            window_buckets=(math.ceil(total / PAGE_SIZE),), prefill_first=True,
                            enable_prefix_caching=False, kv_cache_dtype=self.kv_cache_dtype)

    def _rows(self, batch: int) -> int:
        """Decode rows for `batch` prompts: one prompt runs as two rows (a one-row float dot is slow
        on XLA:CPU), except where the block kernel multiplies, whose padding rows cost a row's work."""
        return batch if multiplies_in_blocks(self.model) else max(2, batch)

    def get(self, batch: int, prefill_length: int) -> Bucket:
        key = (batch, prefill_length)
        with self._lock:
            if key not in self.buckets:
                start = time.perf_counter()
                config = self.config(batch, prefill_length)
                engine = EngineCore(self.model, self.processor, config,
                                    SlotPages(config.max_slots, config.max_length, config.page_size))
                engine.input_partition_spec = self.input_partition_spec
                engine.compile(progress=False)
                self.buckets[key] = Bucket(batch, prefill_length, engine, engine.init_state())
                if self.on_compile:
                    self.on_compile(time.perf_counter() - start)
            return self.buckets[key]
