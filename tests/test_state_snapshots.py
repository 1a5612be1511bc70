"""Recurrent-state snapshots for the prefix cache of hybrid models (kv/state_snapshots.py) and how the
page manager resumes a prompt at the latest snapshotted page boundary (pure Python, no JAX)."""

from __future__ import annotations

import pytest

from vsurge.kv.page_manager import HBMPageManager, PageTable
from vsurge.kv.state_snapshots import NO_ROW, StateSnapshots, chain_to, chained_keys
from vsurge.kv.tiers import page_key

PS = 8


def keys_of(tokens, pages):
    return [key for _, key in chained_keys(tokens, pages, PS)]


def test_rows_are_taken_then_the_least_recently_used_unpinned_one_is_evicted():
    snaps = StateSnapshots(2)
    a, b = snaps.row_to_save(1), snaps.row_to_save(2)
    assert {a, b} == {0, 1} and len(snaps) == 2
    assert snaps.row_to_save(1) == NO_ROW  # held already (and now the most recently used)
    pinned = snaps.restore(2)  # a planned restore: never evicted before its step is planned
    assert pinned == b
    assert snaps.row_to_save(3) == a and not snaps.has(1)  # 1 was the only unpinned one
    snaps.restore(3)
    assert snaps.row_to_save(4) == NO_ROW  # every row is pinned: this boundary goes unsnapshotted
    snaps.release(pinned)
    snaps.clear()  # the pinned one (3) stays
    assert not snaps.has(2) and snaps.has(3) and len(snaps) == 1
    assert snaps.saves == 3 and snaps.restores == 2


def test_bad_size():
    with pytest.raises(ValueError, match="rows must be >= 1"):
        StateSnapshots(0)


def test_chained_keys_match_the_page_managers_and_restart_when_asked_for_an_earlier_page():
    tokens = list(range(40))
    keys = keys_of(tokens, 5)
    assert keys[0] == page_key(None, tuple(range(8))) and keys[1] == page_key(keys[0], tuple(range(8, 16)))
    assert chain_to(tokens, 3, PS, (0, None)) == (3, keys[2])
    assert chain_to(tokens, 5, PS, (3, keys[2])) == (5, keys[4])  # continued
    assert chain_to(tokens, 2, PS, (5, keys[4])) == (2, keys[1])  # past it: chained again from the start


def test_a_prompt_resumes_at_the_latest_snapshotted_boundary_of_its_cached_prefix():
    snaps = StateSnapshots(4)
    pm = HBMPageManager(16, PS, snapshots=snaps)
    assert not pm.tail_hits  # no state below a page
    first = list(range(50))
    table = PageTable()
    assert pm.add_sequence(table, first) == 0
    assert pm.reserve(table, len(first))
    pm.commit(table, first, len(first))  # 6 full pages registered
    keys = keys_of(first, 6)
    snaps.row_to_save(keys[1])  # states kept after pages 2 and 4 (rows ending there)
    snaps.row_to_save(keys[3])
    pm.free_sequence(table)

    second = first[:45] + [900, 901, 902]  # shares 5 full pages and 5 tokens more
    assert pm.cached_tokens(second) == 32
    other = PageTable()
    assert pm.add_sequence(other, second) == 32  # page 5 is cached but has no snapshot: computed again
    assert len(other.pages) == 4 and other.last_key == keys[3] and other.restore == snaps._by_key[keys[3]]
    assert snaps.restores == 1
    pm.check()
    pm.free_sequence(other)  # freed before its first row was planned: the snapshot is unpinned
    assert other.restore is None and not snaps._pins
    pm.check()


def test_two_tokens_stay_to_compute_and_no_snapshot_means_no_hit():
    snaps = StateSnapshots(4)
    pm = HBMPageManager(16, PS, snapshots=snaps)
    tokens = list(range(17))  # two full pages and one token
    table = PageTable()
    pm.add_sequence(table, tokens)
    pm.reserve(table, 17)
    pm.commit(table, tokens, 17)
    pm.free_sequence(table)
    assert pm.add_sequence(PageTable(), tokens) == 0  # pages cached, no snapshot: nothing resumes
    keys = keys_of(tokens, 2)
    snaps.row_to_save(keys[0])
    snaps.row_to_save(keys[1])
    again = PageTable()
    assert pm.add_sequence(again, tokens) == 8  # page 2 would leave one token, a decode row: not taken
    longer = PageTable()
    assert pm.add_sequence(longer, tokens + [5]) == 16
    pm.free_sequence(longer)
    pm.reset_prefix_cache()
    assert snaps.has(keys[0])  # pinned by `again`, whose first row is not planned yet
    assert not snaps.has(keys[1])


def test_without_the_prefix_cache_no_snapshots_are_kept():
    pm = HBMPageManager(4, PS, enable_prefix_caching=False, snapshots=StateSnapshots(2))
    assert pm.snapshots is None and pm.add_sequence(PageTable(), list(range(30))) == 0


class _Hybrid:
    architecture, recurrent_layers = "qwen3_next", (0, 1, 2)


def test_a_hybrid_model_with_the_prefix_cache_prefills_rows_of_a_page():
    """Every full page of its prompts then ends a row, where the states are snapshotted; the step
    holds as many tokens as an attention-only model's."""
    from vsurge import EngineConfig

    base = EngineConfig(max_slots=4, page_size=128, prefill_tokens=512, speculative_tokens=2)
    assert base.chunk_shapes == [(4, 32), (16, 32), (1, 512)]
    hybrid = base.for_model(_Hybrid)
    assert hybrid.enable_prefix_caching and hybrid.speculative_tokens == 0 and hybrid.recurrent_state
    assert hybrid.chunk_shapes == [(4, 32), (16, 32), (4, 128)]
    off = base.replace(state_snapshots=0).for_model(_Hybrid)
    assert not off.enable_prefix_caching and off.chunk_shapes == base.chunk_shapes
    with pytest.raises(ValueError, match="state_snapshots must be >= 0"):
        EngineConfig(state_snapshots=-1)
