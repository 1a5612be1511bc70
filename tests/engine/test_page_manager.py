"""HBMPageManager: free pool, page tables, prefix cache with LRU eviction (pure Python, no JAX)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from collections import defaultdict

from vsurge.kv.page_manager import HBMPageManager, PageTable
from vsurge.kv.slot_pages import SlotPages
from vsurge.kv.tiers import HostTier, TierEntry, page_key

T: dict = defaultdict(PageTable)  # name -> page table, as a sequence would carry it


def _snapshot(pm: HBMPageManager, tables: dict):
    return (
        pm.num_free_pages,
        pm.num_used_pages,
        pm.num_cached_pages,
        {s: list(t.pages) for s, t in tables.items()},
    )


def _run(pm: HBMPageManager, table: PageTable, tokens) -> int:
    """Add, reserve and compute a whole prompt; returns the cached token count."""
    cached = pm.add_sequence(table, tokens)
    assert pm.reserve(table, len(tokens))
    pm.commit(table, tokens, len(tokens))
    pm.check()
    return cached


@pytest.fixture(autouse=True)
def fresh_tables():
    T.clear()


def test_sizes():
    pm = HBMPageManager(8, 4)
    assert (pm.num_pages, pm.page_size, pm.max_tokens) == (8, 4, 32)
    assert (pm.num_free_pages, pm.num_used_pages, pm.num_cached_pages, pm.usage) == (8, 0, 0, 0.0)


def test_shared_prefix_reuses_pages():
    pm = HBMPageManager(8, 4)
    prompt = list(range(10))  # 2.5 pages
    assert _run(pm, T["a"], prompt) == 0
    assert len(T["a"].pages) == 3 and pm.num_used_pages == 3
    assert pm.num_cached_pages == 2  # the half page is not registered

    assert pm.add_sequence(T["b"], prompt) == 8
    assert T["b"].pages == T["a"].pages[:2]
    assert (pm.prefix_queries, pm.prefix_hits) == (20, 8)
    assert pm.pages_needed(T["b"], 10) == 1 and pm.can_reserve(T["b"], 10)
    assert pm.reserve(T["b"], 10)
    assert T["b"].pages[2] != T["a"].pages[2]
    assert pm.num_used_pages == 4 and pm.usage == 0.5
    pm.check()

    pm.free_sequence(T["a"])
    assert pm.num_used_pages == 3  # the shared pages are still held by b
    pm.free_sequence(T["b"])
    pm.free_sequence(T["b"])  # idempotent
    pm.check()
    assert pm.num_free_pages == 8 and pm.num_cached_pages == 3  # a's half page is kept as a tail (b's, the same, is not)


def test_exact_page_prompt_leaves_one_token_to_compute():
    pm = HBMPageManager(8, 4)
    prompt = list(range(8))
    _run(pm, T["a"], prompt)
    assert pm.num_cached_pages == 2
    pm.tail_hits = False  # (below a page: test_tails)
    assert pm.add_sequence(T["b"], prompt) == 4
    assert T["b"].pages == T["a"].pages[:1]
    assert pm.add_sequence(T["c"], prompt + [99]) == 8
    assert pm.add_sequence(T["d"], prompt[:4]) == 0
    pm.check()


def test_tails():
    """Below a page: a freed sequence's partly computed page is registered under its tokens, and a
    prompt sharing a prefix with it (or with a full page that diverges) starts from a copy."""
    pm = HBMPageManager(8, 4)
    prompt = list(range(10))  # 2.5 pages
    _run(pm, T["a"], prompt)
    tail = T["a"].pages[2]
    pm.free_sequence(T["a"])
    assert pm.num_cached_pages == 3
    # the same prompt again: 2 pages and 1 token of the tail (its last token is computed again)
    assert pm.add_sequence(T["b"], prompt) == 9
    assert T["b"].pages[:2] == [0, 1] and len(T["b"].pages) == 3 and T["b"].pages[2] != tail
    assert pm.take_copies() == [(tail, T["b"].pages[2])] and pm.last_hits["device"] == 9
    pm.check()
    # the next turn: everything computed before, then new tokens
    assert pm.add_sequence(T["c"], prompt + [50, 51, 52]) == 10
    # diverging inside a full page: its shared tokens are copied too
    assert pm.add_sequence(T["d"], [0, 1, 2, 3, 4, 5, 60, 61, 62]) == 6
    copies = dict((dst, src) for src, dst in pm.take_copies())
    assert copies == {T["c"].pages[2]: tail, T["d"].pages[1]: 1}
    assert pm.cached_tokens(prompt + [70]) == 10 and pm.cached_tokens([0, 1, 2, 3, 4, 99]) == 5
    pm.check()
    # a table freed before its copy ran: the copy is dropped with it
    pm.free_sequence(T["b"]), pm.free_sequence(T["c"]), pm.free_sequence(T["d"])
    assert pm.add_sequence(T["e"], prompt) == 9
    pm.free_sequence(T["e"])
    assert pm.take_copies() == []
    pm.check()
    # too few shared tokens to copy: computed again
    big = HBMPageManager(8, 16)
    assert big.min_tail == 2
    _run(big, T["f"], list(range(20)))
    big.free_sequence(T["f"])
    assert big.add_sequence(T["g"], list(range(19)) + [99]) == 19 and big.take_copies()
    assert big.add_sequence(T["h"], list(range(16)) + [16, 99, 98]) == 16  # 1 shared token: no copy
    assert big.take_copies() == []
    off = HBMPageManager(8, 4)
    off.tail_hits = False
    _run(off, T["i"], prompt)
    off.free_sequence(T["i"])
    assert off.num_cached_pages == 2 and off.add_sequence(T["j"], prompt) == 8


def test_commit_is_incremental():
    pm = HBMPageManager(8, 4)
    tokens = list(range(12))
    pm.add_sequence(T["a"], tokens)
    pm.reserve(T["a"], 12)
    for n in range(13):
        pm.commit(T["a"], tokens, n)
        assert pm.num_cached_pages == n // 4
    pm.commit(T["a"], tokens, 2)  # going back changes nothing
    assert pm.num_cached_pages == 3
    pm.check()


def test_reserve_out_of_pages_changes_nothing():
    pm = HBMPageManager(4, 4)
    pm.add_sequence(T["a"], [1] * 9)
    assert pm.reserve(T["a"], 9)  # 3 pages
    pm.add_sequence(T["b"], [2] * 9)
    before = _snapshot(pm, {k: T[k] for k in "ab"})
    assert not pm.can_reserve(T["b"], 9)
    assert not pm.reserve(T["b"], 9)  # needs 3, 1 free: nothing is taken
    assert _snapshot(pm, {k: T[k] for k in "ab"}) == before
    assert pm.reserve(T["b"], 4)
    assert pm.reserve(T["a"], 8)  # never shrinks
    assert len(T["a"].pages) == 3
    pm.check()


def test_prefetched_pages_are_cached_free_pages_whose_first_hits_count_as_disk():
    """Pages read from the disk tier at start-up take truly free pages only (nothing is evicted, the
    pool's room is unchanged), stay evictable, and wait for their load; a prompt hitting them counts
    disk hits once, device hits after."""
    pm = HBMPageManager(4, 4)
    first = TierEntry(page_key(None, (1, 2, 3, 4)), None, (1, 2, 3, 4))
    second = TierEntry(page_key(first.key, (5, 6, 7, 8)), first.key, (5, 6, 7, 8))
    tail = TierEntry(0, second.key, (9, 10))  # a tail: registered under the tokens it holds
    again = TierEntry(first.key, None, (1, 2, 3, 4))  # already cached: skipped
    assert pm.prefetch([first, second, tail, again]) == [first, second, tail]
    assert (pm.num_free_pages, pm.num_cached_pages, pm.tier_counts()["prefetched"]) == (4, 3, 3)
    assert [page for page, _ in pm.take_loads()] == [0, 1, 2]
    pm.check()
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    assert pm.add_sequence(T["a"], prompt) == 10  # two pages and the tail's two tokens
    assert pm.last_hits == {"device": 0, "host": 0, "disk": 10}
    pm.free_sequence(T["a"])
    assert pm.add_sequence(T["b"], prompt) == 10 and pm.last_hits["device"] == 10
    pm.free_sequence(T["b"])
    pm.take_copies()
    pm.check()
    # a full pool takes nothing; a page prefetched but evicted before its load ran never loads
    pm.add_sequence(T["c"], [7] * 16)
    assert pm.reserve(T["c"], 16) and pm.prefetch([TierEntry(1, None, (7, 7, 7, 7))]) == []
    pm.free_sequence(T["c"])
    small = HBMPageManager(2, 4)
    assert small.prefetch([first]) == [first] and small.add_sequence(T["d"], [9] * 8) == 0
    assert small.reserve(T["d"], 8)  # evicts it: its load is dropped
    assert small.take_loads() == [] and small.num_cached_pages == 0
    small.check()
    off = HBMPageManager(4, 4)
    off.tail_hits = False
    assert off.prefetch([tail]) == []


def test_lru_eviction():
    pm = HBMPageManager(4, 4)
    pm.tail_hits = False  # whole pages only (tails: test_tails)
    _run(pm, T["a"], [1] * 5)  # registers one page
    pm.free_sequence(T["a"])
    _run(pm, T["c"], [2] * 5)
    pm.free_sequence(T["c"])  # a's page was freed first, so it is evicted first
    assert (pm.num_free_pages, pm.num_cached_pages) == (4, 2)

    pm.add_sequence(T["d"], [3] * 12)
    assert pm.reserve(T["d"], 12)  # 2 truly free pages, then 1 eviction
    pm.check()
    assert pm.num_cached_pages == 1 and pm.num_free_pages == 1
    assert pm.add_sequence(T["e"], [1] * 5) == 0  # evicted: no longer a hit
    assert pm.add_sequence(T["f"], [2] * 5) == 4  # still cached
    pm.check()
    assert pm.num_free_pages == 0  # f took the evictable page back

    pm.free_sequence(T["d"])
    pm.add_sequence(T["g"], [4] * 16)
    assert pm.reserve(T["g"], 12)
    assert pm.add_sequence(T["h"], [2] * 5) == 4  # f's reference kept it from eviction
    assert not pm.reserve(T["g"], 16)
    pm.check()


def test_referenced_cached_page_is_never_evicted():
    pm = HBMPageManager(3, 4)
    _run(pm, T["a"], [1] * 5)
    pm.free_sequence(T["a"])
    assert pm.add_sequence(T["b"], [1] * 5) == 4  # page now referenced by b
    pm.add_sequence(T["c"], [2] * 12)
    assert not pm.reserve(T["c"], 12)  # 2 free pages, the cached one is pinned
    assert pm.reserve(T["c"], 8)
    assert pm.num_cached_pages == 1 and T["b"].pages[0] not in T["c"].pages
    pm.check()


def test_reset_prefix_cache():
    pm = HBMPageManager(4, 4)
    pm.tail_hits = False  # whole pages only (tails: test_tails)
    _run(pm, T["a"], [1] * 9)
    _run(pm, T["b"], [2] * 4)
    pm.free_sequence(T["a"])
    assert pm.num_cached_pages == 3
    pm.reset_prefix_cache()
    pm.check()
    assert pm.num_cached_pages == 1  # b's page is referenced, so it stays
    assert pm.add_sequence(T["c"], [1] * 9) == 0
    assert pm.add_sequence(T["d"], [2] * 5) == 4


def test_prefix_caching_disabled():
    pm = HBMPageManager(4, 4, enable_prefix_caching=False)
    prompt = list(range(10))
    assert _run(pm, T["a"], prompt) == 0
    assert pm.num_cached_pages == 0
    assert pm.add_sequence(T["b"], prompt) == 0 and T["b"].pages == []
    assert pm.prefix_hits == 0
    pm.free_sequence(T["a"])
    pm.check()
    assert pm.num_free_pages == 4 and pm.num_cached_pages == 0


def test_bad_input():
    with pytest.raises(ValueError, match="num_pages"):
        HBMPageManager(0, 4)
    with pytest.raises(ValueError, match="page_size"):
        HBMPageManager(4, 0)
    pm = HBMPageManager(4, 4)
    pm.add_sequence(T["a"], [1, 2])
    with pytest.raises(ValueError, match="already registered"):
        pm.add_sequence(T["a"], [1, 2])
    assert T["a"].registered and not T["z"].registered
    pm.free_sequence(T["z"])  # unregistered: no-op
    pm.check()


def test_collision_is_not_a_hit():
    pm = HBMPageManager(4, 4)
    _run(pm, T["a"], [1] * 5)
    # Forge the key of another prefix onto a's page: the token comparison must reject it.
    entry = pm._entries[T["a"].pages[0]]
    pm._key_to_page[page_key(None, (2, 2, 2, 2))] = pm._key_to_page.pop(entry.key)
    assert pm.add_sequence(T["b"], [2] * 5) == 0


def test_slot_pages_give_each_slot_its_own_run():
    pool = SlotPages(num_slots=3, max_length=10, page_size=4)
    assert (pool.num_pages, pool.max_tokens, pool.num_free_pages) == (9, 36, 9)
    assert pool.add_sequence(T["a"], [1, 2, 3], slot=1) == 0 and T["a"].pages == [3, 4, 5]
    assert pool.reserve(T["a"], 10) and not pool.reserve(T["a"], 13)
    with pytest.raises(ValueError, match="slot 1 is not free"):
        pool.add_sequence(T["b"], [1], slot=1)
    assert pool.usage == 1 / 3
    pool.free_sequence(T["a"])
    assert pool.num_free_pages == 9 and T["a"].pages == []
    assert pool.add_sequence(T["b"], [1], slot=1) == 0


# --- property test -----------------------------------------------------------------------

PAGES, PS = 6, 4
MAX_LIVE = 3  # more live sequences would mostly just exhaust the pool
tokens_st = st.lists(st.integers(1, 2), min_size=1, max_size=10)


class PageManagerMachine(RuleBasedStateMachine):
    """Random traffic on a tiny pool; a shadow of page contents checks every cache hit."""

    def __init__(self):
        super().__init__()
        self.pm = self.make_manager()
        self.content = [[None] * PS for _ in range(PAGES)]  # token "written" to each slot
        self.host_content: dict[int, list] = {}  # id(tier entry) -> the page's tokens copied to the host
        self.seqs: dict[int, dict] = {}  # id -> {"tokens", "computed"}
        self.tables: dict[int, PageTable] = {}
        self.history: list[list[int]] = []  # every token list seen, to fork prefixes from
        self.next_id = 0

    def make_manager(self):
        return HBMPageManager(PAGES, PS)

    def _sync(self):
        """Play the engine's TierMover: every queued copy off the device, then every copy back."""
        for page, entry in self.pm.take_saves() + self.pm.take_persists():
            self.host_content[id(entry)] = list(self.content[page])
        copies = self.pm.take_copies()  # tails copied on write: all gathered, then all written
        values = [list(self.content[src]) for src, _ in copies]
        for (_, dst), value in zip(copies, values):
            self.content[dst] = value
        for page, entry in self.pm.take_loads():
            self.content[page] = list(self.host_content[id(entry)])

    def _pick(self, data):
        return data.draw(st.sampled_from(sorted(self.seqs)))

    @precondition(lambda self: len(self.seqs) < MAX_LIVE)
    @rule(data=st.data(), fresh=tokens_st, suffix=st.lists(st.integers(1, 2), max_size=5))
    def add(self, data, fresh, suffix):
        """A new prompt: mostly a prefix of a recent one (live or freed) plus a suffix, to hit the cache."""
        tokens = fresh
        if self.history and data.draw(st.integers(0, 3)):
            base = data.draw(st.sampled_from(self.history[-4:]))
            cut = data.draw(st.one_of(st.just(len(base)), st.integers(0, len(base))))
            tokens = base[:cut] + suffix or fresh
        sid, self.next_id = self.next_id, self.next_id + 1
        hits = self.pm.prefix_hits
        self.tables[sid] = PageTable()
        cached = self.pm.add_sequence(self.tables[sid], tokens)
        self._sync()
        table = list(self.tables[sid].pages)
        # whole pages, then maybe part of a copied tail page
        assert cached <= len(tokens) - 1 and len(table) == -(-cached // PS)
        assert self.pm.prefix_hits == hits + cached
        for j in range(cached):  # the hit pages really hold this prompt's KV
            assert self.content[table[j // PS]][j % PS] == tokens[j], (j, table, tokens)
        self.seqs[sid] = {"tokens": list(tokens), "computed": cached}
        self.history.append(self.seqs[sid]["tokens"])

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), grow=st.integers(0, 10))
    def reserve(self, data, grow):
        sid = self._pick(data)
        seq = self.seqs[sid]
        n = max(seq["computed"] + grow, len(seq["tokens"]) if data.draw(st.booleans()) else 0)
        before = _snapshot(self.pm, self.tables)
        can = self.pm.can_reserve(self.tables[sid], n)
        ok = self.pm.reserve(self.tables[sid], n)
        self._sync()
        assert ok == can
        if not ok:
            assert _snapshot(self.pm, self.tables) == before
            return
        old, new = before[3][sid], list(self.tables[sid].pages)
        assert new[: len(old)] == old and len(new) == max(len(old), -(-n // PS))
        for page in new[len(old) :]:
            self.content[page] = [None] * PS  # fresh page: stale KV must never be served

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def prefill(self, data):
        """What the engine does most: reserve the whole token list, then compute all of it."""
        sid = self._pick(data)
        seq = self.seqs[sid]
        old = list(self.tables[sid].pages)
        if self.pm.reserve(self.tables[sid], len(seq["tokens"])):
            self._sync()
            table = list(self.tables[sid].pages)
            for page in table[len(old) :]:
                self.content[page] = [None] * PS
            self._write(sid, table, len(seq["tokens"]))

    def _write(self, sid, table, n):
        seq = self.seqs[sid]
        for j in range(seq["computed"], n):
            self.content[table[j // PS]][j % PS] = seq["tokens"][j]
        seq["computed"] = n
        self.pm.commit(self.tables[sid], seq["tokens"], n)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), extra=st.lists(st.integers(1, 2), min_size=1, max_size=4))
    def append_tokens(self, data, extra):
        self.seqs[self._pick(data)]["tokens"].extend(extra)  # decode produced tokens

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def commit(self, data):
        sid = self._pick(data)
        seq = self.seqs[sid]
        table = list(self.tables[sid].pages)
        limit = min(len(seq["tokens"]), len(table) * PS)
        if limit < seq["computed"]:
            return
        self._write(sid, table, data.draw(st.integers(seq["computed"], limit)))

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), swap=st.booleans())
    def free(self, data, swap):
        sid = self._pick(data)
        del self.seqs[sid]
        table = self.tables.pop(sid)
        self.pm.free_sequence(table, swap=swap)  # swap: preempted, its pages to the host tier
        self._sync()
        assert not table.registered and table.pages == []

    @precondition(lambda self: self.pm.num_cached_pages)
    @rule()
    def reset_prefix_cache(self):
        self.pm.reset_prefix_cache()

    @invariant()
    def consistent(self):
        self.pm.check()
        assert self.pm.num_used_pages + self.pm.num_free_pages == PAGES
        assert sum(len(t.pages) for t in self.tables.values()) >= self.pm.num_used_pages

    def teardown(self):
        for table in self.tables.values():
            self.pm.free_sequence(table)
        self.pm.check()
        assert self.pm.num_used_pages == 0 and self.pm.num_free_pages == PAGES


PageManagerMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_page_manager_machine = PageManagerMachine.TestCase


class TieredPageManagerMachine(PageManagerMachine):
    """The same traffic over a pool with a 3-page host tier: every hit, from either tier, must
    serve the prompt's own tokens, whatever was evicted, swapped out or copied back meanwhile."""

    def make_manager(self):
        return HBMPageManager(PAGES, PS, host=HostTier(3))

    @invariant()
    def host_entries_were_copied(self):
        for key in self.pm.host.keys():  # a host entry holds what its page held when it was copied
            assert id(self.pm.host._entries[key]) in self.host_content


TieredPageManagerMachine.TestCase.settings = settings(PageManagerMachine.TestCase.settings, max_examples=100)
test_tiered_page_manager_machine = TieredPageManagerMachine.TestCase
