"""Host-side bookkeeping of the paged KV cache: which page belongs to whom (pure Python, no JAX).

The device holds ``num_pages`` pages of ``page_size`` token slots each; this module
only hands out page ids, like vLLM's block manager. Each sequence carries its own
``PageTable`` (the page ids in order); the manager fills and frees it.

* Reference counts. A page may sit in several tables at once (a shared prompt
  prefix); ``refcount[p]`` is the number of tables holding ``p``. Every page is in
  exactly one of three states: on the free list, referenced (refcount > 0), or
  cached but unreferenced ("evictable").
* Chained hashes. Once a page is full and its KV written (``commit``), it is
  registered in the prefix cache under ``key_i = hash((key_{i-1}, tokens of page i))``,
  so the key names the whole prefix up to the end of that page, not just the page.
  The page also keeps its tokens and parent key, and a lookup compares them, so a
  hash collision on one page's key never serves the wrong tokens.
* LRU eviction. A registered page whose refcount drops to 0 keeps its KV and its
  key, so a later request with the same prefix reuses it for free. Such pages are
  still counted as free: ``reserve`` takes truly free pages first and only then
  evicts the least recently freed cached page, dropping its key.
* In flight. A table announces the keys of the full pages it is about to compute
  (`add_sequence`) until it commits them; `inflight_pages` tells the scheduler that a
  prompt's prefix is being computed right now, so it can wait for it instead of
  computing it again.
* Below a page (tails). A sequence's last, partly computed page is registered when it is
  freed (the tokens it holds so far), and a prompt whose next tokens share a prefix with a
  registered page under the same parent key (that tail, or a full page that diverges later)
  gets a private copy of it (`take_copies`: copy-on-write, it writes the rest itself) and
  skips those tokens: the same prompt sent again, or the next chat turn, computes only what
  is new, as llama.cpp's slots do, instead of up to a page. The disk tier keeps one tail per
  parent key, so a restarted server finds it too.
* Recurrent states (hybrid models, optional `snapshots`: kv/state_snapshots.py). A prefix resumes
  only at a page boundary whose states were snapshotted (on the device or in a lower tier), the
  latest one its cached pages reach;
  pages past it are not taken, tails are off (no state below a page), and two tokens stay to
  compute so the first runs as a prompt row that restores the states.
* Lower tiers (kv/tiers.py, optional `host`). An evicted registered page, and every
  registered page of a preempted sequence (`free_sequence(swap=True)`), is queued to
  be copied to the host tier (`take_saves`); a lookup that misses the device pool but
  hits the host (or disk) tier takes a fresh page and queues the copy back
  (`take_loads`). With a disk tier, each newly registered page is queued to be written
  (`take_persists`). The engine (engine/tier_mover.py) runs every queued copy off the device
  before it writes any page back, and both before the next step.

kv/slot_pages.py's ``SlotPages`` is the dense engine's pool with the same interface.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence

from .page_check import check_pages
from .page_table import PageTable, PoolSizes, _Entry
from .state_snapshots import StateSnapshots, chained_keys
from .tiers import HostTier, TierEntry, TierQueues, page_key, tail_key

TIERS = ("device", "host", "disk")

__all__ = ["HBMPageManager", "PageTable"]


class HBMPageManager(PoolSizes, TierQueues):
    def __init__(self, num_pages: int, page_size: int, enable_prefix_caching: bool = True,
                 host: HostTier | None = None, snapshots: StateSnapshots | None = None):
        self.sized_by: str | None = None  # why this many pages, for the start-up line (engine/pools.py)
        if num_pages < 1:
            raise ValueError(f"num_pages must be >= 1, got num_pages={num_pages}")
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got page_size={page_size}")
        TierQueues.__init__(self)  # (pages: saves and persists by page id, loads into fresh pages)
        self._num_pages = num_pages
        self._page_size = page_size
        self.enable_prefix_caching = enable_prefix_caching
        self._free: deque[int] = deque(range(num_pages))
        self._refcount = [0] * num_pages
        self._evictable: OrderedDict[int, None] = OrderedDict()  # first = evicted first
        self._key_to_page: dict[int, int] = {}
        self._entries: dict[int, _Entry] = {}  # registered page -> its key, parent and tokens
        self._children: dict[tuple, set[int]] = {}  # (parent key, first token) -> registered pages
        # recurrent-state snapshots of a hybrid model (None: attention only, or no prefix cache for it)
        self.snapshots = snapshots if enable_prefix_caching else None
        # copy-on-write hits below a page (an engine that cannot copy pages turns it off; no state is
        # snapshotted below a page)
        self.tail_hits = self.snapshots is None
        self.min_tail = max(1, page_size // 8)  # fewer shared tokens are computed again, not copied
        self._copies: dict[int, int] = {}  # destination page -> source page (tails, copy-on-write)
        self._tables: dict[int, PageTable] = {}  # id -> every registered table (for check())
        self.prefix_queries = 0
        self.prefix_hits = 0
        self._inflight: dict[int, int] = {}  # key -> tables computing that page now
        self.host = host if enable_prefix_caching else None
        self.tier_hits = dict.fromkeys(TIERS, 0)  # prompt tokens found in each tier
        self.last_hits = dict.fromkeys(TIERS, 0)  # of the last add_sequence
        self.pages_to_host = self.pages_from_host = self.swap_outs = self.pages_prefetched = 0
        self._prefetched: set[int] = set()  # pages prefetched from disk and not hit yet (their hits count as disk's)

    # --- sizes ---------------------------------------------------------------------------
    @property
    def num_free_pages(self) -> int:
        return len(self._free) + len(self._evictable)

    @property
    def num_used_pages(self) -> int:
        return self._num_pages - self.num_free_pages  # the three states partition the pages

    @property
    def num_cached_pages(self) -> int:
        return len(self._entries)

    @property
    def usage(self) -> float:
        return self.num_used_pages / self._num_pages

    # --- sequences -----------------------------------------------------------------------
    def add_sequence(self, seq: PageTable, tokens: Sequence[int], slot: int | None = None) -> int:
        """Register an empty table; put the longest cached prefix of ``tokens`` in it.

        Returns the number of cached tokens (a multiple of ``page_size``). `slot` is unused here
        (SlotPages needs it)."""
        if seq.registered or seq.pages:
            raise ValueError("this page table is already registered")
        seq.registered, seq.last_key = True, seq.root
        self._tables[id(seq)] = seq
        self.last_hits = dict.fromkeys(TIERS, 0)
        if not self.enable_prefix_caching:
            return 0
        ps = self._page_size
        # At least one token must be left to compute, or the step would have no logits.
        full = max(len(tokens) - 1, 0) // ps
        if self.snapshots is not None:
            full = self._resumable_pages(tokens)
        for i in range(full):
            chunk = tuple(tokens[i * ps : (i + 1) * ps])
            key = page_key(seq.last_key, chunk)
            page = self._key_to_page.get(key)
            if page is None:
                break
            entry = self._entries[page]
            if entry.parent != seq.last_key or entry.tokens != chunk:
                break  # hash collision: not our prefix
            if self._refcount[page] == 0:
                del self._evictable[page]
            self._refcount[page] += 1
            self.last_hits[self._device_hit(page)] += ps
            seq.pages.append(page)
            seq.last_key = key
        while self.host is not None and len(seq.pages) < full and self.num_free_pages:
            i = len(seq.pages)
            chunk = tuple(tokens[i * ps : (i + 1) * ps])
            key = page_key(seq.last_key, chunk)
            found = self.host.lookup(key, seq.last_key, chunk)
            if found is None:
                break
            page = self._take_page()  # registered now: its KV is written before the next step reads it
            self._refcount[page] = 1
            self._register(page, key, seq.last_key, chunk)
            self._loads[page] = found
            self.last_hits["disk" if found.from_disk else "host"] += ps
            found.from_disk = False  # a later hit on it is a host hit
            seq.pages.append(page)
            seq.last_key = key
        if self.snapshots is not None:
            self._resume_at_snapshot(seq, tokens)
        seq.num_committed = len(seq.pages)
        self._announce(seq, tokens)
        cached = len(seq.pages) * ps + self._take_tail(seq, tokens)
        self.prefix_queries += len(tokens)
        self.prefix_hits += cached
        for tier, n in self.last_hits.items():
            self.tier_hits[tier] += n
        return cached

    def _resumable_pages(self, tokens: Sequence[int]) -> int:
        """Pages of `tokens`' cached prefix (device pool or lower tiers) up to the latest boundary with
        a state snapshot; two tokens stay to compute (the first restores the states in a prompt row)."""
        count, best = 0, 0
        for count, key in chained_keys(tokens, max(len(tokens) - 2, 0) // self._page_size, self._page_size):
            page = self._key_to_page.get(key)
            if page is None and not (self.host is not None and self.host.holds(key)):
                break
            if page is not None and self._entries[page].tokens != tuple(
                    tokens[(count - 1) * self._page_size:count * self._page_size]):
                break
            if self.snapshots.holds(key):
                best = count
        return best

    def _resume_at_snapshot(self, seq: PageTable, tokens: Sequence[int]) -> None:
        """Keep `seq`'s found pages up to the latest snapshotted boundary (fewer than planned when a
        lower tier's page found no free page) and pin that snapshot for its first prompt row."""
        keys = [key for _, key in chained_keys(tokens, len(seq.pages), self._page_size)]
        keep, row = len(keys), None
        while keep and (not self.snapshots.holds(keys[keep - 1])
                        or (row := self.snapshots.restore(keys[keep - 1])) is None):
            keep -= 1  # (a lower tier's snapshot may turn out unreadable)
        seq.restore = row
        while len(seq.pages) > keep:
            page = seq.pages.pop()
            self.last_hits["host" if page in self._loads else self._device_hit(page)] -= self._page_size
            self._refcount[page] -= 1
            if self._refcount[page] == 0:
                self._evictable[page] = None  # registered: its KV (or its queued load) stays cached
        seq.last_key = keys[keep - 1] if keep else seq.root

    def _announce(self, seq: PageTable, tokens: Sequence[int]) -> None:
        """Mark the keys of the full pages `seq` will compute as in flight until it commits them."""
        ps, key = self._page_size, seq.last_key
        for i in range(seq.num_committed, len(tokens) // ps):
            key = page_key(key, tuple(tokens[i * ps : (i + 1) * ps]))
            seq.pending.append(key)
            self._inflight[key] = self._inflight.get(key, 0) + 1
        seq.pending_end = len(tokens) // ps

    def _settle(self, seq: PageTable, keep: int) -> None:
        """Drop `seq`'s in-flight keys but the last `keep`."""
        while len(seq.pending) > keep:
            key = seq.pending.pop(0)
            self._inflight[key] -= 1
            if not self._inflight[key]:
                del self._inflight[key]

    def cached_tokens(self, tokens: Sequence[int], root: int | None = None) -> int:
        """Tokens of `tokens`' prefix that add_sequence would find now: in the device pool, then in
        the host or disk tier (by key: nothing is read, nothing changes), then a tail. root: the
        table's (PageTable.root)."""
        if not self.enable_prefix_caching:
            return 0
        if self.snapshots is not None:
            return self._resumable_pages(tokens) * self._page_size
        ps, parent, count = self._page_size, root, 0
        for i in range(max(len(tokens) - 1, 0) // ps):
            chunk = tuple(tokens[i * ps : (i + 1) * ps])
            key = page_key(parent, chunk)
            page = self._key_to_page.get(key)
            if page is None and not (self.host is not None and self.host.holds(key)):
                break
            if page is not None and self._entries[page].tokens != chunk:
                break
            parent, count = key, count + ps
        rest = tuple(tokens[count : min(len(tokens) - 1, count + ps)])
        if not self.tail_hits or len(rest) < self.min_tail:
            return count
        shared = self._tail_match(parent, rest)[1]
        if shared < self.min_tail and self.host is not None and self.host.holds_tail(parent):
            shared = len(rest)  # a tail on disk, unread: a guess (it only shapes the next step)
        return count + (shared if shared >= self.min_tail else 0)

    def inflight_pages(self, tokens: Sequence[int], root: int | None = None) -> int:
        """Full pages of `tokens`' prefix (as add_sequence would look it up) that a live table is
        computing now; 0 when none is. Cached pages on the way are skipped over."""
        if not self._inflight or not self.enable_prefix_caching:
            return 0
        ps, key, count = self._page_size, root, 0
        for i in range(max(len(tokens) - 1, 0) // ps):
            key = page_key(key, tuple(tokens[i * ps : (i + 1) * ps]))
            if key in self._inflight:
                count += 1
            elif key not in self._key_to_page:
                break
        return count

    # --- tails: copy-on-write hits below a page --------------------------------------------
    def _tail_match(self, parent: int | None, rest: tuple) -> tuple[int | None, int]:
        """The registered page under `parent` whose tokens share the longest prefix with `rest`
        (a tail, or a full page that diverges later) and how many tokens they share."""
        best, shared = None, 0
        for page in self._children.get((parent, rest[0]), ()) if rest else ():
            if page in self._loads:
                continue  # its KV is not written yet
            n = _shared_prefix(self._entries[page].tokens, rest)
            if n > shared:
                best, shared = page, n
        return best, shared

    def _take_tail(self, seq: PageTable, tokens: Sequence[int]) -> int:
        """Start `seq`'s next page as a private copy of the best tail match (device pool, else the
        disk tier's tail under the same parent): the tokens it skips (0 for none)."""
        ps, i = self._page_size, len(seq.pages)
        rest = tuple(tokens[i * ps : min(len(tokens) - 1, (i + 1) * ps)])  # one token stays to compute
        if not self.tail_hits or len(rest) < self.min_tail or not self.num_free_pages:
            return 0
        source, shared = self._tail_match(seq.last_key, rest)
        found = None
        if shared < len(rest) and self.host is not None and self.host.holds_tail(seq.last_key):
            found = self.host.tail(seq.last_key)
            on_disk = _shared_prefix(found.tokens, rest) if found is not None else 0
            if on_disk > shared:
                shared = on_disk
            else:
                found = None
        if shared < self.min_tail:
            return 0
        page = self._take_page()  # may evict `source`: copies run before anything writes a page
        self._refcount[page] = 1
        if found is not None:
            self._loads[page] = found
            self.last_hits["disk"] += shared
        else:
            self._copies[page] = source
            self.last_hits[self._device_hit(source)] += shared
        seq.pages.append(page)
        return shared

    def _keep_tail(self, seq: PageTable) -> None:
        """Register the partly computed page after `seq`'s committed ones under the tokens it holds
        so far (it is being freed), and queue it for the disk tier's tail of its parent."""
        ps = self._page_size
        i, n = divmod(seq.computed, ps)
        if not n or i != seq.num_committed or i >= len(seq.pages) or len(seq.tokens) < seq.computed:
            return
        page = seq.pages[i]
        if page in self._entries or self._refcount[page] != 1 or page in self._copies or page in self._loads:
            return
        chunk = tuple(seq.tokens[i * ps : seq.computed])
        key = page_key(seq.last_key, chunk)
        if key in self._key_to_page:
            return
        self._register(page, key, seq.last_key, chunk)
        disk = self.host.disk if self.host is not None else None
        if disk is not None:
            self._persists.append((page, TierEntry(tail_key(seq.last_key), seq.last_key, chunk, tail=True)))

    # --- prefetch: pages read from the disk tier at start-up --------------------------------
    def prefetch(self, found: list[TierEntry]) -> int:
        """Put pages read from the disk tier (a restarted server's most recent prefixes) into free
        pages as cached, unreferenced ones: a prompt that comes back hits them in the device pool
        and their KV is written before the next step (`take_loads`). Only truly free pages are
        used (nothing is evicted), and they stay evictable, so the pool's room is unchanged.
        Entries are registered under the keys their parent and tokens give (a tail: the tokens
        it holds). -> the entries taken (the others' read buffers are free to reuse)."""
        taken = []
        for entry in found:
            tail = len(entry.tokens) < self._page_size
            key = page_key(entry.parent, entry.tokens)
            if (not self._free or not entry.tokens or key in self._key_to_page or (tail and not self.tail_hits)
                    or not self.enable_prefix_caching):
                continue
            page = self._free.popleft()
            self._register(page, key, entry.parent, entry.tokens)
            self._evictable[page] = None
            self._loads[page] = entry
            self._prefetched.add(page)
            taken.append(entry)
        self.pages_prefetched += len(taken)
        return taken

    def _device_hit(self, page: int) -> str:
        """The tier a hit on a registered page counts for: disk for a prefetched page's first hit."""
        if page in self._prefetched:
            self._prefetched.discard(page)
            return "disk"
        return "device"

    def take_copies(self) -> list[tuple[int, int]]:
        """(source, destination) pages to copy before the next step (after the tiers' gathers,
        before their loads: engine/tier_mover.py)."""
        copies, self._copies = [(src, dst) for dst, src in self._copies.items()], {}
        return copies

    def pages_needed(self, seq: PageTable, num_tokens: int) -> int:
        """Extra pages ``seq`` needs to hold ``num_tokens`` tokens in total."""
        want = -(-num_tokens // self._page_size)
        return max(0, want - len(seq.pages))

    def can_reserve(self, seq: PageTable, num_tokens: int) -> bool:
        return self.pages_needed(seq, num_tokens) <= self.num_free_pages

    def reserve(self, seq: PageTable, num_tokens: int) -> bool:
        """Grow the table to hold ``num_tokens`` tokens; all or nothing (False changes nothing)."""
        need = self.pages_needed(seq, num_tokens)
        if need > self.num_free_pages:
            return False
        table = seq.pages
        for _ in range(need):
            page = self._take_page()
            self._refcount[page] = 1
            table.append(page)
        return True

    def _take_page(self) -> int:
        """A truly free page, else the least recently freed cached one (its KV to the host tier)."""
        if self._free:
            return self._free.popleft()
        page, _ = self._evictable.popitem(last=False)  # evicting drops cached KV: only when nothing is free
        self._save(page)
        self._unregister(page)
        return page

    def _save(self, page: int) -> bool:
        """Queue a registered page's KV for the host tier, unless it is there (or never arrived)."""
        entry = self._entries[page]
        if page in self._loads:  # its KV was never written: the host tier still has it
            del self._loads[page]
            return False
        if self.host is None or not self.host.enabled or entry.key in self.host or len(entry.tokens) < self._page_size:
            return False  # (a tail: the disk tier keeps it under its parent)
        copy = TierEntry(entry.key, entry.parent, entry.tokens)
        self.host.put(copy)
        self._saves.append((page, copy))
        self.pages_to_host += 1
        return True

    # --- copies for the engine (engine/tier_mover.py): run every save and persist, then every load
    def take_loads(self) -> list[tuple[int, TierEntry]]:
        loads = super().take_loads()
        self.pages_from_host += len(loads)
        return loads

    @property
    def has_moves(self) -> bool:
        return bool(self._saves or self._persists or self._loads or self._copies
                    or (self.snapshots is not None and self.snapshots.has_moves))

    def tier_counts(self) -> dict[str, int]:
        """Cumulative counters of the tiers (the driver reports their deltas as metrics)."""
        counts = {f"hits_{tier}": n for tier, n in self.tier_hits.items()}
        counts.update(pages_to_host=self.pages_to_host, pages_from_host=self.pages_from_host,
                      swap_outs=self.swap_outs, prefetched=self.pages_prefetched)
        disk = self.host.disk if self.host is not None else None
        counts.update(pages_to_disk=disk.pages_written if disk else 0, pages_from_disk=disk.pages_read if disk else 0)
        if self.snapshots is not None:
            s = self.snapshots
            counts.update(snapshots_saved=s.saves, snapshots_restored=s.restores, snapshots_to_host=s.to_host,
                          snapshots_from_tiers=s.from_tiers)
        return counts

    def commit(self, seq: PageTable, tokens: Sequence[int], num_computed: int) -> None:
        """The KV of ``tokens[:num_computed]`` is written: register newly full pages."""
        if not self.enable_prefix_caching:
            return
        ps = self._page_size
        seq.computed, seq.tokens = min(num_computed, len(tokens)), tokens
        full = min(min(num_computed, len(tokens)) // ps, len(seq.pages))
        # Only pages past num_committed are hashed, so calling this every step is O(new pages).
        disk = self.host.disk if self.host is not None else None
        for i in range(seq.num_committed, full):
            chunk = tuple(tokens[i * ps : (i + 1) * ps])
            key = page_key(seq.last_key, chunk)
            page = seq.pages[i]
            # Another page already holds this prefix: keep ours private, freed normally.
            if key not in self._key_to_page:
                self._register(page, key, seq.last_key, chunk)
                if disk is not None and not disk.has(key):
                    self._persists.append((page, TierEntry(key, seq.last_key, chunk)))
            seq.last_key = key
        seq.num_committed = max(seq.num_committed, full)
        self._settle(seq, max(0, seq.pending_end - seq.num_committed))

    def free_sequence(self, seq: PageTable, swap: bool = False) -> None:
        """Drop the table's references and empty it; an unregistered table is ignored. `swap`
        (a preempted sequence): its registered pages go to the host tier now, to come back
        when it resumes."""
        if self._tables.pop(id(seq), None) is None:
            return
        self._settle(seq, 0)
        if seq.restore is not None:  # freed before its first prompt row was planned
            self.snapshots.release(seq.restore)
            seq.restore = None
        if self.tail_hits:
            self._keep_tail(seq)
        # Reverse order: a prefix's tail pages become evictable before its head, so
        # eviction trims prefixes from the end instead of orphaning their tails.
        for page in reversed(seq.pages):
            self._refcount[page] -= 1
            if self._refcount[page] == 0:
                if page in self._entries:
                    self._evictable[page] = None
                    if swap and self._save(page):
                        self.swap_outs += 1
                else:
                    self._copies.pop(page, None)  # a copy or load queued for it is moot now
                    self._loads.pop(page, None)
                    self._free.append(page)
        seq.pages, seq.num_committed, seq.last_key, seq.registered, seq.pending_end = [], 0, seq.root, False, 0
        seq.computed, seq.tokens = 0, ()

    def reset_prefix_cache(self) -> None:
        """Return every cached-but-unreferenced page to the free list (referenced ones stay)."""
        for page in self._evictable:
            self._loads.pop(page, None)
            self._unregister(page)
            self._free.append(page)
        self._evictable.clear()
        if self.snapshots is not None:
            self.snapshots.clear()

    def _register(self, page: int, key: int, parent: int | None, tokens: tuple) -> None:
        self._key_to_page[key] = page
        self._entries[page] = _Entry(key, parent, tokens)
        self._children.setdefault((parent, tokens[0]), set()).add(page)

    def _unregister(self, page: int) -> None:
        self._prefetched.discard(page)
        entry = self._entries.pop(page)
        del self._key_to_page[entry.key]
        siblings = self._children[(entry.parent, entry.tokens[0])]
        siblings.discard(page)
        if not siblings:
            del self._children[(entry.parent, entry.tokens[0])]

    # --- invariants ----------------------------------------------------------------------
    def check(self) -> None:
        """Raise AssertionError if the bookkeeping is inconsistent (page_check.py)."""
        check_pages(self)


def _shared_prefix(a: tuple, b: tuple) -> int:
    """How many leading tokens a and b share."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
