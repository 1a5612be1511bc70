"""oDriver + oEngine (paged KV cache, chunked prefill, prefix caching, preemption) on the real default model.

Reference: vDriver (dense cache) on the same requests; greedy tokens must be identical.
"""

from __future__ import annotations

import asyncio

import pytest

from vsurge import SamplingParams, vSurge, vSurgeRequest

MAX_LENGTH = 256
CHUNK = 32  # prompts of the chat template are ~35-60 tokens: most take two or more chunks
PAGE = 32
PAGES = MAX_LENGTH // PAGE  # 256 tokens: one sequence at full length


def chat_text(processor, question):
    return processor.apply_chat_template([{"role": "user", "content": question}], tokenize=False)


QUESTIONS = ["What is the capital of France?", "Name three primary colors.", "Hi!",
             "Explain in one sentence why the sky is blue, and mention the name of the effect.",
             "Write a haiku about autumn leaves.", "What is 12 times 7?",
             "List two animals that live in the ocean and one that lives in the desert.", "Say hello in Spanish.",
             "Here are some fruits: apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon, "
             "mango, nectarine, orange and papaya. Which of them are usually yellow when ripe?"]


def make_paged(model, processor, num_pages=PAGES, decodes=4, prefix_caching=True, compile=True, start=True):
    # float32 pages, as the dense engine it is compared with: 16-bit pages round K/V, and a near-tie's
    # greedy token can then follow the batch's summation order (docs/performance.md: batch invariance)
    s = vSurge.create_odriver(model, processor, max_concurrent_decodes=decodes, prefill_lengths=[CHUNK],
                              max_length=MAX_LENGTH, page_size=PAGE, num_pages=num_pages, seed=1,
                              enable_prefix_caching=prefix_caching, kv_cache_dtype="float32")
    if compile:
        s.compile()
    if start:
        s.start()
    return s


@pytest.fixture(scope="module")
def compiled_paged(default_model):
    """The module's paged engine, compiled, and what compile() left before start() (the `paged` fixture
    starts it): test_compile_makes_a_warm_state_... reads it, where a second engine cost ~10 s."""
    s = make_paged(*default_model, num_pages=PAGES, start=False)
    replica, manager = s.driver.replicas[0], s.driver.engine.manager
    manager.check()
    warm = {"has_state": replica.state is not None, "used_pages": manager.num_used_pages,
            "running": len(replica.scheduler.running), "prefix_queries": manager.prefix_queries}
    yield s, warm
    s.stop(timeout=5)


@pytest.fixture(scope="module")
def paged(compiled_paged):
    """Pages for ~one sequence at full length over 4 slots: every test runs under memory pressure."""
    s, _ = compiled_paged
    s.start()
    return s


@pytest.fixture(scope="module")
def dense(dense_surge):
    assert dense_surge.max_length == MAX_LENGTH
    return dense_surge


def greedy(max_tokens):
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def token_ids(surge, prompts, params):
    return [r.token_ids for r in asyncio.run(surge.generate(prompts, params))]


def wait_idle(driver):
    for _ in range(200):
        if driver.num_used_slots == 0 and driver.num_waiting == 0:
            return
        asyncio.run(asyncio.sleep(0.02))


def test_compile_makes_a_warm_state_and_leaves_nothing_behind(compiled_paged, paged, default_model, compile_counter):
    """compile() makes the engine state and runs one short sequence through the programs a lone
    request uses first (readiness follows it): afterwards every page and slot is free, the warm-up's
    prefix-cache lookups are not reported as users', and the first request's tokens are a later
    identical request's. (The file's first test: its first request is the engine's first.)"""
    processor = default_model[1]
    _, warm = compiled_paged
    assert warm["has_state"] and warm["used_pages"] == 0 and warm["running"] == 0
    assert warm["prefix_queries"] > 0  # the warm-up did run a sequence through the pool
    prompt = chat_text(processor, QUESTIONS[0])
    with compile_counter as counts:
        first = token_ids(paged, [prompt], [greedy(10)])
    assert counts["compile"] == 0, counts  # (as every later request's: test_greedy_equals_dense_...)
    assert first == token_ids(paged, [prompt], [greedy(10)])
    wait_idle(paged.driver)
    manager = paged.driver.engine.manager
    assert paged.metrics.value("vsurge:prefix_cache_queries_total") == manager.prefix_queries - warm["prefix_queries"]


def test_greedy_equals_dense_engine_and_vinference(paged, dense, default_model, compile_counter):
    processor = default_model[1]
    prompts = [chat_text(processor, q) for q in QUESTIONS]
    params = [greedy(8 + 5 * i) for i in range(len(prompts))]
    with compile_counter as counts:
        ours = token_ids(paged, prompts, params)
    assert counts["compile"] == 0, counts  # every bucket was compiled up front
    # vDriver's greedy tokens equal vInference's (test_vsurge.py), so these do too
    assert ours == token_ids(dense, prompts, params)
    assert max(len(processor.encode(p)) for p in prompts) > 2 * CHUNK  # chunked over 3+ steps
    wait_idle(paged.driver)
    manager = paged.driver.engine.manager
    manager.check()
    assert manager.num_used_pages == 0  # finished sequences hold nothing; full pages stay cached


def test_prefix_cache_hits_on_a_repeated_system_prompt(paged, default_model):
    processor = default_model[1]
    system = "You are a careful assistant. Answer briefly and precisely, in plain English. " * 3
    convo = [{"role": "system", "content": system}, {"role": "user", "content": "What is 2 + 2?"}]
    prompt = processor.apply_chat_template(convo, tokenize=False)
    metrics = paged.metrics
    hits_before = metrics.value("vsurge:prefix_cache_hits_total")
    first = token_ids(paged, [prompt], [greedy(12)])
    hits_after_first = metrics.value("vsurge:prefix_cache_hits_total")
    second = token_ids(paged, [prompt], [greedy(12)])
    hits = metrics.value("vsurge:prefix_cache_hits_total") - hits_after_first
    n = len(processor.encode(prompt))
    assert second == first
    assert hits >= (n - 1) // PAGE * PAGE - PAGE and hits > 0, (hits, n, hits_before)
    assert metrics.value("vsurge:prefix_cache_queries_total") > 0


def test_memory_pressure_preempts_and_outputs_are_unchanged(paged, dense, default_model):
    """3x more sequences than the pages hold at full length: preemption by recomputation."""
    processor = default_model[1]
    # long prompts, short answers: 3x over-subscribed with few decode steps (a fast test)
    prompts = [chat_text(processor, QUESTIONS[i] + " Answer in detail, with examples and reasons." * 8)
               for i in range(8)]
    params = [greedy(16 + 4 * (i % 3)) for i in range(8)]
    assert 3 * PAGES * PAGE < sum(len(processor.encode(p)) + q.max_tokens for p, q in zip(prompts, params))
    before = paged.metrics.value("vsurge:num_preemptions_total")
    ours = token_ids(paged, prompts, params)
    assert paged.metrics.value("vsurge:num_preemptions_total") > before
    assert ours == token_ids(dense, prompts, params)
    wait_idle(paged.driver)
    paged.driver.engine.manager.check()
    assert paged.driver.engine.manager.num_used_pages == 0


def test_seeded_sampling_is_reproducible_in_a_crowd(paged, default_model):
    processor = default_model[1]
    prompt = chat_text(processor, "Invent a name for a dragon.")
    params = SamplingParams(max_tokens=16, temperature=1.0, seed=42, top_p=0.9)
    solo = token_ids(paged, [prompt], [params])
    crowd = token_ids(paged, [prompt] + [chat_text(processor, q) for q in QUESTIONS[:5]],
                      [params] + [SamplingParams(max_tokens=20, temperature=0.8)] * 5)
    assert crowd[0] == solo[0]


def test_cancelled_and_stopped_sequences_free_their_pages(paged, default_model):
    processor = default_model[1]
    prompts = [chat_text(processor, f"Count slowly from {i} to {i + 50}.") for i in range(10)]

    async def consume(prompt, cancel_after, stop):
        seen = 0
        # 16 tokens: 10 sequences over 4 slots still overlap, cancelled ones leave at 3 (40 cost ~3 s more)
        request = vSurgeRequest(prompt=prompt, max_tokens=16, temperature=0.0, ignore_eos=True, stop=stop)
        async for samples in paged.complete(request):
            seen += len(samples[0].token_ids)
            if cancel_after and seen >= cancel_after:
                return "cancelled"
            if samples[0].finish_reason:
                return samples[0].finish_reason
        return "ended"

    async def run():
        return await asyncio.gather(*[consume(p, 3 if i % 3 == 1 else 0, [","] if i % 3 == 2 else None)
                                      for i, p in enumerate(prompts)])

    results = asyncio.run(run())
    assert results.count("cancelled") == 3 and results.count("length") + results.count("stop") == 7
    wait_idle(paged.driver)
    manager = paged.driver.engine.manager
    manager.check()
    assert paged.driver.num_used_slots == 0 and manager.num_used_pages == 0
    # still serving afterwards
    assert [len(t) for t in token_ids(paged, [chat_text(processor, QUESTIONS[0])], [greedy(12)])] == [12]


def test_prompts_longer_than_a_chunk_and_bad_input(paged, default_model):
    processor = default_model[1]
    n = len(processor.encode("word " * 150))
    (out,) = asyncio.run(paged.generate("word " * 150, greedy(4)))
    assert out.num_generated_tokens == 4 and n > 4 * CHUNK  # no prefill-length limit below max_length
    with pytest.raises(ValueError, match=f"maximum context length is {MAX_LENGTH} tokens"):
        asyncio.run(paged.generate("word " * 150, SamplingParams(max_tokens=200)))
    with pytest.raises(ValueError, match="empty"):
        asyncio.run(paged.generate("", SamplingParams(max_tokens=4)))


def test_too_little_kv_memory_is_a_clear_error(default_model):
    model, processor = default_model
    with pytest.raises(ValueError, match=r"too little KV memory: 3 pages of 16 tokens hold 48 tokens, less than "
                                         r"max_length=256"):
        vSurge.create_odriver(model, processor, max_length=256, page_size=16, num_pages=3)
    with pytest.raises(ValueError, match="hbm_utilization"):
        vSurge.create_odriver(model, processor, max_length=256, page_size=16, hbm_utilization=1.5)


def test_a_failing_step_fails_requests_loudly(default_model, monkeypatch):
    model, processor = default_model
    s = make_paged(model, processor, compile=False)  # the step is replaced: nothing to compile
    try:
        def broken(*args, **kwargs):
            raise RuntimeError("device on fire")

        monkeypatch.setattr(s.driver.engine, "step", broken)
        with pytest.raises(RuntimeError, match="device on fire"):
            asyncio.run(s.generate(chat_text(processor, "Hi!"), greedy(4)))
        assert not s.ready
    finally:
        s.stop(timeout=1)
