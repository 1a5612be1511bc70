"""The engine's side of the prefix cache's lower tiers: copies between the device pool and host/disk.

The page manager (kv/page_manager.py) queues what must move; `TierMover.sync` runs it before
each step (and the driver after each step, so committed pages reach the disk without waiting
for the next request):

    saves + persists   the pages' K/V gathered off the device in one call per bucket of pages
                       (engine/transfer.py's export program), copied to host asynchronously
                       (`copy_to_host_async`) and made numpy one sync later, off the step's path
    copies             tails copied on write from one device page into another (kv/page_manager.py)
    loads              pages found in the host or disk tier, written into their new device pages
                       (the import program), after every gather of this sync

`TierMover.prefetch` (at start-up, before readiness) reads the disk tier's most recently used
pages into free device pages as cached ones, so a restarted server's first hit on them costs what
a warm one does (benchmarks/prefix_tiers.py, restart row).

Gathers run before copies, copies before loads, and all before the step that reads or overwrites
the pages, so a page evicted and reused in one scheduling pass is copied out with its old K/V.
"""

from __future__ import annotations

import hashlib
import threading

import jax
import numpy as np

from ..kv.disk_tier import ANY, LAYOUT_VERSION, DiskTier
from ..kv.paged import pool_dtype, pool_page_bytes
from ..kv.recurrent import init_states, state_dtype, stored_row_bytes
from ..kv.tiers import HostTier, TierEntry, page_key, tail_key
from .program_kinds import EXPORT, IMPORT, STATE_EXPORT, STATE_IMPORT
from .transfer import PrefixPages


class PageBatch:
    """K/V of n pages gathered in one call: per layer (n, ...) arrays; device arrays until `host()`."""

    def __init__(self, pages: PrefixPages):
        self.k, self.v = list(pages.k), list(pages.v)
        self._on_host = False
        self._lock = threading.Lock()
        for array in (*self.k, *self.v):
            array.copy_to_host_async()

    def host(self) -> "PageBatch":
        with self._lock:
            if not self._on_host:
                self.k = [np.asarray(a) for a in self.k]
                self.v = [np.asarray(a) for a in self.v]
                self._on_host = True
        return self


class PageRef:
    """Page `index` of a PageBatch: a tier entry's payload."""

    def __init__(self, batch: PageBatch, index: int):
        self.batch, self.index = batch, index

    def arrays(self) -> tuple[list, list]:
        batch = self.batch.host()
        return [k[self.index] for k in batch.k], [v[self.index] for v in batch.v]


def fingerprint(model, config) -> str:
    """What a disk tier's pages depend on: the model (its config, a sample of every weight and its block
    kernel's activation passes), the KV storage dtype (an int8 pool never reads float pages, nor the reverse) and layout, the page
    size, the attention backend (whose page layout the pages keep: kv/backends) and LAYOUT_VERSION. Another
    model or layout never matches."""
    from flax import nnx

    from ..kv.backends import resolve

    h = hashlib.blake2b(digest_size=16)
    # (the block kernel's activation passes round activations differently: pages differ slightly)
    h.update(repr((LAYOUT_VERSION, repr(model.config), str(model.dtype), config.page_size,
                   tuple(model.config.kv_layout), str(pool_dtype(model, config)),
                   getattr(model, "activation_passes", None), resolve(config.attention_backend))).encode())
    for path, leaf in jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.Param)):
        if not hasattr(leaf, "shape") or not leaf.size:
            continue
        row = leaf[(0,) * (leaf.ndim - 1)] if leaf.ndim > 1 else leaf
        h.update(jax.tree_util.keystr(path).encode() + repr((leaf.shape, str(leaf.dtype))).encode())
        h.update(np.asarray(jax.device_get(row[:64])).tobytes())
    return h.hexdigest()


# A hybrid model's share of the host tier and the disk tier's cap that its state snapshots take (the
# device's is a quarter of the KV memory too: engine/pools.py snapshot_rows); KV pages take the rest.
STATE_SHARE = 4


def _has_tiers(config) -> bool:
    return config.enable_prefix_caching and bool(config.kv_host_cache_bytes or config.kv_cache_dir)


def make_host_tier(model, config) -> HostTier | None:
    """The host (and disk) tier of an engine's page pool, from its config; None when it has neither."""
    if not _has_tiers(config):
        return None
    dtype, per_page = pool_dtype(model, config), pool_page_bytes(model, config)
    share = 1 - 1 / STATE_SHARE if model.config.state_layout else 1  # (the snapshots' tiers take the rest)
    disk = None
    if config.kv_cache_dir:
        from ..kv.backends import get, resolve

        # one page of every layer's key and value pools, in the layout of the pool's backend (kv/backends)
        k, v = jax.eval_shape(lambda: get(resolve(config.attention_backend)).init_pools(
            model.config.kv_layout, 1, config.page_size, dtype))
        spec = [(a.shape[1:], str(np.dtype(dtype))) for a in (*k, *v)]
        disk = DiskTier(config.kv_cache_dir, fingerprint(model, config), int(config.kv_disk_cache_bytes * share), spec)
    return HostTier(int(config.kv_host_cache_bytes * share // max(1, per_page)), disk)


def make_state_tier(model, config) -> HostTier | None:
    """The host (and disk) tier of a hybrid model's state snapshots (kv/state_snapshots.py): a
    1/STATE_SHARE part of each tier's budget, one entry per snapshot, files in a directory of their
    own (their fingerprint says "states"); None without tiers or recurrent layers."""
    row, dtype = stored_row_bytes(model, config.state_dtype), state_dtype(config.state_dtype, model)
    if not row or not _has_tiers(config):
        return None
    disk = None
    if config.kv_cache_dir:
        spec = [(leaf.shape[1:], str(leaf.dtype)) for leaf in jax.tree.leaves(
            jax.eval_shape(lambda: init_states(model.config.state_layout, 1, dtype)))]
        name = hashlib.blake2b(f"{fingerprint(model, config)}:states:{dtype}".encode(), digest_size=16).hexdigest()
        disk = DiskTier(config.kv_cache_dir, name, config.kv_disk_cache_bytes // STATE_SHARE, spec)
    return HostTier(int(config.kv_host_cache_bytes // STATE_SHARE // row), disk)


class StateRow:
    """One snapshot row's states (every recurrent layer's parts, in jax.tree.leaves order), copied off
    the device: a tier entry's payload; device arrays until read."""

    def __init__(self, leaves: list):
        self.leaves = list(leaves)
        self._lock = threading.Lock()  # (the disk tier's writer thread reads it too)
        for array in self.leaves:
            array.copy_to_host_async()

    def host(self) -> "StateRow":
        with self._lock:
            self.leaves = [np.asarray(a) for a in self.leaves]
        return self

    def arrays(self) -> tuple[list, list]:  # (the disk tier writes both lists' arrays, in order)
        return self.host().leaves, []


STAGING_BYTES = 64 << 20  # host buffers that pages written back are stacked in, allocated once


class TierMover:
    """Runs the copies an engine's page pool queued (see the module docstring)."""

    def __init__(self, engine):
        self.engine = engine
        self._fresh: list[PageBatch] = []  # gathered last sync: made numpy at the next one
        # Pages copied back are stacked into buffers made (and touched) once, here: fresh host memory
        # faulted in at ~0.3-2 GB/s on a VM here, 0.3 s of a 19-page restore from disk.
        fits = max(1, STAGING_BYTES // max(1, engine.page_nbytes))
        self._load_pages = max([n for n in engine.config.transfer_pages if n <= fits] or [1])
        spec = engine._prefix_spec(self._load_pages)
        self._staging = jax.tree.map(lambda a: _aligned(a.shape, a.dtype), spec)

    def sync(self, state):
        engine, pool = self.engine, self.engine.pool
        for batch in self._fresh:
            batch.host()
        self._fresh = []
        if not pool.has_moves:
            return state
        copies = pool.take_copies()
        disk = pool.host.disk
        reads = [(p, e, False) for p, e in pool.take_saves()] + [(p, e, True) for p, e in pool.take_persists()]
        for part in _parts(reads, engine.config.transfer_pages[-1]):
            bucket = engine._bucket(len(part))
            ids = np.zeros(bucket, np.int32)  # padding gathers page 0: never used
            ids[: len(part)] = [page for page, _, _ in part]
            batch = PageBatch(engine._program(EXPORT.key(bucket))(state, ids))
            self._fresh.append(batch)
            for i, (_, entry, persist) in enumerate(part):
                if persist:
                    disk.put(entry, PageRef(batch, i))
                else:
                    entry.payload = PageRef(batch, i)
                    if disk is not None:
                        disk.put(entry, entry.payload)
        snaps = pool.snapshots
        if snaps is not None:
            self._gather_states(state, snaps)
        state = engine.copy_pages(state, copies)
        for part in _parts(pool.take_loads(), self._load_pages):
            bucket = engine._bucket(len(part))
            ids = np.full(bucket, pool.num_pages, np.int32)  # padding: dropped writes
            ids[: len(part)] = [page for page, _ in part]
            pages = [entry.payload.arrays() for _, entry in part]
            k = [_stack([p[0][l] for p in pages], out[:bucket]) for l, out in enumerate(self._staging.k)]
            v = [_stack([p[1][l] for p in pages], out[:bucket]) for l, out in enumerate(self._staging.v)]
            # the staging buffers are filled again by the next part: wait until this one is read
            state = jax.block_until_ready(engine._program(IMPORT.key(bucket))(state, PrefixPages(k, v), ids))
            for _, entry in part:
                pool.host.release(entry)
        if snaps is not None:
            for row, entry in snaps.take_loads():
                k, v = entry.payload.arrays()
                # (a disk read's buffer is reused once released: the copy must be done by then)
                state = jax.block_until_ready(engine._program(STATE_IMPORT.key())(state, [*k, *v], np.int32(row)))
                snaps.host.release(entry)
        return state

    def _gather_states(self, state, snaps) -> None:
        """Snapshot rows evicted (to the host tier) or just written (to the disk tier) copied off the
        device, before any step overwrites them."""
        disk = snaps.host.disk
        for row, entry, persist in ([(r, e, False) for r, e in snaps.take_saves()]
                                    + [(r, e, True) for r, e in snaps.take_persists()]):
            payload = StateRow(self.engine._program(STATE_EXPORT.key())(state, np.int32(row)))
            self._fresh.append(payload)
            if not persist:
                entry.payload = payload
            if disk is not None:
                disk.put(entry, payload)

    def prefetch(self, state, budget_bytes: int):
        """Read up to `budget_bytes` of the disk tier's most recently used pages (at most half the
        free pages) into the device pool as cached pages, in parts that fit the read and staging
        buffers. -> (state, pages prefetched)."""
        engine, pool = self.engine, self.engine.pool
        disk = pool.host.disk if pool.host is not None else None
        if disk is None or budget_bytes <= 0 or not pool.enable_prefix_caching:
            return state, 0
        keys = disk.recent(min(pool.num_free_pages // 2, budget_bytes // max(1, engine.page_nbytes)))
        taken = 0
        for part in _parts(keys, self._load_pages):
            found = [entry for entry in (_disk_entry(disk, key) for key in part) if entry is not None]
            kept = pool.prefetch(found)
            for entry in set(found) - set(kept):  # already cached, or no room: its read buffer is reused
                pool.host.release(entry)
            taken += len(kept)
            state = self.sync(state)
        return state, taken


def _disk_entry(disk: DiskTier, key: int) -> TierEntry | None:
    """The disk tier's page under `key` whatever prefix it names, if its key is the one that prefix
    gives (a page's chained key, or its parent's tail key); None when unreadable or inconsistent."""
    page = disk.get(key, ANY, None, touch=False)
    if page is None:
        return None
    tail = key == tail_key(page.parent)
    if not tail and key != page_key(page.parent, page.tokens):
        disk.recycle(page)
        return None
    return TierEntry(key, page.parent, page.tokens, page, from_disk=True, tail=tail)


def _parts(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def _stack(arrays: list, out: np.ndarray) -> np.ndarray:
    """`out` (bucket, ...) with the pages first (what follows is padding: its writes are dropped)."""
    for i, a in enumerate(arrays):
        out[i] = a
    return out


def _aligned(shape, dtype, alignment: int = 64) -> np.ndarray:
    """A touched host array at a 64-byte boundary: XLA:CPU reads such an input where it lies (no copy)."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.ones(nbytes + alignment, np.uint8)
    start = -raw.ctypes.data % alignment
    return raw[start : start + nbytes].view(dtype).reshape(shape)
