"""What every engine shares: the seed's read-only properties (from the fields each engine
sets in its constructor) and a thread-safe table of compiled programs."""

from __future__ import annotations

import time

import jax
import numpy as np

from ..tokenizer.compat import eos_token_ids, pad_token_id


class EngineBase:
    model: object
    _processor: object
    _max_concurrent_decodes: int
    _max_concurrent_prefill: int
    _max_length: int
    _batch_size: int | None
    _rng: np.random.Generator
    _compiled: dict
    _compile_lock: object  # threading.Lock
    compile_seconds: float

    def _build(self, kind: str, size):
        """Lower and compile one program (each engine's own)."""
        raise NotImplementedError

    def _program(self, kind: str, size):
        """The compiled program `kind` for `size`, compiled on first use; `compile()` asks for all of them."""
        key = (kind, size)
        with self._compile_lock:
            if key not in self._compiled:
                start = time.perf_counter()
                self._compiled[key] = self._build(kind, size)
                self.compile_seconds += time.perf_counter() - start
            return self._compiled[key]

    @staticmethod
    def _abstract(tree):
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)

    @property
    def processor(self):
        return self._processor

    @property
    def max_concurrent_decodes(self) -> int:
        return self._max_concurrent_decodes

    @property
    def max_concurrent_prefill(self) -> int:
        return self._max_concurrent_prefill

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def batch_size(self) -> int | None:
        return self._batch_size

    @property
    def samples_per_slot(self) -> int:
        return 1

    @property
    def eos_token_ids(self) -> list[int]:
        ids = eos_token_ids(self._processor) or list(self.model.config.eos_token_ids)
        return list(dict.fromkeys(ids))

    @property
    def pad_token_id(self) -> int:
        return pad_token_id(self._processor)

    @property
    def colocated_cpus(self):
        return None

    def new_seed(self) -> int:
        """A request seed drawn from the engine's generator (when the caller gives none)."""
        return int(self._rng.integers(0, 2**63 - 1))
