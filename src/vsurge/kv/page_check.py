"""HBMPageManager's invariants, checked from outside: every page free, evictable or referenced
(exactly one), refcounts equal to the tables holding each page, the key map, children index,
in-flight keys, pending loads and tail copies consistent with the registered pages.

Tests call `manager.check()` after each operation; the engine never does (it is O(pages)).
"""

from __future__ import annotations


def check_pages(pm) -> None:
    """Raise AssertionError if `pm`'s (an HBMPageManager's) bookkeeping is inconsistent."""
    free, evictable = list(pm._free), list(pm._evictable)
    assert len(set(free)) == len(free), f"duplicate pages on the free list: {free}"
    counts = [0] * pm._num_pages
    for seq in pm._tables.values():
        assert len(set(seq.pages)) == len(seq.pages), f"a table holds a page twice: {seq.pages}"
        assert seq.num_committed <= len(seq.pages), "a table committed past its pages"
        for page in seq.pages:
            counts[page] += 1
    for page in range(pm._num_pages):
        assert pm._refcount[page] == counts[page], (
            f"page {page}: refcount {pm._refcount[page]} but in {counts[page]} tables"
        )
    referenced = {p for p in range(pm._num_pages) if counts[p] > 0}
    states = [set(free), set(evictable), referenced]
    assert sum(map(len, states)) == pm._num_pages and set().union(*states) == set(
        range(pm._num_pages)
    ), f"pages not partitioned: free={free} evictable={evictable} referenced={sorted(referenced)}"
    assert len(pm._key_to_page) == len(pm._entries), "key map and registered pages differ in size"
    for page, entry in pm._entries.items():
        assert pm._key_to_page.get(entry.key) == page, f"key of page {page} maps elsewhere"
    for page in free:
        assert page not in pm._entries, f"free page {page} is still registered"
    for page in evictable:
        assert page in pm._entries, f"evictable page {page} is not registered"
    pending: dict[int, int] = {}
    for seq in pm._tables.values():
        for key in seq.pending:
            pending[key] = pending.get(key, 0) + 1
    assert pending == pm._inflight, f"in-flight keys {pm._inflight} but tables announce {pending}"
    for page in pm._loads:
        assert page in pm._entries or counts[page], f"page {page} waits for a load but is neither registered nor held"
    assert pm._prefetched <= set(pm._entries), "a prefetched page is no longer registered"
    for dst, src in pm._copies.items():
        assert counts[dst] and dst not in pm._entries, f"tail copy {src} -> {dst} into a page not privately held"
    children = {}
    for page, entry in pm._entries.items():
        children.setdefault((entry.parent, entry.tokens[0]), set()).add(page)
    assert children == pm._children, "the children index differs from the registered pages"
    if pm.host is not None:
        pm.host.check()
