"""The prefix cache's disk tier: pages kept in files under `--kv-cache-dir`, across restarts (no JAX).

One file per page, `<dir>/<fingerprint>/<key as 16 hex digits>.kvp`, holding

    b"VSURGEKV" | header length (u32 LE) | header (JSON) | payload (each array's raw bytes, in order)

The header repeats the fingerprint (model identity, weights sample, dtype, page size, KV
layout, LAYOUT_VERSION: engine/tier_mover.py `fingerprint`), the page's chained key, its parent
key and tokens, each array's shape and dtype, and a digest of the payload. A read checks all
of it against what was asked for, so a damaged, truncated or foreign file is ignored with a
warning, never trusted. Files are written by a background thread (to a temporary name, then
renamed, so a crash never leaves half a file under a real name); the directory is capped at
`capacity_bytes`, dropping the least recently used files (a hit refreshes a file's mtime,
so the order survives restarts).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import shutil
import struct
import threading
import zlib
from collections import OrderedDict
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

MAGIC = b"VSURGEKV"
LAYOUT_VERSION = 2  # bump when the page layout (kv/paged.py) or this file format changes
SUFFIX = ".kvp"
HEADER_SLACK = 64 << 10  # read buffers hold a page's arrays and a header of up to this many bytes
SPARE_BYTES = 64 << 20  # read buffers kept for reuse
ANY = object()  # `get(parent=ANY)`: a page under any parent key (a prefetch knows only the key)


class HostPage:
    """One page's K/V in host memory: per layer key and value arrays (as kv/paged.py lays out one page)."""

    def __init__(self, k: list, v: list, tokens: tuple = (), buffer: bytearray | None = None, parent: int | None = None):
        self.k, self.v, self.tokens, self.parent = k, v, tokens, parent
        self.buffer = buffer  # the file's bytes the arrays view (a DiskTier read buffer), if any

    def arrays(self) -> tuple[list, list]:
        return self.k, self.v


class DiskTier:
    def __init__(self, directory, fingerprint: str, capacity_bytes: int, spec: list[tuple[tuple, str]]):
        """spec: (shape, dtype) of each array of one page, keys of every layer then values."""
        self.fingerprint = fingerprint
        self.root = Path(directory) / fingerprint[:32]
        self.root.mkdir(parents=True, exist_ok=True)
        self.capacity_bytes = int(capacity_bytes)
        self.spec = [(tuple(shape), str(dtype)) for shape, dtype in spec]
        self._lock = threading.Lock()
        self._files: OrderedDict[int, int] = OrderedDict()  # key -> file size; first = dropped first
        self._queued: set[int] = set()
        self._size = 0
        self.pages_written = self.pages_read = self.rejected = 0
        # Files are read into buffers made (and touched) here and reused (`recycle`): fresh host memory
        # faulted in at ~0.3 GB/s on a VM here, 0.26 s of a 19-page restore after a restart.
        self._buffer_bytes = sum(_nbytes(s, d) for s, d in self.spec) + HEADER_SLACK
        self._spare = [_touched(self._buffer_bytes) for _ in range(max(1, SPARE_BYTES // self._buffer_bytes))]
        self._scan()
        self._queue: queue.Queue = queue.Queue()
        self._writer = threading.Thread(target=self._write_loop, name="vsurge-kv-disk", daemon=True)
        self._writer.start()
        atexit.register(self.close)

    # ------------------------------------------------------------ index
    def _scan(self) -> None:
        found = []
        for path in self.root.glob("*" + SUFFIX):
            try:
                key = int(path.stem, 16)
                stat = path.stat()
            except (ValueError, OSError):
                log.warning("KV disk cache: ignoring %s (not a page file of this cache)", path)
                continue
            found.append((stat.st_mtime, key, stat.st_size))
        for _, key, size in sorted(found):
            self._files[key] = size
            self._size += size
        self._trim()
        if self._files:
            log.info("KV disk cache %s: %d pages, %.1f MiB", self.root, len(self._files), self._size / 2**20)

    def _path(self, key: int) -> Path:
        return self.root / f"{key:016x}{SUFFIX}"

    def file_of(self, key: int) -> Path:
        return self._path(key)

    def adopt(self, key: int, source: Path) -> bool:
        """Put a page file kept elsewhere (a saved prompt cache) back under `key`; like any file here,
        it is checked when read. False when it could not be copied."""
        target = self._path(key)
        tmp = target.with_suffix(f".tmp{os.getpid()}a")
        try:
            shutil.copyfile(source, tmp)
            os.replace(tmp, target)
            size = target.stat().st_size
        except OSError as exc:
            log.warning("KV disk cache: could not restore %s: %s", source, exc)
            return False
        with self._lock:
            self._size += size - self._files.pop(key, 0)
            self._files[key] = size
            self._trim()
            return key in self._files

    def _trim(self) -> None:
        while self._size > self.capacity_bytes and self._files:
            key, size = self._files.popitem(last=False)
            self._size -= size
            try:
                self._path(key).unlink()
            except OSError:
                pass

    def has(self, key: int) -> bool:
        with self._lock:
            return key in self._files or key in self._queued

    def __len__(self) -> int:
        return len(self._files)

    @property
    def size_bytes(self) -> int:
        return self._size

    def recent(self, n: int) -> list[int]:
        """Keys of the `n` most recently written or read pages, most recent first."""
        with self._lock:
            keys = list(self._files)
        return keys[::-1][:n]

    # ------------------------------------------------------------ reading
    def get(self, key: int, parent: int | None, tokens: tuple[int, ...] | None, touch: bool = True) -> HostPage | None:
        """The page stored under `key`, if its file is whole and names exactly this prefix (tokens
        None: any tokens, a tail's; parent ANY: any parent, a prefetch's; the page carries the
        file's). `touch`: the read counts as a use (LRU order)."""
        with self._lock:
            if key not in self._files:
                return None
        path = self._path(key)
        try:
            page = self._read(path, key, parent, tokens)
        except (OSError, ValueError, KeyError, TypeError, struct.error) as exc:
            log.warning("KV disk cache: ignoring %s: %s", path, exc)
            self.rejected += 1
            with self._lock:
                size = self._files.pop(key, None)
                self._size -= size or 0
            return None
        self.pages_read += 1
        if not touch:
            return page
        with self._lock:
            if key in self._files:
                self._files.move_to_end(key)
        try:
            os.utime(path)
        except OSError:
            pass
        return page

    def recycle(self, page: HostPage) -> None:
        """`page` is copied where it goes and nothing else holds it: its buffer reads the next file."""
        if page.buffer is not None and len(page.buffer) == self._buffer_bytes:
            with self._lock:
                if len(self._spare) * self._buffer_bytes < SPARE_BYTES:
                    self._spare.append(page.buffer)
            page.buffer = None

    def _read(self, path: Path, key: int, parent, tokens) -> HostPage:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            with self._lock:
                buffer = self._spare.pop() if self._spare and size <= self._buffer_bytes else None
            if buffer is None:
                buffer = bytearray(max(size, self._buffer_bytes))
            try:
                page = self._parse(memoryview(buffer)[: f.readinto(memoryview(buffer)[:size])], key, parent, tokens)
            except Exception:
                self.recycle(HostPage([], [], buffer=buffer))
                raise
        page.buffer = buffer
        return page

    def _parse(self, data: memoryview, key: int, parent, tokens) -> HostPage:
        if bytes(data[: len(MAGIC)]) != MAGIC:
            raise ValueError("not a vsurge KV page file")
        (length,) = struct.unpack_from("<I", data, len(MAGIC))
        start = len(MAGIC) + 4
        if start + length > len(data):
            raise ValueError("truncated header")
        header = json.loads(bytes(data[start : start + length]))
        for name, want in (("version", LAYOUT_VERSION), ("fingerprint", self.fingerprint), ("key", key),
                           ("parent", header.get("parent") if parent is ANY else parent),
                           ("tokens", header.get("tokens") if tokens is None else list(tokens))):
            if header.get(name) != want or (name == "tokens" and not isinstance(want, list)):
                raise ValueError(f"its {name} differs from this cache's (another model, layout or prefix)")
        arrays = [(tuple(shape), dtype) for shape, dtype in header["arrays"]]
        if arrays != self.spec:
            raise ValueError(f"its arrays {arrays} are not this engine's pages {self.spec}")
        payload = data[start + length :]
        if len(payload) != sum(_nbytes(s, d) for s, d in arrays):
            raise ValueError(f"truncated: {len(payload)} payload bytes")
        if _digest(payload) != header["digest"]:
            raise ValueError("its payload does not match its digest (damaged)")
        out, offset = [], 0
        for shape, dtype in arrays:
            n = _nbytes(shape, dtype)
            # read-only views of the file's bytes (they only ever get copied into a device page)
            out.append(np.frombuffer(payload[offset : offset + n], dtype=_np_dtype(dtype)).reshape(shape))
            offset += n
        half = len(out) // 2
        return HostPage(out[:half], out[half:], tuple(header["tokens"]), parent=header["parent"])

    # ------------------------------------------------------------ writing (background)
    def put(self, entry, page) -> None:
        """Write `page` (anything with .arrays() -> (k list, v list)) under `entry`'s key, in the
        background; a tail entry replaces what its key holds (a later tail of the same parent)."""
        with self._lock:
            if not getattr(entry, "tail", False) and (entry.key in self._files or entry.key in self._queued):
                return
            self._queued.add(entry.key)
        self._queue.put((entry, page))

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._write(*item)
            except Exception:  # noqa: BLE001: a cache write must never take the engine down
                log.exception("KV disk cache: a page could not be written")
            finally:
                if item is not None:
                    with self._lock:
                        self._queued.discard(item[0].key)
                self._queue.task_done()

    def _write(self, entry, page) -> None:
        k, v = page.arrays()
        arrays = [np.ascontiguousarray(np.asarray(a)) for a in (*k, *v)]
        payload = b"".join(a.tobytes() for a in arrays)
        header = json.dumps({"version": LAYOUT_VERSION, "fingerprint": self.fingerprint, "key": entry.key,
                             "parent": entry.parent, "tokens": list(entry.tokens),
                             "arrays": [[list(a.shape), _dtype_name(a.dtype)] for a in arrays],
                             "digest": _digest(payload)}).encode()
        path = self._path(entry.key)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        with open(tmp, "wb") as f:
            f.write(MAGIC + struct.pack("<I", len(header)) + header + payload)
        os.replace(tmp, path)
        size = path.stat().st_size
        with self._lock:
            self._size += size - self._files.pop(entry.key, 0)
            self._files[entry.key] = size
            self._trim()
        self.pages_written += 1

    def flush(self) -> None:
        """Wait until every queued page is written."""
        self._queue.join()

    def close(self) -> None:
        if self._writer.is_alive():
            self._queue.put(None)
            self._writer.join(timeout=60)


def _touched(nbytes: int) -> bytearray:
    buffer = bytearray(nbytes)
    np.frombuffer(buffer, np.uint8).fill(1)  # fault every page in now, not on the first read
    return buffer


def _digest(payload) -> str:
    """A check of the payload against damage (CRC-32: 4x blake2b's speed; the header's fingerprint,
    key, parent and tokens name what the page is)."""
    return f"crc32:{zlib.crc32(payload):08x}"


def _dtype_name(dtype) -> str:
    return str(np.dtype(dtype)) if np.dtype(dtype).kind != "V" else str(dtype)


def _np_dtype(name: str):
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes  # bfloat16 and friends (a JAX dependency)

        return np.dtype(getattr(ml_dtypes, name))


def _nbytes(shape, dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * _np_dtype(dtype).itemsize
