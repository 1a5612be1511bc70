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

``SlotPages`` is the dense engine's pool with the same interface: slot i owns a
fixed run of pages for its whole life, so reserving never fails and nothing is shared.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["HBMPageManager", "PageTable", "SlotPages"]


@dataclass(eq=False)
class PageTable:
    """The pages of one sequence, in order (token t lives in page pages[t // page_size])."""

    pages: list[int] = field(default_factory=list)
    num_committed: int = 0  # leading pages already hashed (registered or left private)
    last_key: int | None = None  # chained key of page num_committed - 1
    registered: bool = False  # held by a manager (between add_sequence and free_sequence)

    def __len__(self) -> int:
        return len(self.pages)


@dataclass(frozen=True)
class _Entry:
    key: int
    parent: int | None
    tokens: tuple[int, ...]


class HBMPageManager:
    def __init__(self, num_pages: int, page_size: int, enable_prefix_caching: bool = True):
        if num_pages < 1:
            raise ValueError(f"num_pages must be >= 1, got num_pages={num_pages}")
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got page_size={page_size}")
        self._num_pages = num_pages
        self._page_size = page_size
        self.enable_prefix_caching = enable_prefix_caching
        self._free: deque[int] = deque(range(num_pages))
        self._refcount = [0] * num_pages
        self._evictable: OrderedDict[int, None] = OrderedDict()  # first = evicted first
        self._key_to_page: dict[int, int] = {}
        self._entries: dict[int, _Entry] = {}  # registered page -> its key, parent and tokens
        self._tables: dict[int, PageTable] = {}  # id -> every registered table (for check())
        self.prefix_queries = 0
        self.prefix_hits = 0

    # --- sizes ---------------------------------------------------------------------------
    @property
    def num_pages(self) -> int:
        return self._num_pages

    @property
    def page_size(self) -> int:
        return self._page_size

    @property
    def max_tokens(self) -> int:
        return self._num_pages * self._page_size

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
        seq.registered = True
        self._tables[id(seq)] = seq
        if not self.enable_prefix_caching:
            return 0
        ps = self._page_size
        # At least one token must be left to compute, or the step would have no logits.
        for i in range(max(len(tokens) - 1, 0) // ps):
            chunk = tuple(tokens[i * ps : (i + 1) * ps])
            key = hash((seq.last_key, chunk))
            page = self._key_to_page.get(key)
            if page is None:
                break
            entry = self._entries[page]
            if entry.parent != seq.last_key or entry.tokens != chunk:
                break  # hash collision: not our prefix
            if self._refcount[page] == 0:
                del self._evictable[page]
            self._refcount[page] += 1
            seq.pages.append(page)
            seq.last_key = key
        seq.num_committed = len(seq.pages)
        cached = len(seq.pages) * ps
        self.prefix_queries += len(tokens)
        self.prefix_hits += cached
        return cached

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
            if self._free:
                page = self._free.popleft()
            else:  # evicting drops cached KV, so only when truly free pages ran out
                page, _ = self._evictable.popitem(last=False)
                self._unregister(page)
            self._refcount[page] = 1
            table.append(page)
        return True

    def commit(self, seq: PageTable, tokens: Sequence[int], num_computed: int) -> None:
        """The KV of ``tokens[:num_computed]`` is written: register newly full pages."""
        if not self.enable_prefix_caching:
            return
        ps = self._page_size
        full = min(min(num_computed, len(tokens)) // ps, len(seq.pages))
        # Only pages past num_committed are hashed, so calling this every step is O(new pages).
        for i in range(seq.num_committed, full):
            chunk = tuple(tokens[i * ps : (i + 1) * ps])
            key = hash((seq.last_key, chunk))
            page = seq.pages[i]
            # Another page already holds this prefix: keep ours private, freed normally.
            if key not in self._key_to_page:
                self._key_to_page[key] = page
                self._entries[page] = _Entry(key, seq.last_key, chunk)
            seq.last_key = key
        seq.num_committed = max(seq.num_committed, full)

    def free_sequence(self, seq: PageTable) -> None:
        """Drop the table's references and empty it; an unregistered table is ignored."""
        if self._tables.pop(id(seq), None) is None:
            return
        # Reverse order: a prefix's tail pages become evictable before its head, so
        # eviction trims prefixes from the end instead of orphaning their tails.
        for page in reversed(seq.pages):
            self._refcount[page] -= 1
            if self._refcount[page] == 0:
                if page in self._entries:
                    self._evictable[page] = None
                else:
                    self._free.append(page)
        seq.pages, seq.num_committed, seq.last_key, seq.registered = [], 0, None, False

    def reset_prefix_cache(self) -> None:
        """Return every cached-but-unreferenced page to the free list (referenced ones stay)."""
        for page in self._evictable:
            self._unregister(page)
            self._free.append(page)
        self._evictable.clear()

    def _unregister(self, page: int) -> None:
        entry = self._entries.pop(page)
        del self._key_to_page[entry.key]

    # --- invariants ----------------------------------------------------------------------
    def check(self) -> None:
        """Raise AssertionError if the bookkeeping is inconsistent."""
        free, evictable = list(self._free), list(self._evictable)
        assert len(set(free)) == len(free), f"duplicate pages on the free list: {free}"
        counts = [0] * self._num_pages
        for seq in self._tables.values():
            assert len(set(seq.pages)) == len(seq.pages), f"a table holds a page twice: {seq.pages}"
            assert seq.num_committed <= len(seq.pages), "a table committed past its pages"
            for page in seq.pages:
                counts[page] += 1
        for page in range(self._num_pages):
            assert self._refcount[page] == counts[page], (
                f"page {page}: refcount {self._refcount[page]} but in {counts[page]} tables"
            )
        referenced = {p for p in range(self._num_pages) if counts[p] > 0}
        states = [set(free), set(evictable), referenced]
        assert sum(map(len, states)) == self._num_pages and set().union(*states) == set(
            range(self._num_pages)
        ), f"pages not partitioned: free={free} evictable={evictable} referenced={sorted(referenced)}"
        assert len(self._key_to_page) == len(self._entries), "key map and registered pages differ in size"
        for page, entry in self._entries.items():
            assert self._key_to_page.get(entry.key) == page, f"key of page {page} maps elsewhere"
        for page in free:
            assert page not in self._entries, f"free page {page} is still registered"
        for page in evictable:
            assert page in self._entries, f"evictable page {page} is not registered"


class SlotPages:
    """The dense engine's pages: slot i owns pages [i * n, (i + 1) * n), n = pages for max_length.

    Same interface as HBMPageManager, so one scheduler serves both engines."""

    enable_prefix_caching = False
    prefix_queries = prefix_hits = 0

    def __init__(self, num_slots: int, max_length: int, page_size: int):
        if num_slots < 1 or max_length < 1 or page_size < 1:
            raise ValueError(f"num_slots, max_length and page_size must be >= 1, got {num_slots}, {max_length}, "
                             f"{page_size}")
        self._page_size = page_size
        self._per_slot = -(-max_length // page_size)
        self._num_pages = num_slots * self._per_slot
        self._held: set[int] = set()  # slots in use

    @property
    def num_pages(self) -> int:
        return self._num_pages

    @property
    def page_size(self) -> int:
        return self._page_size

    @property
    def max_tokens(self) -> int:
        return self._num_pages * self._page_size

    @property
    def num_free_pages(self) -> int:
        return self._num_pages - self.num_used_pages

    @property
    def num_used_pages(self) -> int:
        return len(self._held) * self._per_slot

    @property
    def usage(self) -> float:
        return self.num_used_pages / self._num_pages

    def add_sequence(self, seq: PageTable, tokens: Sequence[int], slot: int | None = None) -> int:
        if slot is None or slot in self._held:
            raise ValueError(f"slot {slot!r} is not free")
        self._held.add(slot)
        seq.pages = list(range(slot * self._per_slot, (slot + 1) * self._per_slot))
        seq.registered = True
        return 0

    def pages_needed(self, seq: PageTable, num_tokens: int) -> int:
        return 0

    def can_reserve(self, seq: PageTable, num_tokens: int) -> bool:
        return num_tokens <= self._per_slot * self._page_size

    def reserve(self, seq: PageTable, num_tokens: int) -> bool:
        return self.can_reserve(seq, num_tokens)

    def commit(self, seq: PageTable, tokens: Sequence[int], num_computed: int) -> None:
        pass

    def free_sequence(self, seq: PageTable) -> None:
        if seq.registered:
            self._held.discard(seq.pages[0] // self._per_slot)
        seq.pages, seq.registered = [], False
