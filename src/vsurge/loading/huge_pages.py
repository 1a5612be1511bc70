"""Back a loaded model's large CPU arrays with 2 MiB pages (Linux transparent huge pages).

A decode step streams every weight once. With 4 KiB pages that is a TLB miss every 64 cache lines,
the hardware prefetchers stop at each page's end, and in a virtual machine every miss walks two
page tables. Most Linux installs leave transparent huge pages to `madvise`, so nothing gets them
unless it asks: madvise(MADV_HUGEPAGE) marks an array's 2 MiB-aligned interior, and MADV_COLLAPSE
(Linux 6.1+) moves it onto huge pages now rather than whenever khugepaged gets there (minutes).
`python benchmarks/kernel_rows.py --compare-huge-pages` measures what it gives the block kernel.

The kernel copies each array onto its new pages (the ~1B Q4_K_M's 482 MiB: ~1.4 s of one core), so a
loaded model's arrays move on a background thread (`in_background`), not on the way to readiness; the
values never change, so the model serves meanwhile. VSURGE_HUGE_PAGES=0 turns it off. Nothing changes
where the kernel does not support it: the calls fail and the arrays stay on the pages they have.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import sys
import threading

import jax

log = logging.getLogger(__name__)

HUGE_PAGE = 1 << 21
MIN_BYTES = 4 << 20  # smaller arrays hold at most one whole huge page: not worth a system call
MADV_HUGEPAGE = 14
MADV_COLLAPSE = 25


@functools.cache
def _madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    fn = libc.madvise
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def enabled() -> bool:
    return os.environ.get("VSURGE_HUGE_PAGES", "1") != "0" and _madvise() is not None


def advise_range(address: int, nbytes: int) -> int:
    """Ask for huge pages under [address, address + nbytes): the bytes now on them (0 where the
    range holds no whole huge page or the kernel refuses)."""
    madvise = _madvise()
    start = (address + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1)
    end = (address + nbytes) & ~(HUGE_PAGE - 1)
    if madvise is None or end <= start:
        return 0
    if madvise(start, end - start, MADV_HUGEPAGE) != 0:
        return 0
    if madvise(start, end - start, MADV_COLLAPSE) != 0:
        return 0  # (marked: khugepaged may still collapse it later)
    return end - start


def _cpu_buffers(array: jax.Array):
    """(address, bytes) of each CPU-resident shard of `array`."""
    for shard in array.addressable_shards:
        if shard.device.platform != "cpu":
            continue
        try:
            yield shard.data.unsafe_buffer_pointer(), shard.data.nbytes
        except Exception:  # noqa: BLE001 (a buffer that exposes no pointer: leave it)
            continue


def use_huge_pages(tree) -> int:
    """Put the large CPU arrays among `tree`'s leaves (a model's state) on huge pages. -> bytes moved."""
    if not enabled():
        return 0
    moved = 0
    for leaf in jax.tree_util.tree_leaves(tree):
        if isinstance(leaf, jax.Array) and leaf.nbytes >= MIN_BYTES:
            for address, nbytes in _cpu_buffers(leaf):
                moved += advise_range(address, nbytes)
    if moved:
        log.info("%.1f MiB of weights on 2 MiB pages", moved / 2**20)
    return moved


def in_background(tree) -> threading.Thread | None:
    """use_huge_pages(tree) on a daemon thread (ctypes drops the GIL in madvise); the thread holds the
    leaves until it is done, so no array is freed under it. -> the thread (None when turned off)."""
    if not enabled():
        return None
    leaves = [leaf for leaf in jax.tree_util.tree_leaves(tree)
              if isinstance(leaf, jax.Array) and leaf.nbytes >= MIN_BYTES]
    thread = threading.Thread(target=lambda: use_huge_pages(leaves), name="vsurge-huge-pages", daemon=True)
    thread.start()
    return thread
