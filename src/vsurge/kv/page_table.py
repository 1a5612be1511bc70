"""The page pools' shared types: a sequence's `PageTable`, the sizes both pools report, and a
registered page's prefix-cache entry (page_manager.py; kv/slot_pages.py uses the first two)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(eq=False)
class PageTable:
    """The pages of one sequence, in order (token t lives in page pages[t // page_size])."""

    pages: list[int] = field(default_factory=list)
    num_committed: int = 0  # leading pages already hashed (registered or left private)
    last_key: int | None = None  # chained key of page num_committed - 1
    registered: bool = False  # held by a manager (between add_sequence and free_sequence)
    pending: list[int] = field(default_factory=list)  # keys of full pages it computes next (in flight)
    pending_end: int = 0  # index of the page after the last pending one
    computed: int = 0  # tokens whose KV is written (as of the last commit)
    tokens: Sequence[int] = ()  # the sequence's tokens (as of the last commit; for its tail)
    restore: int | None = None  # snapshot row its first prompt row resumes from (kv/state_snapshots.py)
    chain: tuple[int, int | None] = (0, None)  # pages chained so far for its snapshots, the last key
    # the key its first page chains from: None, or what sets its KV apart from the same tokens' under the
    # base model (a LoRA adapter's content hash: two adapters never share pages)
    root: int | None = None

    def __len__(self) -> int:
        return len(self.pages)


@dataclass(frozen=True)
class _Entry:
    key: int
    parent: int | None
    tokens: tuple[int, ...]


class PoolSizes:
    """The sizes both page pools (this one, kv/slot_pages.py's) report."""

    _num_pages: int
    _page_size: int

    @property
    def num_pages(self) -> int:
        return self._num_pages

    @property
    def page_size(self) -> int:
        return self._page_size

    @property
    def max_tokens(self) -> int:
        return self._num_pages * self._page_size
