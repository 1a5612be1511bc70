"""Recurrent-state snapshots for the prefix cache of hybrid models (kv/state_snapshots.py) and how the
page manager resumes a prompt at the latest snapshotted page boundary (pure Python, no JAX)."""

from __future__ import annotations

import numpy as np
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
    assert base.chunk_shapes == [(1, 32), (4, 32), (16, 32), (1, 512)]
    hybrid = base.for_model(_Hybrid)
    assert hybrid.enable_prefix_caching and hybrid.recurrent_state
    assert hybrid.speculative_tokens == 2 and hybrid.draft_state_rows == hybrid.speculative_rows
    assert hybrid.chunk_shapes == [(1, 32), (4, 32), (16, 32), (4, 128)]
    off = base.replace(state_snapshots=0).for_model(_Hybrid)
    assert not off.enable_prefix_caching and off.chunk_shapes == base.chunk_shapes
    with pytest.raises(ValueError, match="state_snapshots must be >= 0"):
        EngineConfig(state_snapshots=-1)


class _Row:
    """A snapshot row's states copied off the device (what engine/tier_mover.py StateRow gives the tiers)."""

    def __init__(self, value):
        self.leaves = [np.full((2, 3), value, np.float32), np.full((4,), value, np.float32)]

    def arrays(self):
        return self.leaves, []


def test_evicted_snapshots_go_to_the_host_tier_and_come_back_into_a_row():
    from vsurge.kv.tiers import HostTier

    snaps = StateSnapshots(1, host=HostTier(4))
    row = snaps.row_to_save(1)
    assert not snaps.take_saves() and not snaps.has_moves  # a free row: nothing to copy
    assert snaps.row_to_save(2) == row  # evicts 1: its states are copied out before the step writes 2
    [(saved_row, entry)] = snaps.take_saves()
    assert saved_row == row and entry.key == 1 and snaps.to_host == 1
    entry.payload = _Row(1.0)
    assert snaps.holds(1) and not snaps.has(1) and snaps.holds(2) and not snaps.holds(3)
    back = snaps.restore(1)  # evicts 2 (saved too), queues 1's states into the row, pinned
    assert back == row and snaps.has(1) and snaps.from_tiers == 1
    [(load_row, found)] = snaps.take_loads()
    assert load_row == row and found.payload.leaves[0][0, 0] == 1.0
    assert [e.key for _, e in snaps.take_saves()] == [2]
    assert snaps.row_to_save(3) == NO_ROW  # the one row is pinned until its restore is planned
    snaps.release(back)
    assert snaps.restore(4) is None  # in no tier


def test_a_restore_evicted_before_its_load_ran_is_not_saved_back():
    from vsurge.kv.tiers import HostTier

    snaps = StateSnapshots(1, host=HostTier(4))
    snaps.row_to_save(1)
    snaps.row_to_save(2)
    snaps.take_saves()[0][1].payload = _Row(1.0)
    row = snaps.restore(1)  # queued load into the row (2's states go to the host)
    snaps.release(row)
    snaps.take_saves()
    snaps.row_to_save(3)  # evicts 1 before its load ran: the host tier still has it, nothing to copy
    assert not snaps.take_loads() and not snaps.take_saves()


def test_written_snapshots_are_persisted_once_and_read_back_after_a_restart(tmp_path):
    from vsurge.kv.disk_tier import DiskTier
    from vsurge.kv.tiers import HostTier

    spec = [((2, 3), "float32"), ((4,), "float32")]
    snaps = StateSnapshots(2, host=HostTier(0, DiskTier(tmp_path, "states-a", 1 << 20, spec)))
    row = snaps.row_to_save(7)
    snaps.written(row)
    [(persist_row, entry)] = snaps.take_persists()
    assert persist_row == row and entry.key == 7
    snaps.host.disk.put(entry, _Row(3.0))
    snaps.written(row)  # on disk (or queued) already
    assert not snaps.take_persists()
    snaps.host.disk.flush()

    again = StateSnapshots(2, host=HostTier(0, DiskTier(tmp_path, "states-a", 1 << 20, spec)))  # a restart
    pm = HBMPageManager(16, PS, snapshots=again)
    assert again.holds(7) and not again.has(7)
    row = again.restore(7)
    [(load_row, found)] = again.take_loads()
    leaves = [*found.payload.arrays()[0], *found.payload.arrays()[1]]  # (a page file's two halves: k, v)
    assert load_row == row and np.array_equal(leaves[0], np.full((2, 3), 3.0))
    assert np.array_equal(leaves[1], np.full(4, 3.0))
    assert pm.has_moves is False  # (taken)
    other = StateSnapshots(2, host=HostTier(0, DiskTier(tmp_path, "states-b", 1 << 20, spec)))
    assert other.restore(7) is None  # another model's snapshots are never read


def test_a_prompt_resumes_from_a_snapshot_in_a_lower_tier():
    """The page manager resumes at the latest boundary whose states are in any tier: one in the host
    tier takes a device row (evicting another snapshot to the host) and queues its copy back."""
    from vsurge.kv.tiers import HostTier

    snaps = StateSnapshots(1, host=HostTier(4))
    pm = HBMPageManager(16, PS, snapshots=snaps)
    tokens = list(range(40))
    table = PageTable()
    pm.add_sequence(table, tokens)
    pm.reserve(table, 40)
    pm.commit(table, tokens, 40)
    keys = keys_of(tokens, 4)
    snaps.row_to_save(keys[1])
    snaps.row_to_save(keys[2])  # keys[1]'s states go to the host tier
    snaps.take_saves()[0][1].payload = _Row(0.0)
    pm.free_sequence(table)
    assert pm.cached_tokens(tokens[:20] + [900, 901]) == 16
    resumed = PageTable()
    assert pm.add_sequence(resumed, tokens[:20] + [900, 901]) == 16
    assert resumed.restore == 0 and snaps.has(keys[1]) and not snaps.has(keys[2])
    assert pm.has_moves and [row for row, _ in snaps.take_loads()] == [0]
    assert [entry.key for _, entry in snaps.take_saves()] == [keys[2]]
    pm.free_sequence(resumed)
    pm.check()
