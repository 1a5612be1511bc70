"""vSurge + vDriver + vEngine on the real default model."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from vsurge import SamplingParams, vInference, vInferenceConfig, vSurgeRequest

MAX_LENGTH = 256


@pytest.fixture(scope="module")
def surge(dense_surge):
    assert dense_surge.max_length == MAX_LENGTH
    return dense_surge


@pytest.fixture(scope="module")
def alone(default_model):
    """vInference runs each request by itself: the reference for batch invariance. Its settings are
    test_vinference.py's `vinf`, whose (1, 64) bucket's programs (all these prompts need) are then in the
    run's cache."""
    model, processor = default_model
    return vInference(model, processor, generation_config=vInferenceConfig(max_new_tokens=64, streaming_chunks=4))


def chat_text(processor, question):
    return processor.apply_chat_template([{"role": "user", "content": question}], tokenize=False)


QUESTIONS = ["What is the capital of France?", "Name three primary colors.", "Hi!",
             "Explain in one sentence why the sky is blue.", "Write a haiku about autumn leaves.",
             "What is 12 times 7?", "List two animals that live in the ocean and one that lives in the desert.",
             "Say hello in Spanish."]


def test_16_concurrent_mixed_requests(surge, alone, default_model, compile_counter):
    processor = default_model[1]
    prompts, params = [], []
    for i in range(16):
        question = QUESTIONS[i % len(QUESTIONS)] + (" Please answer in detail, " * (i % 4))
        prompts.append(chat_text(processor, question))
        greedy = i % 2 == 0
        params.append(SamplingParams(max_tokens=6 + (i * 7) % 34, temperature=0.0 if greedy else 0.9,
                                     seed=None if greedy else 100 + i, top_p=1.0 if greedy else 0.95,
                                     stop=["."] if i % 6 == 4 else None))
    with compile_counter as counts:
        results = asyncio.run(surge.generate(prompts, params))
    assert counts["compile"] == 0, counts  # everything was compiled by compile()
    assert len(results) == 16
    for prompt, p, r in zip(prompts, params, results):
        assert r.finish_reason in ("stop", "length") and r.num_generated_tokens <= p.max_tokens
        if p.stop:
            assert "." not in r.text
        if p.temperature == 0.0:  # greedy: identical to the same request run alone
            ref = alone.process_prompt(prompt, p)
            assert r.text == ref.text, (prompt, r.text, ref.text)
    assert surge.driver.num_used_slots == 0


def test_greedy_tokens_equal_vinference(surge, alone, default_model):
    processor = default_model[1]
    ids = processor.encode(chat_text(processor, "Describe a cat in two sentences."))
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    (ours,) = asyncio.run(surge.generate(processor.decode(ids), params))  # one entry per prompt, as the seed
    ref = list(alone.generate([ids], sampling_params=params))[-1].row_tokens(0)
    assert ours.token_ids == ref


def test_same_seed_same_output_whatever_else_runs(surge, default_model):
    processor = default_model[1]
    prompt = chat_text(processor, "Invent a name for a dragon.")
    params = SamplingParams(max_tokens=24, temperature=1.0, seed=42)
    (solo,) = asyncio.run(surge.generate(prompt, params))
    others = [chat_text(processor, q) for q in QUESTIONS[:6]]
    crowd = asyncio.run(surge.generate([prompt] + others, [params] + [SamplingParams(max_tokens=30,
                                                                                      temperature=0.7)] * 6))
    assert crowd[0].token_ids == solo.token_ids


def test_cancel_10_of_20_streams(surge, default_model):
    processor = default_model[1]
    prompts = [chat_text(processor, f"Count slowly from {i} to {i + 50}.") for i in range(20)]

    async def consume(prompt, cancel_after):
        seen = 0
        request = vSurgeRequest(prompt=prompt, max_tokens=40, temperature=0.0, ignore_eos=True)
        async for samples in surge.complete(request):
            seen += len(samples[0].token_ids)
            if cancel_after and seen >= cancel_after:
                return "cancelled", seen
            if samples[0].finish_reason:
                return samples[0].finish_reason, samples[0].num_generated_tokens
        return "ended", seen

    async def run():
        tasks = [asyncio.create_task(consume(p, 3 if i % 2 else 0)) for i, p in enumerate(prompts)]
        return await asyncio.gather(*tasks)

    results = asyncio.run(run())
    assert [r for i, r in enumerate(results) if i % 2 == 0] == [("length", 40)] * 10
    assert all(r[0] == "cancelled" for i, r in enumerate(results) if i % 2)
    for _ in range(100):  # the cancelled ones release their slots within a step
        if surge.driver.num_used_slots == 0 and surge.driver.num_waiting == 0:
            break
        asyncio.run(asyncio.sleep(0.05))
    assert surge.driver.num_used_slots == 0 and surge.driver.num_waiting == 0


def test_client_side_tokenization_and_n(surge, default_model):
    processor = default_model[1]
    ids = processor.encode(chat_text(processor, "What is the capital of France?"))

    async def run():
        out = []
        async for samples in surge.complete(vSurgeRequest(prompt=ids, max_tokens=12, temperature=0.0,
                                                          is_client_side_tokenization=True)):
            out.extend(samples)
        return out

    samples = asyncio.run(run())
    assert all(s.text == "" for s in samples)
    tokens = [t for s in samples for t in s.token_ids]
    assert processor.decode(tokens, skip_special_tokens=True) == "The capital of France is Paris."
    (several,) = asyncio.run(surge.generate(processor.decode(ids), SamplingParams(max_tokens=16, temperature=1.2,
                                                                                    seed=5, n=3)))
    assert len(several) == 3 and [s.index for s in several] == [0, 1, 2]
    assert len({tuple(s.token_ids) for s in several}) > 1


def test_stream_text_joins_to_the_final_text(surge, default_model):
    processor = default_model[1]
    prompt = chat_text(processor, "Reply with three emoji and the Japanese word for cat.")

    async def run():
        pieces, final = [], None
        async for samples in await surge.generate([prompt], SamplingParams(max_tokens=30, temperature=0.0),
                                                  stream=True):
            pieces.append(samples[0].text)
            final = samples[0]
        return pieces, final

    pieces, final = asyncio.run(run())
    assert "".join(pieces) == final.accumulated_text and "\ufffd" not in final.accumulated_text
    assert final.metadata == {"request_index": 0}


def test_bad_requests_raise_clear_errors(surge, default_model):
    processor = default_model[1]
    long_prompt = "word " * 200
    with pytest.raises(ValueError, match="more than the 128 this engine accepts"):
        asyncio.run(surge.generate(long_prompt, SamplingParams(max_tokens=4)))
    prompt = "word " * 100
    n = len(processor.encode(prompt))
    with pytest.raises(ValueError, match=f"maximum context length is {MAX_LENGTH} tokens. However, you requested "
                                         f"200 output tokens and your prompt contains {n} input tokens"):
        asyncio.run(surge.generate(prompt, SamplingParams(max_tokens=200)))
    with pytest.raises(ValueError, match="empty"):
        asyncio.run(surge.generate("", SamplingParams(max_tokens=4)))
    with pytest.raises(ValueError, match="out of range"):
        asyncio.run(surge.generate("hi", SamplingParams(max_tokens=4, logit_bias={10**7: 1.0})))
    with pytest.raises(TypeError, match="list of token ids"):
        asyncio.run(surge.complete(vSurgeRequest(prompt=["x"], max_tokens=4)).__anext__())
    (ok,) = asyncio.run(surge.generate(chat_text(processor, "What is the capital of France?"),
                                    SamplingParams(max_tokens=16, temperature=0.0)))
    assert ok.text == "The capital of France is Paris."  # still serving after bad input
    assert surge.count_tokens("hello world") == len(processor.encode("hello world"))
    assert np.isclose(surge.metrics.value("vsurge:num_requests_running"), 0)


BAD_SEED = 666  # the request whose own host work is made to fail


def _fails_for_the_bad_request(original, seq_of=lambda *a: a[1]):
    def patched(*args, **kwargs):
        seq = seq_of(*args)
        request = getattr(seq, "request", seq)
        if request.params.seed == BAD_SEED:
            raise RuntimeError("injected failure of one request")
        return original(*args, **kwargs)
    return patched


@pytest.mark.parametrize("stage", ["prepare", "slot", "pack"])
def test_one_requests_failure_is_its_own(surge, default_model, monkeypatch, stage):
    """issue 63: an exception while preparing, loading or packing ONE request fails that request (an
    error naming it) while the engine thread, the requests beside it and readiness go on."""
    from vsurge.engine import batch, driver
    from vsurge.engine.faults import RequestFailed

    if stage == "prepare":
        of = driver.Sequence.of.__func__
        monkeypatch.setattr(driver.Sequence, "of", classmethod(_fails_for_the_bad_request(of)))
    elif stage == "slot":
        monkeypatch.setattr(batch.BatchBuilder, "slot_arrays",
                            _fails_for_the_bad_request(batch.BatchBuilder.slot_arrays))
    else:
        monkeypatch.setattr(batch.BatchBuilder, "_table", _fails_for_the_bad_request(batch.BatchBuilder._table))
    prompt = chat_text(default_model[1], "What is the capital of France?")

    async def run():
        good = [surge.generate(prompt, SamplingParams(max_tokens=16, temperature=0.0)) for _ in range(3)]
        bad = surge.generate(prompt, SamplingParams(max_tokens=16, temperature=0.5, seed=BAD_SEED))
        return await asyncio.gather(*good[:2], bad, good[2], return_exceptions=True)

    first, second, failed, third = asyncio.run(run())
    assert isinstance(failed, RequestFailed) and "injected failure of one request" in str(failed), failed
    assert failed.status == 500 and str(failed).startswith("request ")
    assert [r.text for (r,) in (first, second, third)] == ["The capital of France is Paris."] * 3
    assert surge.ready and surge.driver.error is None
    assert surge.driver.num_live == 0 and surge.driver.num_used_slots == 0  # (settled before the last update)
