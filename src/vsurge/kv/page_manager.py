"""Host-side bookkeeping of the paged KV cache in HBM: which page belongs to whom.

The device holds ``num_pages`` pages of ``page_size`` token slots each; this module
only hands out page ids (pure Python, no JAX), like vLLM's block manager.

* Reference counts. A page may sit in several sequences' page tables at once (a
  shared prompt prefix); ``refcount[p]`` is the number of tables holding ``p``.
  Every page is in exactly one of three states: on the free list, referenced
  (refcount > 0), or cached but unreferenced ("evictable").
* Chained hashes. Once a page is full and its KV written (``commit``), it is
  registered in the prefix cache under ``key_i = hash((key_{i-1}, tokens of page i))``,
  so the key names the whole prefix up to the end of that page, not just the page.
  The page also keeps its tokens and parent key, and a lookup compares them, so a
  hash collision on one page's key never serves the wrong tokens.
* LRU eviction. A registered page whose refcount drops to 0 keeps its KV and its
  key, so a later request with the same prefix reuses it for free. Such pages are
  still counted as free: ``reserve`` takes truly free pages first and only then
  evicts the least recently freed cached page, dropping its key.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

__all__ = ["HBMPageManager"]


@dataclass
class _Seq:
    table: list[int] = field(default_factory=list)
    num_committed: int = 0  # leading pages of `table` already hashed (registered or left private)
    last_key: int | None = None  # chained key of page num_committed - 1


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
        self._seqs: dict[Hashable, _Seq] = {}
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
    def add_sequence(self, seq_id: Hashable, tokens: Sequence[int]) -> int:
        """Register ``seq_id``; put the longest cached prefix of ``tokens`` in its table.

        Returns the number of cached tokens (a multiple of ``page_size``)."""
        if seq_id in self._seqs:
            raise ValueError(f"sequence {seq_id!r} is already registered")
        seq = self._seqs[seq_id] = _Seq()
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
            seq.table.append(page)
            seq.last_key = key
        seq.num_committed = len(seq.table)
        cached = len(seq.table) * ps
        self.prefix_queries += len(tokens)
        self.prefix_hits += cached
        return cached

    def pages_needed(self, seq_id: Hashable, num_tokens: int) -> int:
        """Extra pages ``seq_id`` needs to hold ``num_tokens`` tokens in total."""
        want = -(-num_tokens // self._page_size)
        return max(0, want - len(self._seqs[seq_id].table))

    def can_reserve(self, seq_id: Hashable, num_tokens: int) -> bool:
        return self.pages_needed(seq_id, num_tokens) <= self.num_free_pages

    def reserve(self, seq_id: Hashable, num_tokens: int) -> bool:
        """Grow the table to hold ``num_tokens`` tokens; all or nothing (False changes nothing)."""
        need = self.pages_needed(seq_id, num_tokens)
        if need > self.num_free_pages:
            return False
        table = self._seqs[seq_id].table
        for _ in range(need):
            if self._free:
                page = self._free.popleft()
            else:  # evicting drops cached KV, so only when truly free pages ran out
                page, _ = self._evictable.popitem(last=False)
                self._unregister(page)
            self._refcount[page] = 1
            table.append(page)
        return True

    def commit(self, seq_id: Hashable, tokens: Sequence[int], num_computed: int) -> None:
        """The KV of ``tokens[:num_computed]`` is written: register newly full pages."""
        if not self.enable_prefix_caching:
            return
        seq = self._seqs[seq_id]
        ps = self._page_size
        full = min(min(num_computed, len(tokens)) // ps, len(seq.table))
        # Only pages past num_committed are hashed, so calling this every step is O(new pages).
        for i in range(seq.num_committed, full):
            chunk = tuple(tokens[i * ps : (i + 1) * ps])
            key = hash((seq.last_key, chunk))
            page = seq.table[i]
            # Another page already holds this prefix: keep ours private, freed normally.
            if key not in self._key_to_page:
                self._key_to_page[key] = page
                self._entries[page] = _Entry(key, seq.last_key, chunk)
            seq.last_key = key
        seq.num_committed = max(seq.num_committed, full)

    def free_sequence(self, seq_id: Hashable) -> None:
        """Drop ``seq_id``'s references; unknown ids are ignored."""
        seq = self._seqs.pop(seq_id, None)
        if seq is None:
            return
        # Reverse order: a prefix's tail pages become evictable before its head, so
        # eviction trims prefixes from the end instead of orphaning their tails.
        for page in reversed(seq.table):
            self._refcount[page] -= 1
            if self._refcount[page] == 0:
                if page in self._entries:
                    self._evictable[page] = None
                else:
                    self._free.append(page)

    def page_table(self, seq_id: Hashable) -> list[int]:
        return list(self._seqs[seq_id].table)

    def has_sequence(self, seq_id: Hashable) -> bool:
        return seq_id in self._seqs

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
        for seq_id, seq in self._seqs.items():
            assert len(set(seq.table)) == len(seq.table), f"{seq_id!r} holds a page twice: {seq.table}"
            assert seq.num_committed <= len(seq.table), f"{seq_id!r} committed past its table"
            for page in seq.table:
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
