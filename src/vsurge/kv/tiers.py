"""The prefix cache's lower tiers: host memory and a directory on disk (pure Python, no JAX).

The device pool (page_manager.HBMPageManager) is the first tier. A registered page it
evicts, or a page of a preempted sequence (swap), is copied into the host tier under the
same chained key (`page_key`); a lookup that misses the device pool asks the host tier,
which asks the disk tier (kv/disk_tier.py) on a miss and keeps what it reads. Every entry
keeps its parent key and tokens, and a hit compares them, so a key collision never serves
the wrong KV.

An entry's `payload` is filled by the engine (engine/tier_mover.py) once it has copied the
page off the device: the page manager only decides which page goes where.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass

__all__ = ["HostTier", "TierEntry", "TierQueues", "page_key", "tail_key"]


def page_key(parent: int | None, tokens) -> int:
    """Chained key of a page: names the whole prefix up to the page's end. Stable across
    processes (a disk tier reads it after a restart), which hash() of a tuple holding None is not."""
    h = hashlib.blake2b(b"\x00" if parent is None else b"\x01" + parent.to_bytes(8, "little"), digest_size=8)
    h.update(array("q", tokens).tobytes())
    return int.from_bytes(h.digest(), "little")


def tail_key(parent: int | None) -> int:
    """Key of the disk tier's tail under `parent` (no page holds zero tokens: never a page's key)."""
    return page_key(parent, ())


@dataclass(eq=False)
class TierEntry:
    key: int
    parent: int | None
    tokens: tuple[int, ...]
    payload: object = None  # the page's K/V (engine/tier_mover.py PageRef); None until copied off the device
    from_disk: bool = False  # read back from the disk tier (for its hit count)
    tail: bool = False  # a partly filled page kept under tail_key(parent); a newer one replaces it

    def matches(self, parent: int | None, tokens) -> bool:
        return self.parent == parent and self.tokens == tuple(tokens)


class TierQueues:
    """The copies a pool queues for the engine (engine/tier_mover.py), by the pool's row or page index:
    saves (to the host tier), persists (to disk), both run off the device first, then loads back."""

    def __init__(self):
        self._saves: list[tuple[int, TierEntry]] = []  # (index, entry): copy its contents to the host tier
        self._persists: list[tuple[int, TierEntry]] = []  # (index, entry): write its contents to disk
        self._loads: dict[int, TierEntry] = {}  # index -> entry whose contents must be written into it

    def take_saves(self) -> list[tuple[int, TierEntry]]:
        saves, self._saves = self._saves, []
        return saves

    def take_persists(self) -> list[tuple[int, TierEntry]]:
        persists, self._persists = self._persists, []
        return persists

    def take_loads(self) -> list[tuple[int, TierEntry]]:
        loads, self._loads = list(self._loads.items()), {}
        return loads


class HostTier:
    """LRU map of chained keys to pages held in host memory, at most `capacity_pages` of them.
    `disk`: the tier below (kv/disk_tier.DiskTier), asked on a miss; None = no disk tier."""

    def __init__(self, capacity_pages: int, disk=None):
        if capacity_pages < 0:
            raise ValueError(f"capacity_pages must be >= 0, got {capacity_pages}")
        self.capacity_pages = capacity_pages
        self.disk = disk
        self._entries: OrderedDict[int, TierEntry] = OrderedDict()  # first = dropped first
        self.dropped = 0  # entries pushed out by newer ones (LRU)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: int) -> bool:
        return key in self._entries

    @property
    def enabled(self) -> bool:
        """Pages may be kept here (a disk tier alone passes its pages through)."""
        return self.capacity_pages > 0

    def keys(self) -> list[int]:
        return list(self._entries)

    def put(self, entry: TierEntry) -> None:
        """Keep `entry` (most recently used), dropping the least recently used beyond capacity."""
        if not self.enabled:
            return
        self._entries[entry.key] = entry
        self._entries.move_to_end(entry.key)
        while len(self._entries) > self.capacity_pages:
            self._entries.popitem(last=False)
            self.dropped += 1

    def holds(self, key: int) -> bool:
        """A page is kept under `key` here or on disk (unchecked: a lookup may still miss)."""
        return key in self._entries or (self.disk is not None and self.disk.has(key))

    def holds_tail(self, parent: int | None) -> bool:
        return self.disk is not None and self.disk.has(tail_key(parent))

    def tail(self, parent: int | None) -> TierEntry | None:
        """The disk tier's tail under `parent` (whatever tokens it holds), or None."""
        key = tail_key(parent)
        payload = self.disk.get(key, parent, None) if self.disk is not None else None
        return None if payload is None else TierEntry(key, parent, payload.tokens, payload, from_disk=True, tail=True)

    def lookup(self, key: int, parent: int | None, tokens) -> TierEntry | None:
        """The page of this prefix, from host memory or else from disk (then kept here); None on a miss."""
        entry = self._entries.get(key)
        if entry is not None:
            if not entry.matches(parent, tokens):
                return None  # a key collision: not our prefix
            self._entries.move_to_end(key)
            return entry
        if self.disk is None:
            return None
        payload = self.disk.get(key, parent, tuple(tokens))
        if payload is None:
            return None
        entry = TierEntry(key, parent, tuple(tokens), payload, from_disk=True)
        self.put(entry)
        return entry

    def release(self, entry: TierEntry) -> None:
        """`entry`'s page is written back to the device: a disk read buffer this tier does not keep
        is reused."""
        if self.disk is not None and self._entries.get(entry.key) is not entry and hasattr(entry.payload, "buffer"):
            self.disk.recycle(entry.payload)

    def discard(self, key: int) -> None:
        self._entries.pop(key, None)

    def check(self) -> None:
        assert len(self._entries) <= max(self.capacity_pages, 0), "host tier over capacity"
        for key, entry in self._entries.items():
            assert entry.key == key, f"host entry under {key} carries key {entry.key}"
