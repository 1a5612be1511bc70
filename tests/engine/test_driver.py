"""The driver loop (schedule -> step -> postprocess on one thread per engine) over a hand-computable mock engine."""

from __future__ import annotations

import threading
import time

import pytest

from mock_engine import TIMEOUT, MockEngine, drain, expected_tokens, make_request, tokens_of
from vsurge import vDriver
from vsurge.engine import DriverNotReadyError, QueueFullError
from vsurge.sampling.params import SamplingParams


@pytest.fixture
def driver_factory():
    drivers = []

    def make(engine=None, **kwargs):
        driver = vDriver(engine or MockEngine(), **kwargs)
        driver.start()
        drivers.append(driver)
        return driver

    yield make
    for d in drivers:
        d.stop(timeout=1)


def test_tokens_arrive_in_order_and_complete(driver_factory):
    driver = driver_factory()
    requests = [make_request([i, i + 1], max_tokens=3 + i) for i in range(6)]
    for r in requests:
        driver.submit_request(r)
    for i, r in enumerate(requests):
        items = drain(r)
        assert tokens_of(items) == expected_tokens([i, i + 1], 3 + i)
        assert [s.num_generated_tokens for s in items] == list(range(1, 4 + i))
        assert items[-1].finish_reason == "length"
        assert items[-1].accumulated_text == "".join(s.text for s in items)


def test_slots_are_reused_and_never_oversubscribed(driver_factory):
    engine = MockEngine(slots=3, decode_delay=0.005)
    driver = driver_factory(engine)
    requests = [make_request([i], max_tokens=4) for i in range(10)]
    for r in requests:
        driver.submit_request(r)
    for i, r in enumerate(requests):
        assert tokens_of(drain(r)) == expected_tokens([i], 4)
    assert engine.max_busy == 3 and engine.slots_used == {0, 1, 2}
    deadline = time.time() + 5
    while driver.num_used_slots and time.time() < deadline:
        time.sleep(0.01)
    assert driver.num_used_slots == 0


def test_eos_and_stop_string(driver_factory):
    driver = driver_factory()
    first = 10 + sum([1, 2]) % 7
    r1 = make_request([1, 2], max_tokens=50, eos=[first + 3])
    r2 = make_request([1, 2], max_tokens=50, stop=[chr(97 + (first + 2) % 26)])
    driver.submit_request(r1)
    driver.submit_request(r2)
    a, b = drain(r1), drain(r2)
    assert tokens_of(a) == [first, first + 1, first + 2, first + 3] and a[-1].finish_reason == "stop"
    assert b[-1].finish_reason == "stop" and b[-1].accumulated_text == "".join(
        chr(97 + t % 26) for t in (first, first + 1))


def test_cancellation_frees_the_slot_within_a_step(driver_factory):
    engine = MockEngine(slots=2, decode_delay=0.01)
    driver = driver_factory(engine)
    long_one, other = make_request([1], max_tokens=10_000), make_request([2], max_tokens=20)
    driver.submit_request(long_one)
    driver.submit_request(other)
    long_one.channel.get(timeout=TIMEOUT)
    steps_at_cancel = engine.calls["step"]
    long_one.cancel()
    items = drain(long_one)
    assert items[-1].finish_reason == "abort"
    assert engine.calls["step"] - steps_at_cancel <= 2  # freed before the next step
    assert tokens_of(drain(other)) == expected_tokens([2], 20)
    time.sleep(0.1)
    assert driver.num_used_slots == 0


def test_cancel_while_waiting_never_takes_a_slot(driver_factory):
    engine = MockEngine(slots=1, decode_delay=0.01)
    driver = driver_factory(engine)
    busy, waiting = make_request([1], max_tokens=30), make_request([2], max_tokens=30)
    driver.submit_request(busy)
    driver.submit_request(waiting)
    waiting.cancel()
    assert drain(waiting)[-1].finish_reason == "abort"
    assert tokens_of(drain(busy)) == expected_tokens([1], 30)


def test_a_failing_step_fails_requests_and_readiness(driver_factory):
    """A failure that names no request (the step itself) fails the engine: every live request gets it."""
    engine = MockEngine(slots=2, decode_delay=0.005)
    engine.fail_on["step"] = 2
    driver = driver_factory(engine)
    requests = [make_request([i], max_tokens=50) for i in range(4)]
    for r in requests:
        driver.submit_request(r)
    for r in requests:  # nobody hangs: each gets its final sample or the error
        last = drain(r)[-1]
        assert isinstance(last, RuntimeError) or last.finish_reason is not None
    assert isinstance(driver.error, RuntimeError)
    assert not driver.ready and "injected" in str(driver.error)
    with pytest.raises(DriverNotReadyError, match="injected"):
        driver.submit_request(make_request([9]))


@pytest.mark.parametrize("everyone", [False, True])
def test_a_requests_text_failing_fails_that_request_alone(driver_factory, everyone):
    """issue 63: detokenizing one request's tokens raises; that request gets a RequestFailed naming it
    (a 500's worth), the others complete and the driver stays ready (also when every request fails)."""
    from vsurge.engine.faults import RequestFailed

    engine = MockEngine(slots=2, decode_delay=0.005)
    engine.processor.fail, engine.processor.fail_on_token = everyone, 30  # prompt [6] reaches 30; [0]-[2] never
    driver = driver_factory(engine)
    bad = make_request([6], max_tokens=50)
    good = [make_request([i], max_tokens=3) for i in range(3)]
    for r in [good[0], bad, *good[1:]]:
        driver.submit_request(r)
    last = drain(bad)[-1]
    assert isinstance(last, RequestFailed) and last.status == 500
    assert f"request {bad.request_id} failed while reading its new tokens" in str(last)
    for i, r in enumerate(good):
        items = drain(r)
        if everyone:
            assert isinstance(items[-1], RequestFailed)
        else:
            assert tokens_of(items) == expected_tokens([i], 3) and items[-1].finish_reason == "length"
    assert driver.ready and driver.error is None
    engine.processor.fail, engine.processor.fail_on_token = False, None
    after = make_request([1], max_tokens=4)
    driver.submit_request(after)
    assert tokens_of(drain(after)) == expected_tokens([1], 4)
    assert driver.num_live == 0 and driver.num_used_slots == 0


class StuckOutput:
    """A step's output whose tokens never arrive until `release` is set (a deadlocked device)."""

    def __init__(self, out, release):
        self.out, self.release = out, release

    def to_host(self, with_logprobs):
        self.release.wait()
        return self.out


def test_a_step_that_never_finishes_fails_requests_and_readiness(driver_factory):
    engine = MockEngine(slots=2)
    engine.config = engine.config.replace(step_timeout=0.5)
    release, step = threading.Event(), engine.step
    engine.step = lambda *a: (lambda state, out: (state, StuckOutput(out, release)))(*step(*a))
    driver = driver_factory(engine)
    requests = [make_request([i], max_tokens=5) for i in range(3)]  # 2 in slots, 1 waiting
    started = time.monotonic()
    for r in requests:
        driver.submit_request(r)
    for r in requests:
        last = drain(r, timeout=10)[-1]
        assert isinstance(last, RuntimeError) and "stuck" in str(last) and "--step-timeout" in str(last)
    assert 0.5 <= time.monotonic() - started < 8
    assert not driver.ready and "stuck" in str(driver.error)
    with pytest.raises(DriverNotReadyError, match="stuck"):
        driver.submit_request(make_request([9]))
    release.set()  # the thread, freed, sees the driver stopped and ends


def test_slow_steps_within_the_timeout_are_not_stuck(driver_factory):
    engine = MockEngine(slots=2, decode_delay=0.05)
    engine.config = engine.config.replace(step_timeout=0.5)
    driver = driver_factory(engine)
    r = make_request([1], max_tokens=20)  # 20 steps of 0.05 s: 1 s in all, each step well within 0.5 s
    driver.submit_request(r)
    assert tokens_of(drain(r)) == expected_tokens([1], 20) and driver.ready


def test_queue_limit_rejects_with_a_clear_error(driver_factory):
    engine = MockEngine(slots=1, decode_delay=0.01)
    driver = driver_factory(engine, max_queue=2)
    requests = [make_request([i], max_tokens=40) for i in range(3)]
    driver.submit_request(requests[0])
    requests[0].channel.get(timeout=TIMEOUT)  # running in the slot
    driver.submit_request(requests[1])
    driver.submit_request(requests[2])
    with pytest.raises(QueueFullError, match=r"queue is full \(2 waiting, limit 2\)"):
        driver.submit_request(make_request([7]))
    for r in requests:
        assert drain(r)[-1].finish_reason == "length"


class EncodingMockEngine(MockEngine):
    """Embeds a prompt as the sum of its ids (one call takes every waiting prompt)."""

    def encode_step(self, pending):
        return [(r, {"mean": [float(sum(r.prompt_ids))], "last": [float(r.prompt_ids[-1])]}) for r in pending]


def test_one_calls_encodes_are_one_queue_entry(driver_factory):
    """An embeddings call's inputs (up to 2,048) are one entry of the queue: 300 of them pass a queue of 2 on an
    idle driver, and while they wait they count as one (a generation request still finds room)."""
    from vsurge.engine import ReturnChannel
    from vsurge.engine.encode import EncodeRequest

    engine = EncodingMockEngine(slots=1, decode_delay=0.01)
    driver = driver_factory(engine, max_queue=2)
    requests = [EncodeRequest([1, i], "embed", ReturnChannel()) for i in range(300)]
    driver.submit_encodes(requests)
    generation = make_request([3], max_tokens=4)
    driver.submit_request(generation)  # the 300 are one entry: the queue of 2 has room
    assert [r.channel.get(timeout=TIMEOUT)["mean"] for r in requests] == [[1.0 + i] for i in range(300)]
    assert drain(generation)[-1].finish_reason == "length"
    assert driver.num_waiting == 0


def test_submit_type_check(driver_factory):
    driver = driver_factory()
    with pytest.raises(TypeError, match="ActiveRequest"):
        driver.submit_request("not a request")


def test_stop_drains_in_flight_work_then_refuses(driver_factory):
    engine = MockEngine(slots=2, decode_delay=0.002)
    driver = driver_factory(engine)
    requests = [make_request([i], max_tokens=30) for i in range(4)]
    for r in requests:
        driver.submit_request(r)
    driver.stop(timeout=TIMEOUT)
    for i, r in enumerate(requests):
        assert tokens_of(drain(r)) == expected_tokens([i], 30)  # nothing lost
    with pytest.raises(DriverNotReadyError):
        driver.submit_request(make_request([1]))


def test_stop_with_a_short_deadline_fails_the_rest_loudly(driver_factory):
    engine = MockEngine(slots=1, decode_delay=0.01)
    driver = driver_factory(engine)
    requests = [make_request([i], max_tokens=10_000) for i in range(3)]
    for r in requests:
        driver.submit_request(r)
    driver.stop(timeout=0.2)
    for r in requests:
        assert isinstance(drain(r)[-1], DriverNotReadyError)


def test_idle_driver_uses_no_cpu(driver_factory):
    driver = driver_factory()
    r = make_request([1], max_tokens=3)
    driver.submit_request(r)
    drain(r)
    time.sleep(0.2)
    start = time.process_time()
    time.sleep(1.0)
    assert time.process_time() - start < 0.05  # threads are blocked on queues, not polling


def test_seed_arguments_without_effect_warn_and_still_work(driver_factory):
    with pytest.warns(UserWarning, match="has no effect"):
        driver = driver_factory(detokenizing_blocks=1)
    requests = [make_request([i], max_tokens=6) for i in range(5)]
    for r in requests:
        driver.submit_request(r)
    for i, r in enumerate(requests):
        assert tokens_of(drain(r)) == expected_tokens([i], 6)


def test_several_decode_engines_are_replicas(driver_factory):
    engines = [MockEngine(slots=2, decode_delay=0.002), MockEngine(slots=2, decode_delay=0.002)]
    driver = vDriver(prefill_engines=engines, decode_engines=engines)
    driver.start()
    try:
        requests = [make_request([i], max_tokens=8) for i in range(8)]
        for r in requests:
            driver.submit_request(r)
        for i, r in enumerate(requests):
            assert tokens_of(drain(r)) == expected_tokens([i], 8)
        assert driver.get_total_concurrent_requests() == 4
        assert engines[0].calls["step"] > 0 and engines[1].calls["step"] > 0  # least-loaded routing
    finally:
        driver.stop(timeout=1)


def test_several_decode_steps_per_call_give_the_same_tokens(driver_factory):
    engine = MockEngine(slots=3, decode_steps=4)
    driver = driver_factory(engine)
    requests = [make_request([i, 2], max_tokens=3 + 2 * i, eos=[14] if i == 1 else ()) for i in range(5)]
    for r in requests:
        driver.submit_request(r)
    for i, r in enumerate(requests):
        assert tokens_of(drain(r)) == expected_tokens([i, 2], 3 + 2 * i, [14] if i == 1 else ())


def test_a_prompt_arriving_during_decode_calls_is_computed_by_the_next_step(driver_factory):
    """Issue 38: a request arriving while a multi-step decode call runs is prefilled by the very next
    step, and calls are cut to decode_call_ms at the measured step time (40 ms steps, 100 ms: 2 steps,
    where the configured 8 made the newcomer wait up to 320 ms)."""
    engine = MockEngine(slots=3, decode_steps=8, step_seconds=0.04, decode_call_ms=100)
    driver = driver_factory(engine)
    long = make_request([1, 2], max_tokens=60)
    driver.submit_request(long)
    for _ in range(8):  # its prompt, its one-step first decode call, then budgeted calls
        long.channel.get(timeout=TIMEOUT)
    late = make_request([3, 4], max_tokens=3)
    arrived = time.perf_counter()
    driver.submit_request(late)
    assert tokens_of(drain(late)) == expected_tokens([3, 4], 3)
    calls = list(engine.steps)
    in_flight = max(i for i, (at, _, _) in enumerate(calls) if at <= arrived)
    prefilled = next(i for i, (_, ids, _) in enumerate(calls) if late.request_id in ids)
    assert prefilled == in_flight + 1
    decode_calls = [k for _, ids, k in calls[:in_flight + 1] if not ids]
    assert decode_calls[0] == 1 and max(decode_calls) == 2, decode_calls
    driver.stop(timeout=1)


def test_an_idle_driver_gathers_a_burst_into_one_step(driver_factory, monkeypatch):
    """Requests reaching an idle driver a few ms apart (a client's burst, parsed one by one by the
    server) are prefilled by one step, not the first alone with the rest behind it (issue 38).
    The gaps here are 5 ms and the quiet time 50 ms, so a loaded machine cannot split them."""
    import vsurge.engine.arrivals as arrivals

    monkeypatch.setattr(arrivals, "BURST_QUIET_S", 0.05)
    monkeypatch.setattr(arrivals, "BURST_MAX_S", 2.0)
    engine = MockEngine(slots=8)
    engine.config = engine.config.replace(chunk_lengths=(4,), max_prefill_rows=8)  # a step of 8 short prompts
    driver = driver_factory(engine)
    time.sleep(0.2)  # its thread waits for work
    burst = [make_request([i, i + 1], max_tokens=2) for i in range(8)]
    for r in burst:
        driver.submit_request(r)
        time.sleep(0.005)
    for i, r in enumerate(burst):
        assert tokens_of(drain(r)) == expected_tokens([i, i + 1], 2)
    _, first_step, _ = engine.steps[0]
    assert first_step == [r.request_id for r in burst]


def test_vsurge_generate_cancels_the_submitted_prompts_when_a_later_one_is_refused():
    """Old bug: vSurge.generate submitted prompts one by one; when the queue refused a later one, the
    earlier ones ran on to max_tokens with nobody reading them."""
    import asyncio

    from vsurge import vSurge

    engine = MockEngine(slots=1, decode_delay=0.01)
    driver = vDriver(engine, max_queue=1)
    driver.start()
    try:
        surge = vSurge(driver)
        params = SamplingParams(max_tokens=400, temperature=0.0)  # 4 s each at 10 ms a step
        with pytest.raises(QueueFullError):
            asyncio.run(surge.generate(["ab", "cd", "ef", "gh", "ij"], params))
        deadline = time.monotonic() + 2
        while (driver._live or driver.num_used_slots) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not driver._live and driver.num_used_slots == 0  # cancelled at once, not run to the end
        assert driver.metrics.value("vsurge:request_success_total", finished_reason="abort") >= 1
        assert engine.calls["step"] < 100
    finally:
        driver.stop(timeout=1)
