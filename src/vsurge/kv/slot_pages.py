"""The dense engine's pages (pure Python): the paged pool's interface (kv/page_manager.py) over a
fixed run of pages per slot, so reserving never fails and nothing is shared."""

from __future__ import annotations

from collections.abc import Sequence

from .page_table import PageTable, PoolSizes

__all__ = ["SlotPages"]


class SlotPages(PoolSizes):
    """The dense engine's pages: slot i owns pages [i * n, (i + 1) * n), n = pages for max_length.

    Same interface as HBMPageManager, so one scheduler serves both engines."""

    enable_prefix_caching = False
    prefix_queries = prefix_hits = 0
    host = None
    has_moves = False
    last_hits: dict = {}

    def __init__(self, num_slots: int, max_length: int, page_size: int):
        if num_slots < 1 or max_length < 1 or page_size < 1:
            raise ValueError(f"num_slots, max_length and page_size must be >= 1, got {num_slots}, {max_length}, "
                             f"{page_size}")
        self._page_size = page_size
        self._per_slot = -(-max_length // page_size)
        self._num_pages = num_slots * self._per_slot
        self._held: set[int] = set()  # slots in use

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

    def inflight_pages(self, tokens: Sequence[int], root: int | None = None) -> int:
        return 0

    def cached_tokens(self, tokens: Sequence[int], root: int | None = None) -> int:
        return 0

    def tier_counts(self) -> dict[str, int]:
        return {}

    def free_sequence(self, seq: PageTable, swap: bool = False) -> None:
        if seq.registered:
            self._held.discard(seq.pages[0] // self._per_slot)
        seq.pages, seq.registered = [], False
