"""Disaggregated serving at the scheduler level (engine/disaggregated.py), on the hand-computable
mock engine (no JAX): prefill engines compute prompts only, decode engines decode only, every
prefix goes through a bounded transfer backlog, a full decode side makes it wait, nothing is lost."""

from __future__ import annotations

import threading
import time

import pytest

from mock_engine import TIMEOUT, MockEngine, drain, expected_tokens, make_request, tokens_of
from vsurge import oDriver, vDriver
from vsurge.kv.page_manager import HBMPageManager


@pytest.fixture
def started():
    drivers = []

    def start(driver):
        driver.start()
        drivers.append(driver)
        return driver

    yield start
    for d in drivers:
        d.stop(timeout=2)


def test_decode_engines_never_see_a_prompt_and_every_prefix_moves_once(started):
    prefill = [MockEngine(slots=3), MockEngine(slots=3)]
    decode = [MockEngine(slots=4, decode_delay=0.002), MockEngine(slots=4, decode_delay=0.002)]
    driver = started(vDriver(prefill_engines=prefill, decode_engines=decode))
    assert driver.disaggregated and driver.get_total_concurrent_requests() == 8
    # prompts of 1 to 150 tokens: the long ones take several prefill steps (64 prompt tokens a step)
    prompts = [[(i * 7 + j) % 23 + 1 for j in range(1 + (i * 37) % 150)] for i in range(12)]
    requests = [make_request(p, max_tokens=4 + i % 5) for i, p in enumerate(prompts)]
    for r in requests:
        driver.submit_request(r)
    for r, p in zip(requests, prompts):
        assert tokens_of(drain(r)) == expected_tokens(p, r.max_new_tokens)
    assert all(e.chunk_rows == 0 for e in decode)  # decode engines never ran a prompt chunk
    assert all(e.decode_rows == 0 for e in prefill)  # prefill engines never ran a decode row
    received = sorted(i for e in decode for i in e.inserted)
    assert received == sorted(r.request_id for r in requests)  # each prefix arrived once, at its sequence
    assert all(e.inserted for e in decode)  # both decode engines took some
    assert sum(e.calls["export"] for e in prefill) == len(requests)
    metrics = driver.metrics
    assert metrics.value("vsurge:kv_transfer_seconds_count") == len(requests)  # one hand-over per request
    assert metrics.value("vsurge:engine_steps_total", role="prefill") == sum(e.calls["step"] for e in prefill)
    assert metrics.value("vsurge:engine_steps_total", role="decode") == sum(e.calls["step"] for e in decode)
    assert metrics.value("vsurge:engine_steps_total", role="both") == 0
    assert metrics.value("vsurge:kv_transfer_queue_depth") == 0


def test_a_full_decode_side_backs_up_the_transfer_queue_and_loses_nothing(started):
    prefill = [MockEngine(slots=4)]
    decode = [MockEngine(slots=1, decode_delay=0.01)]  # one slot: everyone else must wait for it
    driver = started(oDriver(prefill_engines=prefill, decode_engines=decode, transfer_backlog=2))
    depths, done = [], threading.Event()

    def watch():
        while not done.is_set():
            depths.append((driver.handover.depth, len(driver.handover.backlogs[0])))
            time.sleep(0.002)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    requests = [make_request([i + 1, 2], max_tokens=6) for i in range(10)]
    for r in requests:
        driver.submit_request(r)
    results = [tokens_of(drain(r)) for r in requests]
    done.set()
    watcher.join()
    assert results == [expected_tokens([i + 1, 2], 6) for i in range(10)]
    assert decode[0].max_busy == 1
    # the backlog filled up and never went past its bound; the rest waited in the prefill engine
    assert max(b for _, b in depths) == 2 and max(d for d, _ in depths) <= 2 + 1  # + the arrival queue (1)
    assert prefill[0].calls["export"] == 10 and decode[0].calls["insert"] == 10


def test_cancelled_requests_are_freed_wherever_they_wait(started):
    prefill = [MockEngine(slots=4)]
    decode = [MockEngine(slots=1, decode_delay=0.02)]
    driver = started(vDriver(prefill_engines=prefill, decode_engines=decode, transfer_backlog=2))
    long = make_request([1], max_tokens=200)  # holds the only decode slot
    driver.submit_request(long)
    assert drain_first(long)
    queued = [make_request([i + 2], max_tokens=4) for i in range(6)]  # backlog, arrivals, prefill engine
    for r in queued:
        driver.submit_request(r)
    time.sleep(0.2)
    for r in queued[::2]:
        r.cancel()
    long.cancel()
    for i, r in enumerate(queued):
        items = drain(r)
        if i % 2:
            assert tokens_of(items) == expected_tokens([i + 2], 4)
        else:
            assert items[-1].finish_reason == "abort" and len(tokens_of(items)) <= 1
    assert drain(long)[-1].finish_reason == "abort"
    deadline = time.monotonic() + TIMEOUT
    while (driver._live or driver.handover.depth) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not driver._live and driver.handover.depth == 0
    assert all(r.scheduler.free_slots == r.engine.max_concurrent_decodes for r in driver.replicas)


def drain_first(request):
    item = request.channel.get(timeout=TIMEOUT)
    return item.token_ids


def test_sequences_preempted_on_the_decode_side_are_recomputed_by_a_prefill_engine(started):
    prefill = [MockEngine(slots=4)]
    decode = MockEngine(slots=4, decode_delay=0.005)
    decode.pool = HBMPageManager(num_pages=6, page_size=16, enable_prefix_caching=False)  # 96 tokens for 4 slots
    driver = started(vDriver(prefill_engines=prefill, decode_engines=[decode]))
    requests = [make_request([i + 1] * 10, max_tokens=40) for i in range(4)]  # 50 tokens each: too many for 6 pages
    for r in requests:
        driver.submit_request(r)
    for i, r in enumerate(requests):
        assert tokens_of(drain(r)) == expected_tokens([i + 1] * 10, 40)
    assert driver.replicas[1].scheduler.num_preemptions > 0
    assert decode.chunk_rows == 0  # recomputed on the prefill side, never here
    assert decode.calls["insert"] > len(requests)  # the preempted came back with new prefixes
    assert decode.pool.num_used_pages == 0


def test_engine_lists_are_checked():
    a, b = MockEngine(), MockEngine()
    with pytest.raises(ValueError, match="cannot be both a prefill and a decode engine"):
        vDriver(prefill_engines=[a, b], decode_engines=[b])
    with pytest.raises(ValueError, match="agree on max_length"):
        vDriver(prefill_engines=[MockEngine(max_length=256)], decode_engines=[MockEngine(max_length=512)])
    with pytest.raises(ValueError, match="either `engine` or"):
        oDriver(a, prefill_engines=[b])
    # interleaved_mode: every engine prefills and decodes in its own steps (today's behaviour)
    driver = vDriver(prefill_engines=[a], decode_engines=[b], interleaved_mode=True)
    assert not driver.disaggregated and [r.role for r in driver.replicas] == ["both", "both"]
    same = vDriver(prefill_engines=[a], decode_engines=[a])
    assert not same.disaggregated and len(same.replicas) == 1


def test_interleaved_mode_serves_on_every_engine(started):
    engines = [MockEngine(slots=2, decode_delay=0.002), MockEngine(slots=2, decode_delay=0.002)]
    driver = started(vDriver(prefill_engines=engines[:1], decode_engines=engines[1:], interleaved_mode=True))
    requests = [make_request([i, 3], max_tokens=6) for i in range(6)]
    for r in requests:
        driver.submit_request(r)
    for i, r in enumerate(requests):
        assert tokens_of(drain(r)) == expected_tokens([i, 3], 6)
    assert all(e.chunk_rows and e.decode_rows for e in engines)
    assert driver.metrics.value("vsurge:engine_steps_total", role="both") == sum(e.calls["step"] for e in engines)


def test_a_prefix_cache_hit_on_the_prefill_side_skips_the_prefill(started):
    prefill = MockEngine(slots=2)
    prefill.pool = HBMPageManager(num_pages=16, page_size=16)  # prefix caching on the prefill side
    decode = MockEngine(slots=2)
    driver = started(vDriver(prefill_engines=[prefill], decode_engines=[decode]))
    prompt = [(3 * j) % 11 + 1 for j in range(33)]  # two full pages, then the token that samples
    first = make_request(prompt, max_tokens=5)
    driver.submit_request(first)
    assert tokens_of(drain(first)) == expected_tokens(prompt, 5)
    steps = prefill.calls["step"]
    again = make_request(prompt, max_tokens=5)
    driver.submit_request(again)
    assert tokens_of(drain(again)) == expected_tokens(prompt, 5)
    assert prefill.calls["step"] == steps  # every token but the last was cached: no prefill step at all
    assert decode.calls["insert"] == 2 and prefill.pool.prefix_hits == 32


def test_a_decode_engine_out_of_pages_makes_the_transfer_wait(started):
    prefill = [MockEngine(slots=4)]
    decode = MockEngine(slots=4, decode_delay=0.005)
    decode.pool = HBMPageManager(num_pages=4, page_size=16, enable_prefix_caching=False)  # one 48-token sequence
    driver = started(vDriver(prefill_engines=prefill, decode_engines=[decode]))
    prompts = [[i + 1] * 40 for i in range(4)]  # 40 + 8 tokens: 3 pages each, free slots for all four
    requests = [make_request(p, max_tokens=8) for p in prompts]
    for r in requests:
        driver.submit_request(r)
    for p, r in zip(prompts, requests):
        assert tokens_of(drain(r)) == expected_tokens(p, 8)
    assert decode.max_busy == 1  # the pages, not the slots, held the others back
    assert driver.replicas[1].scheduler.num_preemptions == 0 and decode.calls["insert"] == 4
