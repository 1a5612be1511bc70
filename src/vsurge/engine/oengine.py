"""oEngine: the paged engine. Pages are handed out on demand by an HBMPageManager
(prefix caching, recompute preemption when they run out); the pool is sized from
the memory left after the weights unless `num_pages` says otherwise."""

from __future__ import annotations

import logging
import warnings

from ..kv.memory import available_kv_bytes
from ..kv.page_manager import HBMPageManager
from ..kv.paged import PagedAttentionCache, pool_dtype, pool_page_bytes
from .config import EngineConfig
from .core import EngineCore
from .seed_engine import SeedEngineAPI

log = logging.getLogger(__name__)


def pages_that_fit(model, config: EngineConfig) -> int:
    """Pages the free memory holds (`hbm_utilization` of it), at most every slot at full length
    (more would only feed the prefix cache). On a mesh each device holds its KV heads' share of
    a page (sharding.kv_page_shards)."""
    from ..sharding import kv_page_shards

    per_device = pool_page_bytes(model, config) // kv_page_shards(model)
    budget = available_kv_bytes(model.weight_bytes, config.hbm_utilization)
    return int(min(budget // per_device, config.max_slots * config.pages_per_sequence))


def make_page_pool(model, config: EngineConfig) -> HBMPageManager:
    per_page = pool_page_bytes(model, config)
    num_pages = config.num_pages if config.num_pages is not None else pages_that_fit(model, config)
    log.info("paged KV cache: %d pages of %d tokens (%.1f MiB each, %s), %d tokens in all", num_pages,
             config.page_size, per_page / 2**20, pool_dtype(model, config),
             num_pages * config.page_size)
    from .tiers import make_host_tier

    pool = HBMPageManager(int(num_pages), config.page_size, config.enable_prefix_caching,
                          host=make_host_tier(model, config))
    if pool.max_tokens < config.max_length:
        raise ValueError(f"too little KV memory: {pool.num_pages} pages of {config.page_size} tokens hold "
                         f"{pool.max_tokens} tokens, less than max_length={config.max_length}; lower max_length "
                         f"or raise hbm_utilization / num_pages")
    return pool


class oEngine(SeedEngineAPI, EngineCore):  # noqa: N801 (the seed's name)
    def __init__(self, model, processor, storage: PagedAttentionCache | None = None,
                 manager: HBMPageManager | None = None, max_concurrent_decodes: int | None = None,
                 max_concurrent_prefill: int | None = None, prefill_lengths: list[int] | int | None = None,
                 max_prefill_length: int | None = None, max_length: int | None = None,
                 batch_size: int | None = None, seed: int = 894, page_size: int = 128,
                 hbm_utilization: float = 0.6, num_pages: int | None = None, enable_prefix_caching: bool = True,
                 config: EngineConfig | None = None):
        if batch_size is not None:
            warnings.warn("batch_size has no effect: the step's rows are max_concurrent_decodes slots",
                          stacklevel=2)
        config = config or EngineConfig.from_seed_kwargs(
            max_concurrent_decodes=max_concurrent_decodes, max_concurrent_prefill=max_concurrent_prefill,
            prefill_lengths=prefill_lengths, max_prefill_length=max_prefill_length, max_length=max_length,
            seed=seed, context=model.config.max_position_embeddings, page_size=manager.page_size if manager
            else page_size, hbm_utilization=hbm_utilization, num_pages=manager.num_pages if manager else num_pages,
            enable_prefix_caching=enable_prefix_caching)
        super().__init__(model, processor, config, manager or make_page_pool(model, config))
        if storage is not None and storage.num_pages != self.pool.num_pages:
            raise ValueError(f"storage has {storage.num_pages} pages but the manager has {self.pool.num_pages}")
        self._storage = storage  # used as the first state's pages, then owned by the state
        self._batch_size = batch_size

    def prefill(self, graphstate, graphothers, tokens, valids, true_length, temperature=0.0, top_p=1.0, top_k=0,
                rngs=None, *, max_new_tokens: int | None = None):
        """The seed's oEngine.prefill (top_k, then rngs): a batch of prompts (B, T) -> (Prefix, or a
        list of B when B > 1; first tokens (B,)). See `_prefill_rows`."""
        return self._prefill_rows(graphstate, graphothers, tokens, valids, true_length, temperature, top_p, top_k,
                                  rngs, max_new_tokens)

    @property
    def manager(self) -> HBMPageManager:
        return self.pool

    @property
    def page_size(self) -> int:
        return self.pool.page_size

    def init_state(self):
        state = super().init_state()
        if self._storage is not None:
            state = type(state)(self._storage, state.slots)
            self._storage = None
        return state
