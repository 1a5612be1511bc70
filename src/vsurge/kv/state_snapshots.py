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
* Lower tiers (optional `host`: a kv/tiers.HostTier of state rows, with its disk tier), as for KV
  pages: an evicted snapshot is queued to be copied to the host tier (`take_saves`), a snapshot a
  step wrote is queued for the disk tier once that step is dispatched (`written`, `take_persists`),
  and a restore that misses the device rows but hits a lower tier takes a row and queues the copy
  back (`take_loads`). The engine (engine/tier_mover.py) runs the copies off the device before the
  next step, and the copies back after them, as it does pages.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from .tiers import HostTier, TierEntry, TierQueues, page_key

NO_ROW = -1  # a step layout's "no snapshot": reads and writes go to the spare row


class StateSnapshots(TierQueues):
    def __init__(self, rows: int, host: HostTier | None = None):
        super().__init__()
        if rows < 1:
            raise ValueError(f"state snapshot rows must be >= 1, got {rows}")
        self.rows = rows
        self.host = host  # the lower tiers (None: snapshots live in the device rows only)
        self._free = list(range(rows - 1, -1, -1))
        self._by_key: OrderedDict[int, int] = OrderedDict()  # key -> row; first = evicted first
        self._key_of: dict[int, int] = {}  # row -> key
        self._pins: dict[int, int] = {}  # row -> planned restores not yet planned into a step
        self.saves = 0  # snapshots written
        self.restores = 0  # prompts resumed from one
        self.to_host = self.from_tiers = 0  # snapshots copied to the host tier / back from host or disk

    def __len__(self) -> int:
        return len(self._by_key)

    def has(self, key: int) -> bool:
        """`key`'s states are in a device row."""
        return key in self._by_key

    def holds(self, key: int) -> bool:
        """`key`'s states are in a device row or a lower tier (unchecked there: a restore may miss)."""
        return key in self._by_key or (self.host is not None and self.host.holds(key))

    def row_to_save(self, key: int) -> int:
        """The row to write the states at `key` into (evicting the least recently used unpinned
        snapshot), or NO_ROW when `key` is held already or every row is pinned."""
        if key in self._by_key:
            self._by_key.move_to_end(key)
            return NO_ROW
        row = self._take_row(key)
        if row != NO_ROW:
            self.saves += 1
        return row

    def _take_row(self, key: int) -> int:
        """A free row, else the least recently used unpinned one (its states queued for the host
        tier), now `key`'s; NO_ROW when every row is pinned."""
        if self._free:
            row = self._free.pop()
        else:
            victim = next((k for k, r in self._by_key.items() if r not in self._pins), None)
            if victim is None:
                return NO_ROW
            row = self._by_key.pop(victim)
            del self._key_of[row]
            if self._loads.pop(row, None) is None:  # (a load never written: the tier below still has it)
                self._save(row, victim)
        self._by_key[key], self._key_of[row] = row, key
        return row

    def _save(self, row: int, key: int) -> None:
        if self.host is None or not self.host.enabled or key in self.host:
            return
        entry = TierEntry(key, None, ())
        self.host.put(entry)
        self._saves.append((row, entry))
        self.to_host += 1

    def restore(self, key: int) -> int | None:
        """The row holding `key`'s states, pinned until `release`: a device row, else a row the
        lower tier's copy is queued into (`take_loads`); None when neither has it (a lower tier's
        file unreadable) or every row is pinned."""
        row = self._by_key.get(key)
        if row is None:
            found = self.host.lookup(key, None, ()) if self.host is not None else None
            if found is None or (row := self._take_row(key)) == NO_ROW:
                return None
            self._loads[row] = found
            self.from_tiers += 1
        self._by_key.move_to_end(key)
        self._pins[row] = self._pins.get(row, 0) + 1
        self.restores += 1
        return row

    def written(self, row: int) -> None:
        """A dispatched step wrote `row`'s states: queue them for the disk tier (once per key)."""
        disk = self.host.disk if self.host is not None else None
        key = self._key_of.get(row)
        if disk is not None and key is not None and not disk.has(key):
            self._persists.append((row, TierEntry(key, None, ())))

    @property
    def has_moves(self) -> bool:
        return bool(self._saves or self._persists or self._loads)

    def release(self, row: int) -> None:
        self._pins[row] -= 1
        if not self._pins[row]:
            del self._pins[row]

    def clear(self) -> None:
        """Forget every snapshot not pinned (reset_prefix_cache)."""
        for key, row in list(self._by_key.items()):
            if row not in self._pins:
                del self._by_key[key], self._key_of[row]
                self._loads.pop(row, None)
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
