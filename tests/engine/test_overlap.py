"""The overlapped step loop (driver.py, EngineConfig.async_scheduling): step N+1 is planned and
dispatched before step N's tokens are read, fed them on the device.

The same requests with the loop overlapped and not must give the same tokens, texts and finish
reasons (greedy; stop strings; end tokens in the middle of a multi-step decode call; preemption
under page pressure; a continuation served from the prefix cache after the extra step of a
stopped sequence), and a cancelled stream ends with nothing after it. Real engines: a tiny random
llama (paged, small pages) and the default model (the dense engine every engine test shares).
Planning ahead itself (pending tokens, no preemption ahead of results): the scheduler alone.
"""

from __future__ import annotations

import asyncio

import jax.numpy as jnp
import numpy as np
import pytest

import vsurge
from vsurge import SamplingParams, vSurge
from vsurge.engine.engine_config import EngineConfig
from vsurge.engine.plan import HostStepOutput
from vsurge.engine.request import ActiveRequest, ReturnChannel
from vsurge.engine.scheduler import Scheduler
from vsurge.engine.sequence import Sequence
from vsurge.kv.page_manager import HBMPageManager
from tiny_models import write_tiny_model

PAGE = 8


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, default_processor_dir):
    """A paged engine over a tiny llama: 4 slots, 8-token pages, 20 pages (pressure at 4 x 60 tokens)."""
    folder = tmp_path_factory.mktemp("tiny_llama_overlap")
    write_tiny_model("llama", folder, default_processor_dir)
    model, processor = vsurge.load(str(folder), dtype=jnp.float32, progress=False)
    s = vSurge.create_odriver(model, processor, max_concurrent_decodes=4, prefill_lengths=[16], max_length=128,
                              page_size=PAGE, num_pages=20, seed=1, decode_steps=4,
                              prefill_tokens=32)
    s.compile()
    s.start()
    yield s
    s.stop(timeout=5)


def set_overlap(surge, on: bool) -> None:
    for engine in surge.driver.engines:  # the loop reads it every step
        engine.config = engine.config.replace(async_scheduling=on)


def results(surge, prompts, params, overlap: bool):
    set_overlap(surge, overlap)
    try:
        before = sum(r.overlapped_steps for r in surge.driver.replicas)
        out = asyncio.run(surge.generate(prompts, params))
        ahead = sum(r.overlapped_steps for r in surge.driver.replicas) - before
    finally:
        set_overlap(surge, True)
    return [(r.token_ids, r.text, r.finish_reason) for r in out], ahead


def both(surge, prompts, params):
    """(overlapped results, plain results); the overlapped run did plan ahead."""
    plain, ahead_plain = results(surge, prompts, params, False)
    overlapped, ahead = results(surge, prompts, params, True)
    assert ahead_plain == 0 and ahead > 0
    return overlapped, plain


def prompts_of(processor, n, words=6):
    return [" ".join(["tell", "me", "about"] + [f"item{i}"] * (words + 3 * i)) for i in range(n)]


def wait_idle(surge):
    for _ in range(300):
        if surge.driver.num_used_slots == 0 and surge.driver.num_waiting == 0:
            return
        asyncio.run(asyncio.sleep(0.02))


def test_greedy_outputs_and_lengths_equal_with_and_without_overlap(tiny):
    prompts = prompts_of(tiny.processor, 6)
    params = [SamplingParams(max_tokens=5 + 7 * i, temperature=0.0, ignore_eos=True) for i in range(6)]
    overlapped, plain = both(tiny, prompts, params)
    assert overlapped == plain
    assert [len(t) for t, _, _ in plain] == [p.max_tokens for p in params]


def test_stop_strings_and_end_tokens_mid_call_end_at_the_same_token(tiny):
    """Stops found on the host (a stop string) and on the device (an end token inside a 4-step call)
    after the next step was already dispatched: nothing of that step reaches the stream."""
    prompts = prompts_of(tiny.processor, 4)
    free = [SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)] * 4
    plain_free, _ = results(tiny, prompts, free, False)
    params = []
    for i, (tokens, text, _) in enumerate(plain_free):
        if i % 2:  # an end token first sampled at an odd position: mid-call for 4-step calls
            at = next(k for k in range(9, 40, 2) if tokens[k] not in tokens[:k])
            params.append(SamplingParams(max_tokens=40, temperature=0.0, stop_token_ids=[tokens[at]]))
        else:
            piece = tiny.processor.decode(tokens[10:12])
            params.append(SamplingParams(max_tokens=40, temperature=0.0, stop=[piece.strip() or piece]))
    overlapped, plain = both(tiny, prompts, params)
    assert overlapped == plain
    assert all(reason == "stop" and len(tokens) < 40 for tokens, _, reason in plain)
    wait_idle(tiny)
    tiny.driver.engine.manager.check()
    assert tiny.driver.engine.manager.num_used_pages == 0


def test_preemption_under_page_pressure_gives_the_same_tokens(tiny):
    prompts = prompts_of(tiny.processor, 6, words=14)
    params = [SamplingParams(max_tokens=30 + 3 * i, temperature=0.0, ignore_eos=True) for i in range(6)]
    before = tiny.metrics.value("vsurge:num_preemptions_total")
    overlapped, plain = both(tiny, prompts, params)
    assert tiny.metrics.value("vsurge:num_preemptions_total") > before
    assert overlapped == plain
    wait_idle(tiny)
    tiny.driver.engine.manager.check()


def test_a_continuation_from_the_prefix_cache_after_a_stopped_sequence_is_unchanged(tiny):
    """A stop string ends a sequence while its next step (dispatched ahead) writes K/V past its end;
    a later prompt continuing that conversation reads its cached pages: same tokens as with the
    prefix cache emptied and the loop not overlapped."""
    first = prompts_of(tiny.processor, 1, words=20)[0]
    (tokens, _, _), = results(tiny, [first], [SamplingParams(max_tokens=30, temperature=0.0,
                                                             ignore_eos=True)], False)[0]
    stop = SamplingParams(max_tokens=30, temperature=0.0, stop=[tiny.processor.decode(tokens[17:19]).strip()])
    (_, text, reason), = results(tiny, [first], [stop], True)[0]
    assert reason == "stop"
    follow = first + text + " and then"
    greedy = [SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)]
    hits = tiny.metrics.value("vsurge:prefix_cache_hits_total")
    cached, _ = results(tiny, [follow], greedy, True)
    assert tiny.metrics.value("vsurge:prefix_cache_hits_total") - hits >= 3 * PAGE
    wait_idle(tiny)
    tiny.driver.engine.manager.reset_prefix_cache()
    fresh, _ = results(tiny, [follow], greedy, False)
    assert cached == fresh


def test_a_cancelled_stream_ends_and_the_engine_keeps_serving(tiny):
    prompt = prompts_of(tiny.processor, 1)[0]
    params = SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True)

    async def cancel_after(n):
        submission = tiny.submit(list(tiny.processor.encode(prompt)), params)
        seen, reasons = 0, []
        async for samples in submission.updates():
            for sample in samples:
                seen += len(sample.token_ids)
                reasons.append(sample.finish_reason)
            if seen >= n and not submission.actives[0].is_cancelled:
                submission.actives[0].cancel()
        return seen, reasons

    seen, reasons = asyncio.run(cancel_after(6))
    assert reasons[-1] == "abort" and reasons.count("abort") == 1 and 6 <= seen < 100
    wait_idle(tiny)
    tiny.driver.engine.manager.check()
    assert tiny.driver.engine.manager.num_used_pages == 0
    again, plain = both(tiny, [prompt], [SamplingParams(max_tokens=9, temperature=0.0, ignore_eos=True)])
    assert again == plain


def test_default_model_greedy_and_stops_equal_with_and_without_overlap(dense_surge, default_model):
    processor = default_model[1]
    questions = ["What is the capital of France?", "Name three primary colors.", "Write a haiku about rain."]
    prompts = [processor.apply_chat_template([{"role": "user", "content": q}], tokenize=False) for q in questions]
    params = [SamplingParams(max_tokens=24, temperature=0.0), SamplingParams(max_tokens=24, temperature=0.0,
                                                                            stop=[" and"]),
              SamplingParams(max_tokens=13, temperature=0.0, ignore_eos=True)]
    overlapped, plain = both(dense_surge, prompts, params)
    assert overlapped == plain


# ---------------------------------------------------------------- planning ahead (the scheduler alone)
def _seq(prompt_len, max_tokens, first_token=1):
    request = ActiveRequest(list(range(first_token, first_token + prompt_len)), SamplingParams(max_tokens=max_tokens), 0,
                            max_tokens, [], ReturnChannel(), detokenize=False)
    return Sequence.of(request, None)


def _out(tokens):
    tokens = np.asarray(tokens, np.int32)  # (K, R)
    return HostStepOutput(tokens, np.ones(tokens.shape, bool), None, 0)


def test_planning_ahead_counts_pending_tokens_and_never_preempts():
    config = EngineConfig(max_slots=2, max_length=64, page_size=4, prefill_tokens=16, chunk_lengths=(8,),
                          decode_steps=4)
    pool = HBMPageManager(6, 4)  # 24 tokens
    scheduler = Scheduler(pool, config)
    a, b = _seq(7, 5), _seq(7, 20, first_token=50)  # no shared prefix: b never waits for a's pages
    scheduler.add(a)
    scheduler.add(b)
    first = scheduler.schedule()
    assert [c.seq for c in first.chunks] == [a, b]
    scheduler.advance(first)  # dispatched: each prompt computed, its first token sampled on the device
    assert (a.pending, a.num_tokens, a.remaining) == (1, 8, 1)
    second = scheduler.schedule(ahead=True)  # each one's second token: a call of one step
    assert second.decode == [a, b] and second.num_steps == 1 and not second.chunks
    scheduler.advance(second)
    third = scheduler.schedule(ahead=True)
    assert third.decode == [a, b] and third.num_steps == 3  # all a may still make
    scheduler.advance(third)
    assert (a.pending, a.tokens_left, b.num_tokens) == (5, 0, 12)
    fourth = scheduler.schedule(ahead=True)  # a's last token is in flight; b's pages hold one step
    assert fourth.decode == [b] and fourth.num_steps == 1
    scheduler.advance(fourth)
    # b needs a page that only preempting (or a's end, not read yet) would free: wait for the results
    assert scheduler.schedule(ahead=True) is None
    assert scheduler.num_preemptions == 0 and a in scheduler.running and b in scheduler.running
    scheduler.postprocess(first, _out([[100, 200]]))
    scheduler.postprocess(second, _out([[101, 201]]))
    scheduler.postprocess(third, _out([[102, 202], [103, 203], [104, 204]]))
    assert a.finished and a.tokens[7:] == [100, 101, 102, 103, 104] and a.pending == 0
    scheduler.postprocess(fourth, _out([[205, 0]]))
    assert b.tokens[7:] == [200, 201, 202, 203, 204, 205] and b.pending == 0 and b.remaining == 1
    assert scheduler.schedule().decode == [b] and scheduler.num_preemptions == 0
    pool.check()


def test_a_first_token_comes_from_a_one_step_call():
    """A prompt with nothing left to prefill (one token here; a resent, cached prompt in practice)
    decodes its first token in a call of one step, so it streams after one step, not four; so does its
    second (more prompts of a burst are likely arriving); the call planned behind those runs all four."""
    config = EngineConfig(max_slots=2, max_length=64, page_size=4, prefill_tokens=16, chunk_lengths=(8,),
                          decode_steps=4)
    scheduler = Scheduler(HBMPageManager(8, 4), config)
    a = _seq(1, 10)
    scheduler.add(a)
    first = scheduler.schedule()
    assert first.decode == [a] and not first.chunks and first.num_steps == 1
    scheduler.advance(first)
    second = scheduler.schedule(ahead=True)
    assert second.decode == [a] and second.num_steps == 1
    scheduler.advance(second)
    third = scheduler.schedule(ahead=True)
    assert third.decode == [a] and third.num_steps == 4
    scheduler.advance(third)
    scheduler.postprocess(first, _out([[100]]))
    scheduler.postprocess(second, _out([[101]]))
    scheduler.postprocess(third, _out([[102], [103], [104], [105]]))
    assert a.tokens[1:] == [100, 101, 102, 103, 104, 105] and a.pending == 0
