"""The prefix cache's tiers on a real (tiny, random-weight) model: in-flight sharing, the host tier
and swap under 3x KV oversubscription, pages written to the disk tier. Greedy outputs must equal
those of an engine without any of them. Disk files: damaged, truncated, foreign are ignored."""

from __future__ import annotations

import asyncio
import logging

import jax.numpy as jnp
import numpy as np
import pytest

import vsurge
from vsurge import SamplingParams, vSurge
from vsurge.kv.disk_tier import DiskTier, HostPage
from vsurge.kv.tiers import TierEntry, page_key, tail_key

PAGE = 32
PAGES = 60  # the shared-preamble load needs ~52; the distinct load ~190 (3x)
PREAMBLE = "The assistant answers questions about the weather, tides and stars with care. " * 40


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, default_processor_dir):
    from tiny_models import write_tiny_model

    folder = tmp_path_factory.mktemp("tiny_llama_tiers")
    write_tiny_model("llama", folder, default_processor_dir, max_position_embeddings=1024)
    return vsurge.load(folder, dtype=jnp.float32, progress=False)


def engine(tiny, num_pages, **settings):
    model, processor = tiny
    s = vSurge.create_odriver(model, processor, max_concurrent_decodes=16, max_length=768, page_size=PAGE,
                              num_pages=num_pages, seed=1, prefill_lengths=[256], row_buckets=(16,), **settings)
    s.compile()
    s.start()
    return s


def generate(surge, prompts, max_tokens=8):
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return [r.token_ids for r in asyncio.run(surge.generate(prompts, params))]


def shared_prompts():
    return [PREAMBLE + f"Question {i}: what is {i} plus {i}?" for i in range(16)]


def distinct_prompts():  # 16 x ~12 pages with their 320 new tokens: 3x the pool
    return [f"Story {i}: " + " ".join(f"w{i}x{j}" for j in range(8)) for i in range(16)]


@pytest.fixture(scope="module")
def reference(tiny):
    """Greedy tokens of an engine with no tier and no waiting for prefixes in flight (recompute preemption)."""
    s = engine(tiny, PAGES, prefix_wait_steps=0)
    out = generate(s, shared_prompts()), generate(s, distinct_prompts(), 320)
    s.stop(timeout=5)
    return out


def tier_value(surge, name, **labels):
    return surge.driver.metrics.value(name, **labels)


def test_tiers_keep_outputs_share_in_flight_and_swap(tiny, reference, tmp_path):
    shared_ref, distinct_ref = reference
    preamble = len(tiny[1].encode(PREAMBLE))
    assert preamble > 500
    s = engine(tiny, PAGES, kv_host_cache_bytes=64 << 20, kv_cache_dir=str(tmp_path))
    try:
        # 16 requests arriving together: the preamble is computed once, the other 15 find it
        assert generate(s, shared_prompts()) == shared_ref
        hits = tier_value(s, "vsurge:prefix_cache_hits_total")
        assert hits >= 15 * (preamble // PAGE - 1) * PAGE, (hits, preamble)
        assert s.driver.replicas[0].scheduler.num_prefix_waits > 0
        # 3x oversubscribed: preempted sequences swap their pages out and find them on resuming
        assert generate(s, distinct_prompts(), 320) == distinct_ref
        scheduler, pool = s.driver.replicas[0].scheduler, s.driver.engine.pool
        assert scheduler.num_preemptions > 0 and pool.swap_outs > 0 and scheduler.num_swap_ins > 0
        assert pool.tier_hits["host"] > 0
        asyncio.run(asyncio.sleep(0.1))
        generate(s, ["x"], 1)  # a step reports the counters to the metrics
        assert tier_value(s, "vsurge:kv_swaps_total", direction="in") > 0
        assert tier_value(s, "vsurge:kv_tier_bytes_total", direction="to_host") > 0
        pool.check()
        pool.host.disk.flush()
        assert len(pool.host.disk) > preamble // PAGE  # (read back after a restart: test_kv_tiers_server.py)
    finally:
        s.stop(timeout=5)


def test_tails_copied_on_write_keep_outputs(tiny, tmp_path):
    """Below a page: the same prompt again, the next turn of a conversation, a prompt diverging inside
    a page, each after the one before finished, start from a copy of the cached page's tokens (and
    after a restart from the disk tier's tail): the greedy tokens of an engine without tails, fewer
    prompt tokens computed."""
    model, processor = tiny
    first = PREAMBLE[:300]
    prompts = [first, first, first + " And the tides?", PREAMBLE[:200] + " Now the stars, please."]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)

    def one_by_one(surge):
        return [asyncio.run(surge.generate([p], params))[0].token_ids for p in prompts]

    off = engine(tiny, PAGES)
    off.driver.engine.pool.tail_hits = False
    try:
        expected = one_by_one(off)
        whole_pages_only = off.driver.engine.pool.tier_hits["device"]
    finally:
        off.stop(timeout=5)
    s = engine(tiny, PAGES, kv_cache_dir=str(tmp_path))
    try:
        assert one_by_one(s) == expected
        pool = s.driver.engine.pool
        tokens = len(processor.encode(first))
        # the resent prompt: all but its last token (its pages and the tail of the first run)
        assert pool.tier_hits["device"] >= whole_pages_only + (tokens - 1) % PAGE
        pool.check()
        pool.host.disk.flush()
    finally:
        s.stop(timeout=5)
    # a restart: pages and tails read from disk when the prompt asks (no prefetch: the next test)
    again = engine(tiny, PAGES, kv_cache_dir=str(tmp_path), kv_disk_prefetch_bytes=0)
    try:
        assert asyncio.run(again.generate([prompts[2]], params))[0].token_ids == expected[2]
        assert again.driver.engine.pool.tier_hits["disk"] > len(processor.encode(prompts[2])) // PAGE * PAGE
    finally:
        again.stop(timeout=5)


def test_a_restart_prefetches_the_most_recent_pages_into_the_pool(tiny, tmp_path, caplog):
    """At start-up the disk tier's most recent pages (within the budget) are read into free pages
    before readiness: the prompt sent again hits them in the device pool (no disk read on its path,
    counted as disk hits) with the same greedy tokens; a damaged file is skipped with a warning."""
    prompt, other = PREAMBLE[:700], "A different question about comets, asked once. " * 12
    s = engine(tiny, PAGES, kv_cache_dir=str(tmp_path))
    try:
        generate(s, [other])
        s.driver.engine.pool.host.disk.flush()
        others = set(tmp_path.rglob("*.kvp"))
        expected = generate(s, [prompt])
        s.driver.engine.pool.host.disk.flush()
    finally:
        s.stop(timeout=5)
    tokens = len(tiny[1].encode(prompt))
    # one of the other prompt's pages (not the tail under no parent: the warm-up writes that one again)
    damaged = sorted(p for p in others if p.name != f"{tail_key(None):016x}.kvp")[0]
    damaged.write_bytes(damaged.read_bytes()[:-7] + b"garbage")
    with caplog.at_level(logging.WARNING, logger="vsurge.kv.disk_tier"):
        again = engine(tiny, PAGES, kv_cache_dir=str(tmp_path))
    try:
        pool = again.driver.engine.pool
        assert "ignoring" in caplog.text and damaged.name in caplog.text
        assert not pool.host.disk.has(int(damaged.stem, 16)) and pool.host.disk.rejected == 1
        assert pool.pages_prefetched >= (tokens - 1) // PAGE and pool.num_cached_pages >= pool.pages_prefetched
        assert pool.num_free_pages == PAGES  # cached pages: still free for anyone who needs them
        read = pool.host.disk.pages_read
        assert generate(again, [prompt]) == expected
        prefetched = pool.pages_prefetched
        assert pool.host.disk.pages_read == read  # its pages were in the pool already
        assert pool.tier_hits["disk"] >= (tokens - 1) // PAGE * PAGE
        pool.check()
    finally:
        again.stop(timeout=5)
    page_bytes = again.driver.engine.page_nbytes
    small = engine(tiny, PAGES, kv_cache_dir=str(tmp_path), kv_disk_prefetch_bytes=4 * page_bytes)
    try:  # the budget's 4 most recent files (some may be cached already: the warm-up's own tail)
        assert 1 <= small.driver.engine.pool.pages_prefetched <= 4 < prefetched
    finally:
        small.stop(timeout=5)


# ---------------------------------------------------------------- disk files (numpy only)
SPEC = [((2, 4, 4), "float32"), ((2, 4, 4), "float32")]


def _page(seed):
    rng = np.random.default_rng(seed)
    return HostPage([rng.standard_normal((2, 4, 4), np.float32)], [rng.standard_normal((2, 4, 4), np.float32)])


def _written(folder, fingerprint="model-a"):
    disk = DiskTier(folder, fingerprint, 1 << 20, SPEC)
    tokens = (1, 2, 3, 4)
    entry = TierEntry(page_key(None, tokens), None, tokens)
    disk.put(entry, _page(0))
    disk.flush()
    return disk, entry


def test_disk_tier_reads_back_what_it_wrote(tmp_path):
    disk, entry = _written(tmp_path)
    page = DiskTier(tmp_path, "model-a", 1 << 20, SPEC).get(entry.key, None, entry.tokens)  # a restart
    assert np.array_equal(page.k[0], _page(0).k[0]) and np.array_equal(page.v[0], _page(0).v[0])
    assert disk.get(entry.key, None, (1, 2, 3, 5)) is None  # another prefix under the same key: never


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage"])
def test_damaged_disk_pages_are_ignored_with_a_warning(tmp_path, caplog, damage):
    disk, entry = _written(tmp_path)
    path = disk._path(entry.key)
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[-3] ^= 0xFF
    elif damage == "truncate":
        data = data[: len(data) - 10]
    else:
        data = bytearray(b"not a page at all")
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="vsurge.kv.disk_tier"):
        assert DiskTier(tmp_path, "model-a", 1 << 20, SPEC).get(entry.key, None, entry.tokens) is None
    assert "ignoring" in caplog.text


def test_a_foreign_models_pages_are_never_read(tmp_path, caplog):
    disk, entry = _written(tmp_path, "model-a")
    other = DiskTier(tmp_path, "model-b", 1 << 20, SPEC)
    assert other.get(entry.key, None, entry.tokens) is None  # its own directory: not even seen
    copied = other._path(entry.key)
    copied.write_bytes(disk._path(entry.key).read_bytes())  # a file moved across models by hand
    other = DiskTier(tmp_path, "model-b", 1 << 20, SPEC)
    with caplog.at_level(logging.WARNING, logger="vsurge.kv.disk_tier"):
        assert other.get(entry.key, None, entry.tokens) is None
    assert "fingerprint differs" in caplog.text
    wrong_shape = DiskTier(tmp_path, "model-a", 1 << 20, [((2, 4, 8), "float32")] * 2)
    assert wrong_shape.get(entry.key, None, entry.tokens) is None


def test_disk_tier_keeps_to_its_size_cap_dropping_the_least_recently_used(tmp_path):
    disk, first = _written(tmp_path)
    size = disk.size_bytes
    capped = DiskTier(tmp_path, "model-a", int(size * 2.5), SPEC)
    entries = [TierEntry(page_key(None, (9, i)), None, (9, i)) for i in range(3)]
    capped.get(first.key, None, first.tokens)  # used: newer than nothing yet written
    for i, entry in enumerate(entries):
        capped.put(entry, _page(i + 1))
        capped.flush()
    assert len(capped) == 2 and capped.size_bytes <= int(size * 2.5)
    assert not capped.has(first.key) and capped.has(entries[-1].key)
