"""The KV page pools an EngineCore runs on: a paged pool (an HBMPageManager: pages handed out on
demand, prefix caching, recompute preemption when they run out; sized from the memory left after
the weights unless `num_pages` says otherwise) or a dense one (SlotPages: each slot owns a fixed run
of pages for max_length tokens, so admission never waits for memory and nothing is preempted)."""

from __future__ import annotations

import logging

from ..kv.memory import available_kv_bytes
from ..kv.page_manager import HBMPageManager
from ..kv.paged import pool_dtype, pool_page_bytes
from ..kv.recurrent import state_dtype, stored_row_bytes
from ..kv.slot_pages import SlotPages
from ..kv.state_snapshots import StateSnapshots
from .engine_config import EngineConfig

log = logging.getLogger(__name__)


def state_cache_bytes(model, config: EngineConfig, snapshots: int) -> int:
    """Bytes of a paged engine's recurrent states: a row per slot and the spare, `snapshots` snapshot
    rows and their spare, and a speculating engine's draft states (engine/programs.py empty_state);
    0 for attention-only models."""
    drafts = config.for_model(model.config).draft_state_rows
    rows = config.max_slots + 1 + (snapshots + 1 if snapshots else 0) + (drafts + 1 if drafts else 0)
    return rows * stored_row_bytes(model, config.state_dtype)


def snapshot_rows(model, config: EngineConfig) -> int:
    """Rows of state snapshots for a hybrid model's prefix cache (kv/state_snapshots.py): as asked,
    else up to 4 per sequence slot within a quarter of the KV memory; 0 without recurrent layers or
    without the prefix cache."""
    row = stored_row_bytes(model, config.state_dtype)
    if not row or not config.enable_prefix_caching:
        return 0
    if config.state_snapshots is not None:
        return config.state_snapshots
    budget = available_kv_bytes(model.weight_bytes, config.hbm_utilization) // 4
    return int(min(4 * config.max_slots, budget // row))


def pages_that_fit(model, config: EngineConfig, snapshots: int | None = None) -> int:
    """Pages the free memory holds (`hbm_utilization` of it, less the recurrent states and their
    snapshots of a hybrid model), at most every slot at full length (more would only feed the prefix
    cache). On a mesh each device holds its KV heads' share of a page (sharding.kv_page_shards).
    `snapshots`: the pool's snapshot rows when the caller has sized them (else `snapshot_rows`)."""
    return pool_size(model, config, snapshots)[0]


def pool_size(model, config: EngineConfig, snapshots: int | None = None) -> tuple[int, str]:
    """(pages, why): `pages_that_fit`, with the reason the start-up line prints."""
    from ..hardware.sharding import kv_page_shards

    if config.num_pages is not None:
        return config.num_pages, "as asked (--num-pages)"
    per_device = pool_page_bytes(model, config) // kv_page_shards(model)
    every_slot = config.max_slots * config.pages_per_sequence
    full = (f"for every one of the {config.max_slots} slots at its full {config.max_length} tokens "
            f"(--max-concurrent-decodes x --max-length)")
    if per_device == 0:  # no attention layer (plain Mamba-2): pages only count tokens
        return every_slot, full
    if snapshots is None:
        snapshots = snapshot_rows(model, config)
    states = state_cache_bytes(model, config, snapshots)
    budget = max(0, available_kv_bytes(model.weight_bytes, config.hbm_utilization) - states)
    if budget // per_device >= every_slot:
        return every_slot, full + ": all the defaults can use, though the memory holds more"
    return int(budget // per_device), (f"to {config.hbm_utilization:g} of the free memory (--hbm-utilization), "
                                       f"less than {full[4:]}")


def make_page_pool(model, config: EngineConfig) -> HBMPageManager:
    config = config.for_model(model.config)
    per_page = pool_page_bytes(model, config)
    rows = snapshot_rows(model, config)  # sized once: the pages are what memory holds beside them
    num_pages, why = pool_size(model, config, rows)
    log.info("paged KV cache: %d pages of %d tokens (%.1f MiB each, %s), %d tokens in all: %s", num_pages,
             config.page_size, per_page / 2**20, pool_dtype(model, config), num_pages * config.page_size, why)
    state_row = stored_row_bytes(model, config.state_dtype)
    if state_row:
        log.info("recurrent states: %.1f MiB per sequence (%s), %d slots + %d prefix-cache snapshots",
                 state_row / 2**20, state_dtype(config.state_dtype, model), config.max_slots, rows)
    from .tier_mover import make_host_tier, make_state_tier

    snapshots = StateSnapshots(rows, host=make_state_tier(model, config)) if rows else None
    pool = HBMPageManager(int(num_pages), config.page_size, config.enable_prefix_caching,
                          host=make_host_tier(model, config), snapshots=snapshots)
    pool.sized_by = why  # (the start-up line says it)
    if pool.max_tokens < config.max_length:
        raise ValueError(f"too little KV memory: {pool.num_pages} pages of {config.page_size} tokens hold "
                         f"{pool.max_tokens} tokens, less than max_length={config.max_length}; lower max_length "
                         f"or raise hbm_utilization / num_pages")
    return pool


def make_slot_pages(config: EngineConfig) -> SlotPages:
    """The dense pool: `max_slots` fixed runs of pages, `max_length` tokens each."""
    return SlotPages(config.max_slots, config.max_length, config.page_size)


def make_pool(model, config: EngineConfig, paged: bool):
    return make_page_pool(model, config) if paged else make_slot_pages(config)
