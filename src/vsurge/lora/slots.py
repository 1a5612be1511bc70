"""Which adapter holds which of the engine's device slots, and the adapters a server knows.

Registered adapters live in host memory (`register`, by name). A sequence asks for a slot when it is
admitted (`acquire`, on the driver thread): its adapter's slot if it holds one, else a free slot or
the least recently used one that no running sequence holds, which is then queued to be written
(`take_writes`: the engine copies them to the device before its next step, as it does page copies).
When every slot is held by running sequences of other adapters, the sequence waits. A sequence keeps
the Adapter object it was submitted with, so unregistering a name never strands one in flight.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from .adapter import Adapter


class AdapterSlots:
    def __init__(self, slots: int):
        self._registry: dict[str, Adapter] = {}
        self._lock = threading.Lock()  # the registry: the server registers while the driver acquires
        self._holder: list[Adapter | None] = [None] * slots
        self._pins = [0] * slots  # running sequences per slot
        self._recent: OrderedDict[int, None] = OrderedDict((s, None) for s in range(slots))  # LRU first
        self._writes: list[tuple[int, Adapter]] = []
        self.loads = 0  # adapters copied to the device (a miss of the device slots)

    # ------------------------------------------------------------ the registry (any thread)
    def register(self, adapter: Adapter) -> None:
        with self._lock:
            self._registry[adapter.name] = adapter

    def unregister(self, name: str) -> Adapter | None:
        with self._lock:
            return self._registry.pop(name, None)

    def get(self, name: str) -> Adapter | None:
        with self._lock:
            return self._registry.get(name)

    @property
    def names(self) -> list[str]:
        with self._lock:
            return list(self._registry)

    # ------------------------------------------------------------ device slots (the driver thread)
    def acquire(self, adapter: Adapter) -> int | None:
        """The slot `adapter` is in, now pinned by one more running sequence; None while every slot is
        held by running sequences of other adapters."""
        slot = next((s for s, held in enumerate(self._holder) if held is adapter), None)
        if slot is None:
            slot = next((s for s in self._recent if self._pins[s] == 0), None)
            if slot is None:
                return None
            self._holder[slot] = adapter
            self._writes.append((slot, adapter))
            self.loads += 1
        self._pins[slot] += 1
        self._recent.move_to_end(slot)
        return slot

    def can_take(self, adapter: Adapter) -> bool:
        """Whether `acquire(adapter)` would give a slot now."""
        return any(held is adapter for held in self._holder) or any(p == 0 for p in self._pins)

    def release(self, slot: int) -> None:
        self._pins[slot] -= 1

    def take_writes(self) -> list[tuple[int, Adapter]]:
        """(slot, adapter) copies to make before the next step (the latest per slot)."""
        latest = dict(self._writes)
        self._writes.clear()
        return sorted(latest.items())

    def resident(self) -> dict[str, int]:
        """Adapter name -> running sequences using it, for the adapters on the device now."""
        return {a.name: self._pins[s] for s, a in enumerate(self._holder) if a is not None}
