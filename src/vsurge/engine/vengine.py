"""vEngine: the dense engine. Each of `max_concurrent_decodes` slots owns a fixed run of
pages for `max_length` tokens (SlotPages), so admission never waits for memory and
nothing is preempted; prompts are prefilled in chunks inside the shared steps."""

from __future__ import annotations

import warnings

from ..kv.slot_pages import SlotPages
from .config import EngineConfig
from .core import EngineCore
from .seed_engine import SeedEngineAPI


class vEngine(SeedEngineAPI, EngineCore):  # noqa: N801 (the seed's name)
    def __init__(self, model, processor, max_concurrent_decodes: int | None = None,
                 max_concurrent_prefill: int | None = None, prefill_lengths: list[int] | int | None = None,
                 max_prefill_length: int | None = None, max_length: int | None = None,
                 batch_size: int | None = None, seed: int = 894, config: EngineConfig | None = None):
        if batch_size is not None:
            warnings.warn("batch_size has no effect: the step's rows are max_concurrent_decodes slots",
                          stacklevel=2)
        config = config or EngineConfig.from_seed_kwargs(
            max_concurrent_decodes=max_concurrent_decodes, max_concurrent_prefill=max_concurrent_prefill,
            prefill_lengths=prefill_lengths, max_prefill_length=max_prefill_length, max_length=max_length,
            seed=seed, context=model.config.max_position_embeddings)
        super().__init__(model, processor, config, SlotPages(config.max_slots, config.max_length, config.page_size))
        self._batch_size = batch_size

    def prefill(self, graphstate, graphothers, tokens, valids, true_length, temperature=0.0, top_p=1.0, rngs=None,
                *, top_k=0, max_new_tokens: int | None = None):
        """The seed's vEngine.prefill (its argument order: no top_k before rngs): a batch of prompts
        (B, T) -> (Prefix, or a list of B when B > 1; first tokens (B,)). See `_prefill_rows`."""
        return self._prefill_rows(graphstate, graphothers, tokens, valids, true_length, temperature, top_p, top_k,
                                  rngs, max_new_tokens)
