"""vInference on the real default model: greedy parity, streaming, stops, buckets, batching, persistence."""

from __future__ import annotations

import asyncio

import jax
import numpy as np
import pytest

from conftest import CHAT_PROMPT
from vsurge import PromptOutput, SamplingParams, vInference, vInferenceConfig, vInferencePreCompileConfig
from reference_generation import greedy_reference
from conftest import link_session_cache_into, use_session_compilation_cache

GREEDY = SamplingParams(max_tokens=32, temperature=0.0)


@pytest.fixture(scope="module")
def vinf(default_model):
    model, processor = default_model
    inference = vInference(model, processor, generation_config=vInferenceConfig(max_new_tokens=64, streaming_chunks=4),
                           seed=0)
    assert inference.precompile(vInferencePreCompileConfig(batch_size=[1, 8], prefill_length=64))
    return inference


def chat(text):
    return [{"role": "user", "content": text}]


def test_greedy_equals_foundation_path_and_transformers(vinf, default_model):
    """vInference's greedy tokens are the foundation path's, which test_default_model.py's
    test_32_greedy_tokens_identical_to_transformers finds equal to transformers' on this very prompt and
    length (32 tokens, no stop): so they are transformers' too, without running torch here."""
    model, processor = default_model
    prompt = processor.apply_chat_template(CHAT_PROMPT)
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    out = vinf.process_prompt(CHAT_PROMPT, params)
    tokens = list(vinf.generate([prompt], sampling_params=params))[-1].row_tokens(0)
    foundation = greedy_reference(model, prompt, 32)
    assert tokens == foundation
    assert out.text == processor.decode(foundation, skip_special_tokens=True)
    assert out.generated_tokens == 32 and out.finish_reason == "length"
    first = vinf.process_prompt(CHAT_PROMPT, GREEDY)
    assert first.text == "The capital of France is Paris." and first.finish_reason == "stop"


def test_generate_yields_sample_states_per_chunk(vinf, default_model):
    processor = default_model[1]
    ids = processor(["Hi", "What is the capital of France?"], return_tensors="np")  # left-padded
    states = list(vinf.generate(ids["input_ids"], ids["attention_mask"],
                                sampling_params=SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)))
    assert len(states) == 1 + 9 // 4 + 1  # prefill, then chunks of 4 steps
    final = states[-1]
    assert final.is_sequence_finished[:2].all() and final.generated_tokens == 10
    assert final.sequences.shape[1] == 64 + 64 and final.padded_length == 64  # prompt bucket + max_new_tokens
    np.testing.assert_array_equal(final.current_length[:2], final.prompt_lengths[:2] + 10)
    alone = greedy_reference(default_model[0], processor.encode("What is the capital of France?"), 10)
    assert final.row_tokens(1) == alone


@pytest.mark.parametrize("prompt", ["Reply with three emoji and the Japanese word for cat.",
                                    "Translate 'good morning' into Chinese, Japanese and Korean."])
def test_stream_chunks_join_to_the_non_stream_text(vinf, prompt):
    params = SamplingParams(max_tokens=48, temperature=0.0)
    pieces = list(vinf.process_prompt(chat(prompt), params, stream=True))
    full = vinf.process_prompt(chat(prompt), params).text
    assert "".join(pieces) == full
    assert all("\ufffd" not in p for p in pieces)
    assert any(ord(ch) > 0x2E80 for ch in full), full  # the reply really has CJK or emoji


def test_stop_string_across_a_chunk_boundary_is_cut(vinf, default_model):
    processor = default_model[1]
    tokens = processor.encode(vinf.process_prompt(CHAT_PROMPT, GREEDY).text)
    words = [processor.decode([t]) for t in tokens]
    assert words[4:6] == [" is", " Paris"]  # prefill gives token 0, chunks of 4 give 1-4 and 5-8
    params = SamplingParams(max_tokens=32, temperature=0.0, stop=["is Paris"])
    out = vinf.process_prompt(CHAT_PROMPT, params)
    assert out.text == "The capital of France " and out.finish_reason == "stop"
    assert "".join(vinf.process_prompt(CHAT_PROMPT, params, stream=True)) == out.text


def test_stop_token_ids_and_max_tokens(vinf, default_model):
    processor = default_model[1]
    comma = processor.encode(",")[0]
    out = vinf.process_prompt(chat("List three colors, separated by commas."),
                              SamplingParams(max_tokens=40, temperature=0.0, stop_token_ids=[comma]))
    assert out.finish_reason == "stop" and "," not in out.text
    out = vinf.process_prompt(CHAT_PROMPT, SamplingParams(max_tokens=3, temperature=0.0))
    assert out.generated_tokens == 3 and out.finish_reason == "length" and out.text == "The capital of"


def test_long_prompts_error_or_keep_the_end(default_model):
    model, processor = default_model
    small = vInference(model, processor, generation_config=vInferenceConfig(max_new_tokens=8000, streaming_chunks=4))
    assert small.model_prefill_length == 8192 - 8000
    long_prompt = "word " * 400 + "What is the capital of France?"
    with pytest.raises(ValueError, match="more than the 192 this vInference can prefill"):
        small.process_prompt(long_prompt, GREEDY)
    small.generation_config.truncate_prompt = True
    ids = processor.encode(long_prompt)
    (row,) = small.make_rows(ids, GREEDY)
    assert row.prompt_ids == ids[-192:]  # the end is kept
    with pytest.raises(ValueError, match="no room for a prompt"):
        vInference(model, processor, max_new_tokens=9000).model_prefill_length


def test_bad_prompts_raise_clear_errors(vinf):
    with pytest.raises(TypeError, match="string or a list of OpenAI chat messages"):
        vinf.process_prompt(123, GREEDY)
    with pytest.raises(ValueError, match="empty"):
        vinf.generate(np.zeros((1, 0), np.int32)).__next__()
    with pytest.raises(ValueError, match="out of range for the vocabulary"):
        next(vinf.generate([[1, 2, 10**6]]))
    with pytest.raises(ValueError, match="exceeds this vInference's max_new_tokens"):
        vinf.process_prompt("hi", SamplingParams(max_tokens=65))
    with pytest.raises(ValueError, match="role 'robot'"):
        vinf.process_prompt([{"role": "robot", "content": "x"}], GREEDY)


def test_no_recompilation_after_precompile(vinf, compile_counter):
    variants = [
        ("Hi", SamplingParams(max_tokens=5, temperature=0.0)),
        (chat("Tell me a story about a fox."), SamplingParams(max_tokens=9, temperature=0.9, top_p=0.8, seed=1)),
        ("A somewhat longer prompt " * 4, SamplingParams(max_tokens=7, temperature=1.2, top_k=5, min_p=0.1,
                                                         repetition_penalty=1.3, presence_penalty=0.5,
                                                         frequency_penalty=0.5, stop=["x"])),
    ]
    with compile_counter as counts:
        for prompt, params in variants:
            vinf.process_prompt(prompt, params)
        vinf.process_prompt(["a", "b c", "d e f"], SamplingParams(max_tokens=4, temperature=0.5))  # batch bucket 8
    assert counts["compile"] == 0, counts


def test_same_seed_same_text(vinf):
    params = SamplingParams(max_tokens=24, temperature=1.0, seed=1234)
    a = vinf.process_prompt(chat("Invent a name for a cat."), params).text
    b = vinf.process_prompt(chat("Invent a name for a cat."), params).text
    c = vinf.process_prompt(chat("Invent a name for a cat."), params.replace(seed=99)).text
    assert a == b and a != c


def test_n_samples_and_count_tokens(vinf, default_model):
    outs = vinf.process_prompt(chat("Say a random word."), SamplingParams(max_tokens=8, temperature=1.5, seed=3, n=3))
    assert len(outs) == 3 and all(isinstance(o, PromptOutput) for o in outs)
    assert len({o.text for o in outs}) > 1
    processor = default_model[1]
    assert vinf.count_tokens("hello world") == len(processor.encode("hello world"))
    assert vinf.count_tokens(CHAT_PROMPT) == len(processor.apply_chat_template(CHAT_PROMPT))


def test_concurrent_prompts_share_the_device_and_isolate_errors(vinf):
    prompts = [chat(f"Name a fruit that starts with the letter {c}.") for c in "ABCDEF"] + [12345, "Hello"]
    params = [SamplingParams(max_tokens=12, temperature=0.0)] * 4 + [
        SamplingParams(max_tokens=6, temperature=0.7, seed=5), SamplingParams(max_tokens=10, top_k=3, seed=1),
        GREEDY, SamplingParams(max_tokens=5, temperature=0.0, stop=["!"])]
    progress = []
    before = vinf.metrics.value("vsurge:stage_latency_seconds_count", stage="prefill")
    results = asyncio.run(vinf.process_prompts_concurrently(prompts, 8, params, progress_callback=lambda d, t:
                                                            progress.append((d, t))))
    prefills = vinf.metrics.value("vsurge:stage_latency_seconds_count", stage="prefill") - before
    assert prefills == 1  # the seven valid prompts ran as one device batch
    assert results[6].error and "TypeError" in results[6].error
    assert all(r.error is None and r.text for i, r in enumerate(results) if i != 6)
    assert results[0].text == vinf.process_prompt(prompts[0], params[0]).text  # batched == alone
    assert progress[-1] == (8, 8) and len(progress) == 8


def test_eight_concurrent_greedy_prompts_answer_as_each_alone():
    """Issue 60: a greedy request's tokens do not depend on the rows beside it. The default model as it
    loads by default (GGUF blocks, the kernel's two passes) keeps its passes in every step: a step of
    more than four rows once made one pass, and then 0 of these 8 replies equalled their lone runs and
    the README's question was answered "L'Étoile, la Marseillaise, ..."."""
    import vsurge

    model, processor = vsurge.load("default", progress=False)
    assert model.activation_passes == 2
    inference = vInference(model, processor, generation_config=vInferenceConfig(max_new_tokens=32), seed=0)
    assert inference.precompile(vInferencePreCompileConfig(batch_size=[1, 8], prefill_length=64))
    prompts = [chat(q) for q in ("What is the capital of France?", "Name three primary colors.", "What is 12 times 7?",
                                 "Write a haiku about autumn leaves.", "Say hello in Spanish.", "List two ocean animals.",
                                 "Explain in one sentence why the sky is blue.", "Who wrote Romeo and Juliet?")]
    together = asyncio.run(inference.process_prompts_concurrently(prompts, 8, GREEDY))
    assert [r.text for r in together] == [inference.process_prompt(p, GREEDY).text for p in prompts]
    assert "Paris" in together[0].text, together[0].text


def test_concurrent_stream_events(vinf):
    async def run():
        events = await vinf.process_prompts_concurrently(["Hi", "", chat("Count to three.")], 2,
                                                         SamplingParams(max_tokens=8, temperature=0.0), stream=True)
        return [e async for e in events]

    events = asyncio.run(run())
    kinds = {(i, k) for i, k, _ in events}
    assert (1, "error") in kinds and (0, "final") in kinds and (2, "final") in kinds
    text = "".join(d for i, k, d in events if i == 2 and k == "text")
    final = next(d for i, k, d in events if i == 2 and k == "final")
    assert text == final.text


def test_weights_swap_without_recompiling(vinf, compile_counter):
    scaled = jax.tree.map(lambda w: w * 0.5, vinf.graphstate)
    base = list(vinf.generate([[1, 2, 3]], sampling_params=GREEDY))[-1].row_tokens(0)
    with compile_counter as counts:
        swapped = list(vinf.generate([[1, 2, 3]], graphstate=scaled, sampling_params=GREEDY))[-1].row_tokens(0)
    assert counts["compile"] == 0 and swapped != base


def test_metrics_count_requests_and_tokens(vinf):
    before = vinf.metrics.value("vsurge:generation_tokens_total")
    out = vinf.process_prompt("Hello", SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True))
    assert vinf.metrics.value("vsurge:generation_tokens_total") - before == out.generated_tokens == 5
    assert b"vsurge:time_to_first_token_seconds" in vinf.metrics.exposition()
    assert vinf.metrics.value("vsurge:compile_seconds_count") >= 2


def test_save_and_load_serve_without_compiling(vinf, default_model, tmp_path, compile_counter):
    model, processor = default_model
    # the run's cache holds vinf's programs (the fixture compiled them): saved beside them, save_inference's
    # compiles of its 4 programs load from tmp_path's cache (they took ~15 s compiled again), and its hits
    # there show it asked that directory for every bucket's programs
    link_session_cache_into(tmp_path / "xla_cache")
    try:
        with compile_counter as counts:
            vinf.save_inference(tmp_path)
        assert counts["miss"] == 0 and counts["hit"] >= 4, counts
        meta = (tmp_path / "vinference_metadata.json").read_text()
        assert vinf.uuid4 in meta and '"max_new_tokens": 64' in meta
        with compile_counter as counts:
            loaded = vInference.load_inference(tmp_path, model, processor)
        assert counts["miss"] == 0 and counts["hit"] >= 4, counts  # prefill + decode for each of 2 buckets
        assert loaded.uuid4 == vinf.uuid4 and loaded.compiled_buckets == [(1, 64), (8, 64)]
        assert loaded.process_prompt(CHAT_PROMPT, GREEDY).text == "The capital of France is Paris."
    finally:
        use_session_compilation_cache()  # later tests use the run's cache, not tmp_path


# ---------------------------------------------------------------- the seed's step API (issue 35)
def test_sample_state_holds_prompt_then_generated_tokens(vinf):
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13]]
    ids, mask = np.asarray([[0, 0, 5, 6, 7], prompts[1]]), np.asarray([[0, 0, 1, 1, 1], [1] * 5])  # left-padded
    final = list(vinf.generate(ids, mask, sampling_params=SamplingParams(max_tokens=6, temperature=0.0,
                                                                         ignore_eos=True)))[-1]
    pad = vinf.generation_config.pad_token_id or 0
    assert final.padded_length == 64 and final.sequences.shape == (2, 64 + 64)
    for b, prompt in enumerate(prompts):
        row = final.sequences[b]
        assert row[64 - len(prompt): 64].tolist() == prompt and (row[: 64 - len(prompt)] == pad).all()
        generated = final.sequences[b, final.padded_length:]  # EasyDeL's usual read of the new tokens
        assert generated[:6].tolist() == final.row_tokens(b) and len(final.row_tokens(b)) == 6
        assert (generated[6:] == pad).all()


def _steps(inference, prompt, params, prefill=None, decode=None):
    """Drive one prompt through execute_prefill / execute_decode; kwargs per call -> (tokens, last state)."""
    state = inference.start_state(inference.make_rows(prompt, params))
    state = inference.execute_prefill(state, **(prefill or {}))
    while not state.is_sequence_finished.all():
        state = inference.execute_decode(state, **(decode or {}))
    return state.row_tokens(0), state


def test_execute_steps_run_with_the_weights_they_are_given(vinf):
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    base, _ = _steps(vinf, [1, 2, 3], params)
    scaled = jax.tree.map(lambda w: w * 0.5, vinf.graphstate)
    swapped, _ = _steps(vinf, [1, 2, 3], params, decode={"graphstate": scaled, "graphother": vinf.graphother})
    assert swapped[0] == base[0] and swapped != base  # prefilled with the model's weights, decoded with others
    all_scaled, _ = _steps(vinf, [1, 2, 3], params, prefill={"graphstate": scaled}, decode={"graphstate": scaled})
    assert all_scaled == list(vinf.generate([[1, 2, 3]], graphstate=scaled, sampling_params=params))[-1].row_tokens(0)


def test_execute_steps_take_a_bucket_and_sampling_per_call(vinf):
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    wide = vInferencePreCompileConfig(batch_size=8, prefill_length=64)
    tokens, state = _steps(vinf, [1, 2, 3], greedy, prefill={"compile_config": wide},
                           decode={"compile_config": wide})
    assert state.run.bucket_key == (8, 64) and tokens == _steps(vinf, [1, 2, 3], greedy)[0]
    state = vinf.start_state(vinf.make_rows([1, 2, 3], greedy))
    state = vinf.execute_prefill(state)
    assert state.run.bucket_key == (1, 64)
    with pytest.raises(ValueError, match=r"bucket \(batch, prefill_length\) = \(1, 64\)"):
        vinf.execute_decode(state, compile_config=wide)
    state.run.gen.close()
    with pytest.raises(ValueError, match="holds a 3-token prompt"):
        vinf.execute_prefill(vinf.start_state(vinf.make_rows([1, 2, 3], greedy)),
                             compile_config=vInferencePreCompileConfig(batch_size=1, prefill_length=2))
    # sampling_params: from this call on (here: fewer tokens, then a hotter sampler)
    short, _ = _steps(vinf, [1, 2, 3], greedy, prefill={"sampling_params": SamplingParams(max_tokens=3,
                                                                                           temperature=0.0)})
    assert short == tokens[:3]
    hot = SamplingParams(max_tokens=12, temperature=5.0, seed=1, ignore_eos=True)
    sampled, _ = _steps(vinf, [1, 2, 3], greedy, decode={"sampling_params": hot})
    assert sampled[0] == tokens[0] and sampled != tokens and len(sampled) == 12
    with pytest.raises(ValueError, match="exceeds this vInference's max_new_tokens"):
        _steps(vinf, [1, 2, 3], greedy, decode={"sampling_params": SamplingParams(max_tokens=10**4)})


def test_load_inference_restores_the_input_partition_spec(default_model, tmp_path):
    import json

    from jax.sharding import PartitionSpec

    model, processor = default_model
    spec = PartitionSpec(("data", "fsdp"), None)
    inference = vInference(model, processor, generation_config=vInferenceConfig(max_new_tokens=8),
                           input_partition_spec=spec)
    try:
        inference.save_inference(tmp_path)  # nothing precompiled: metadata only
        meta = json.loads((tmp_path / "vinference_metadata.json").read_text())
        assert meta["input_partition_spec"] == [["data", "fsdp"], None]
        assert vInference.load_inference(tmp_path, model, processor).input_partition_spec == spec
        meta["input_partition_spec"] = "P('data',)"  # files written before: jax's repr of the spec
        (tmp_path / "vinference_metadata.json").write_text(json.dumps(meta))
        assert vInference.load_inference(tmp_path, model, processor).input_partition_spec == PartitionSpec("data")
    finally:
        use_session_compilation_cache()
