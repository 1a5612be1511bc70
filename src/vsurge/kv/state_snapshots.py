"""Snapshots of recurrent states at page boundaries, so the prefix cache works on hybrid models
(host-side bookkeeping, pure Python; the device rows live in PagedAttentionCache.snapshots).

A cached prefix resumes attention layers from its KV pages, but a recurrent layer (linear attention,
Mamba-2, short convolutions) needs its state at the prefix's end, which no page holds. So the engine
copies a sequence's states into a snapshot row whenever one of its prompt rows ends on a page
boundary (the step writes them, kv/recurrent.py), keyed by that page's chained key (the whole
prefix up to the boundary, page_manager.py). A prompt then resumes at the latest boundary of its
cached prefix that has a snapshot: its pages give the KV, the snapshot its states.

* Rows. The device holds `rows + 1` snapshot rows per recurrent layer; the last is the spare that
  rows without a snapshot write (index -1 in a step's layout).
* LRU. Taking a row for a new key evicts the least recently used snapshot; one a planned step
  will restore from is pinned until that step is planned (`release`), so nothing overwrites it first.
  Steps run in order on the device, so a row written by one step is read correctly by any later one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from .tiers import page_key

NO_ROW = -1  # a step layout's "no snapshot": reads and writes go to the spare row


class StateSnapshots:
    def __init__(self, rows: int):
        if rows < 1:
            raise ValueError(f"state snapshot rows must be >= 1, got {rows}")
        self.rows = rows
        self._free = list(range(rows - 1, -1, -1))
        self._by_key: OrderedDict[int, int] = OrderedDict()  # key -> row; first = evicted first
        self._key_of: dict[int, int] = {}  # row -> key
        self._pins: dict[int, int] = {}  # row -> planned restores not yet planned into a step
        self.saves = 0  # snapshots written
        self.restores = 0  # prompts resumed from one

    def __len__(self) -> int:
        return len(self._by_key)

    def has(self, key: int) -> bool:
        return key in self._by_key

    def row_to_save(self, key: int) -> int:
        """The row to write the states at `key` into (evicting the least recently used unpinned
        snapshot), or NO_ROW when `key` is held already or every row is pinned."""
        if key in self._by_key:
            self._by_key.move_to_end(key)
            return NO_ROW
        if self._free:
            row = self._free.pop()
        else:
            victim = next((k for k, r in self._by_key.items() if r not in self._pins), None)
            if victim is None:
                return NO_ROW
            row = self._by_key.pop(victim)
            del self._key_of[row]
        self._by_key[key], self._key_of[row] = row, key
        self.saves += 1
        return row

    def restore(self, key: int) -> int:
        """The row holding `key`'s states, pinned until `release`."""
        row = self._by_key[key]
        self._by_key.move_to_end(key)
        self._pins[row] = self._pins.get(row, 0) + 1
        self.restores += 1
        return row

    def release(self, row: int) -> None:
        self._pins[row] -= 1
        if not self._pins[row]:
            del self._pins[row]

    def clear(self) -> None:
        """Forget every snapshot not pinned (reset_prefix_cache)."""
        for key, row in list(self._by_key.items()):
            if row not in self._pins:
                del self._by_key[key], self._key_of[row]
                self._free.append(row)


def chained_keys(tokens: Sequence[int], pages: int, page_size: int, start: tuple[int, int | None] = (0, None)):
    """Keys of pages start[0] .. pages - 1 of `tokens` (as page_manager.py chains them), from
    `start` = (pages already chained, the last one's key)."""
    done, key = start
    for i in range(done, pages):
        key = page_key(key, tuple(tokens[i * page_size:(i + 1) * page_size]))
        yield i + 1, key


def chain_to(tokens: Sequence[int], pages: int, page_size: int, chain: tuple[int, int | None]):
    """(pages, key of `tokens`' page `pages`), continuing `chain` (pages chained, last key) unless it is
    already past `pages` (a sequence computing again from an earlier point)."""
    if chain[0] > pages:
        chain = (0, None)
    for chain in chained_keys(tokens, pages, page_size, chain):
        pass
    return chain
