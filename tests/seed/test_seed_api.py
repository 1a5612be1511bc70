"""The seed API's compatibility surface (seed/, server/handlers.py): every
shim, called the way code written against EasyDeL calls it, plus the bugs found in the old surface."""

from __future__ import annotations

import asyncio
import threading

import jax
import numpy as np
import pytest

import vsurge
from vsurge import SamplingParams, oEngine, vEngine, vInference, vInferenceConfig, vSurge, vSurgeRequest
from vsurge.seed.engines import ModelOutputBatch, Prefix, ResultTokens
from dense_generator import greedy_generate
from vsurge.server.adapters.chat import ChatCompletionRequest
from vsurge.server.protocol import CountTokenRequest
from vsurge.vsurge import vSurgeMetadata
from tiny_models import write_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, default_processor_dir):
    """A tiny Llama with the default model's tokenizer: the shims translate calls whatever the model, and
    its programs compile in a fraction of the default model's 30 layers."""
    folder = tmp_path_factory.mktemp("tiny_seed")
    write_tiny_model("llama", folder, default_processor_dir)
    return vsurge.load(folder, dtype="float32", progress=False)


@pytest.fixture(scope="module")
def v_engine(tiny):
    with pytest.warns(UserWarning, match="batch_size has no effect"):
        engine = vEngine(*tiny, max_concurrent_decodes=4, max_length=64, prefill_lengths=[16], batch_size=3)
    return engine


def test_vengine_prefill_insert_decode_loop_matches_greedy(v_engine, tiny):
    model, processor = tiny
    prompt = [5, 17, 300, 42, 7]
    tokens = np.zeros((1, 16), np.int32)
    tokens[0, :5] = prompt
    state = v_engine.init_decode_state("ignored", extra=1)  # the seed's *args/**kwargs are accepted
    prefix, first = v_engine.prefill(None, None, tokens, tokens > 0, 5, temperature=0.0, top_p=1.0, top_k=0,
                                     rngs=v_engine.prng_key, max_new_tokens=10)
    assert isinstance(prefix, Prefix) and isinstance(prefix, vsurge.GenerationState)
    assert isinstance(first, ResultTokens) and int(first.tokens[0]) == prefix.sequence.tokens[-1]
    state = v_engine.insert(prefix, state, 2)
    got = [int(first.tokens[0])]
    for _ in range(5):
        state, result = v_engine.decode(None, None, state, v_engine.prng_key)
        assert isinstance(result, ResultTokens) and result.valid.tolist() == [False, False, True, False]
        got.append(int(result.tokens[2]))
    assert got == greedy_generate(model, prompt, 6)
    state = v_engine.bulk_insert(prefix, state, [0, 1])  # one prefix copied into two slots
    state, result = v_engine.decode(None, None, state)
    assert result.tokens[0] == result.tokens[1] == got[1] and result.valid[:3].all()
    assert v_engine.free_resource(2) and not v_engine.free_resource(3)
    for slot in (0, 1):
        v_engine.free_resource(slot)
    assert v_engine.pool.num_used_pages == 0


def test_vengine_properties_and_shardings(v_engine):
    assert (v_engine.max_prefill_length, v_engine.prefill_lengths, v_engine.max_length) == (63, [16], 64)
    assert v_engine.max_concurrent_prefill >= 1 and v_engine.samples_per_slot == 1
    assert v_engine.batch_size == 3 and v_engine.colocated_cpus is None
    assert not np.array_equal(jax.random.key_data(v_engine.prng_key), jax.random.key_data(v_engine.prng_key))
    shardings = v_engine.get_state_shardings(is_decode=True)  # the seed's tuple, one per array
    state = v_engine.init_decode_state()
    assert isinstance(shardings, tuple) and len(shardings) == len(jax.tree.leaves(state))
    assert all(leaf.sharding == s for leaf, s in zip(jax.tree.leaves(state), shardings))
    prefix, _ = v_engine.prefill(None, None, np.asarray([[5, 6, 7]]), None, 3, 0.0, 1.0)
    row = prefix.rows[0]
    prefill_shardings = v_engine.get_state_shardings()  # is_decode=False: a prefill's state
    assert isinstance(prefill_shardings, tuple) and prefill_shardings != shardings
    arrays = jax.tree.leaves((row.k, row.v, row.first))
    assert len(prefill_shardings) == len(arrays)
    assert all(a.sharding.is_equivalent_to(s, a.ndim) for a, s in zip(arrays, prefill_shardings))
    assert isinstance(v_engine.get_prefix_destination_sharding(), jax.sharding.Sharding)


def test_oengine_forward_returns_a_model_output_batch(tiny):
    model, processor = tiny
    engine = oEngine(model, processor, max_concurrent_decodes=2, max_length=64, prefill_lengths=[16], num_pages=8,
                     page_size=16)
    scheduler, state = engine.new_scheduler(), engine.init_decode_state()
    from vsurge.engine.request import ActiveRequest, ReturnChannel
    from vsurge.engine.sequence import Sequence

    request = ActiveRequest([5, 17, 300], SamplingParams(max_tokens=4, temperature=0.0), 0, 4, [], ReturnChannel())
    scheduler.add(Sequence.of(request, processor))
    plan = scheduler.schedule()
    out = engine.forward(None, None, state, plan)
    assert isinstance(out, ModelOutputBatch) and out.prefill_row == 0
    assert int(out.tokens[0, out.prefill_row]) == greedy_generate(model, [5, 17, 300], 1)[0]


def test_vinference_step_methods(tiny):
    model, processor = tiny
    inf = vInference(model, processor, generation_config=vInferenceConfig(max_new_tokens=8, streaming_chunks=4))
    kwargs = inf.adjust_kwargs(np.asarray([[0, 0, 5, 6], [7, 8, 9, 10]]), np.asarray([[0, 0, 1, 1], [1, 1, 1, 1]]))
    assert kwargs["prompts"] == [[5, 6], [7, 8, 9, 10]]
    with pytest.warns(UserWarning, match="'pixel_values' is not used"):
        inf.adjust_kwargs([[1, 2]], pixel_values=1)
    rows = [r for ids in kwargs["prompts"] for r in inf.make_rows(ids, SamplingParams(max_tokens=8, temperature=0))]
    state = inf.start_state(rows)
    state = inf.execute_prefill(state)
    assert (state.generated_tokens_per_row == 1).all()
    state = inf.execute_decode(state)
    assert (state.generated_tokens_per_row == 5).all()
    assert inf.execute_decode(state, func=lambda s: "custom") == "custom"
    states = list(inf.generate([[5, 6]], position_ids=[[0, 1]], sampling_params=SamplingParams(max_tokens=8,
                                                                                                temperature=0)))
    assert states[-1].row_tokens(0) == greedy_generate(model, [5, 6], 8)
    assert inf.precompile(vsurge.vInferencePreCompileConfig(batch_size=1, prefill_length=10**6)) is False


def test_vinference_streams_of_a_list_can_be_read_in_turns(tiny):
    """Old bug: the generators of process_prompt([a, b], stream=True) deadlocked when read in turns."""
    model, processor = tiny
    inf = vInference(model, processor, generation_config=vInferenceConfig(max_new_tokens=8, streaming_chunks=2))
    gens = inf.process_prompt(["Hello", "Once upon a time"], SamplingParams(max_tokens=8, temperature=0.0),
                              stream=True)
    done = threading.Event()
    texts = ["", ""]

    def read():
        for pieces in zip(*gens):
            texts[0] += pieces[0]
            texts[1] += pieces[1]
        done.set()

    threading.Thread(target=read, daemon=True).start()
    assert done.wait(120), "reading the streams in turns blocked"
    assert all(texts)


def test_vsurge_seed_helpers_and_metadata(dense_surge, default_model):
    processor = default_model[1]
    ids = processor.encode("caf\u00e9 \U0001f600")
    byte_token = next(t for t in ids if "\ufffd" in processor.decode([t]))
    sample = vsurge.ReturnSample(text="", token_ids=[byte_token], accumulated_text="", tokens_per_second=1.0,
                                 num_generated_tokens=1, time_spent_computing=0.1)
    whole = vsurge.ReturnSample(text="ok", token_ids=[processor.encode("ok")[0]], accumulated_text="ok",
                                tokens_per_second=2.0, num_generated_tokens=2, time_spent_computing=0.2)
    assert dense_surge.should_buffer_response([sample]) and not dense_surge.should_buffer_response([whole])
    assert dense_surge.process_client_side_tokenization_response([whole]) == [whole]
    joined = dense_surge.process_server_side_tokenization_response([whole], [[sample]])
    assert joined == [("ok", [byte_token, whole.token_ids[0]], 2.0, 2)]

    seen = {}
    original = dense_surge.driver.submit_request

    def spy(request):
        seen.update(request.metadata)
        return original(request)

    dense_surge.driver.submit_request = spy
    try:
        request = vSurgeRequest(prompt="Hi", max_tokens=2, temperature=0.0,
                                metadata=vSurgeMetadata({"request_id": "abc"}))

        async def run():
            return [s async for samples in dense_surge.complete(request) for s in samples]

        assert asyncio.run(run())[-1].finish_reason
    finally:
        dense_surge.driver.submit_request = original
    assert seen == {"request_id": "abc"}
    results = asyncio.run(dense_surge.generate("Hi", SamplingParams(max_tokens=2, temperature=0.0)))
    assert isinstance(results, list) and len(results) == 1  # one entry per prompt, as the seed returns


def test_api_server_handlers_are_methods(dense_surge):
    from vsurge import vSurgeApiServer

    server = vSurgeApiServer({"smol": dense_surge}, max_workers=3)

    async def run():
        models = await server.available_inference()
        count = await server.count_tokens(CountTokenRequest(text="hello world"))
        alive, ready = await server.liveness(), await server.readiness()
        reply = await server.chat_completions(ChatCompletionRequest(
            messages=[{"role": "user", "content": "What is the capital of France?"}], temperature=0.0, max_tokens=16))
        return models, count, alive, ready, reply

    models, count, alive, ready, reply = asyncio.run(run())
    assert models["data"][0]["id"] == "smol" and count["count"] == 2 and alive == {"status": "alive"}
    assert ready == {"status": "ready"} and b"Paris" in reply.body
    # metrics carry the served name (the old bug: the GGUF's internal name)
    assert 'model_name="smol"' in server.metrics_text().decode()
    assert dense_surge.metrics.model_name == "smol"


def test_seed_names_import_from_the_package():
    for name in ("vSurgeApiServer", "vSurge", "vSurgeRequest", "vDriver", "vEngine", "oDriver", "oEngine",
                 "PagedAttentionCache", "HBMPageManager", "vInference", "SampleState", "PromptOutput"):
        assert getattr(vsurge, name).__name__ == name
    assert issubclass(vSurge, object)


# ---------------------------------------------------------------- the seed's last gaps (issue 22)
def test_seed_base_classes_and_state_type_have_the_seeds_names(v_engine):
    from vsurge import AbstractDriver, AbstractInferenceEngine, GenerationState, oDriver, vDriver

    assert issubclass(vEngine, AbstractInferenceEngine) and issubclass(oEngine, AbstractInferenceEngine)
    assert issubclass(vDriver, AbstractDriver) and issubclass(oDriver, AbstractDriver)
    assert isinstance(v_engine.init_decode_state(), GenerationState)
    with pytest.raises(TypeError, match="abstract"):
        AbstractDriver()


def _batch(prompts, width=16, left=()):
    """(B, width) tokens and valids; rows in `left` are left-padded."""
    tokens, valids = np.zeros((len(prompts), width), np.int32), np.zeros((len(prompts), width), bool)
    for b, p in enumerate(prompts):
        span = slice(width - len(p), width) if b in left else slice(0, len(p))
        tokens[b, span], valids[b, span] = p, True
    return tokens, valids


PROMPTS = [[5, 17, 300, 42, 7], [9, 8, 7], [1000, 2000, 3000, 4000, 5000, 6000, 7000]]


def test_vengine_prefill_takes_a_batch_its_valids_and_its_key_in_the_seeds_order(v_engine, tiny):
    model, _ = tiny
    tokens, valids = _batch(PROMPTS, left={1})
    lengths = np.asarray([len(p) for p in PROMPTS])
    key = jax.random.PRNGKey(3)
    # seed order: (graphstate, graphothers, tokens, valids, true_length, temperature, top_p, rngs)
    prefixes, first = v_engine.prefill(None, None, tokens, valids, lengths, np.zeros(3), np.ones(3), key)
    assert isinstance(prefixes, vsurge.GenerationState) and len(prefixes) == 3 and prefixes.tokens.shape == (3, 1)
    assert isinstance(first, ResultTokens) and first.tokens.shape == (3,) and first.valid.all()
    assert first.tokens.tolist() == [greedy_generate(model, p, 1)[0] for p in PROMPTS]  # every row, not row 0 only
    # the seed's (batch, max_length) valids: a mask over the whole context, the prompt in its first columns
    wide = np.zeros((3, v_engine.max_length), bool)
    wide[:, :16] = valids
    widened = v_engine.prefill(None, None, tokens, wide, lengths, 0.0, 1.0, key)[1]
    assert widened.tokens.tolist() == first.tokens.tolist()
    with pytest.raises(ValueError, match="valids must be"):
        v_engine.prefill(None, None, tokens, valids[:, :8], lengths, 0.0, 1.0, key)
    with pytest.raises(ValueError, match="valids marks 5 tokens but true_length is 4"):
        v_engine.prefill(None, None, tokens[:1], valids[:1], 4, 0.0, 1.0, key)
    # sampled rows: the key decides the samples
    hot = np.ones(3)
    again = [v_engine.prefill(None, None, tokens, valids, lengths, hot, hot, key)[1].tokens.tolist() for _ in range(2)]
    other = v_engine.prefill(None, None, tokens, valids, lengths, hot, hot, jax.random.PRNGKey(4))[1].tokens.tolist()
    assert again[0] == again[1] and other != again[0]

    # no hidden 16-token cap: a slot decodes on until its context is full
    state = v_engine.bulk_insert(prefixes, v_engine.init_decode_state(), [0, 1, 2])
    got = [[int(t)] for t in np.asarray(first)]
    for _ in range(24):
        state, result = v_engine.decode(None, None, state)
        for b in range(3):
            assert result.valid[b]
            got[b].append(int(result.tokens[b]))
    assert got == [greedy_generate(model, p, 25) for p in PROMPTS]
    for slot in range(3):
        v_engine.free_resource(slot)


def test_decode_samples_with_its_key(v_engine):
    tokens, valids = _batch(PROMPTS[:1])

    def run(decode_key):
        prefix, first = v_engine.prefill(None, None, tokens, valids, 5, 1.0, 1.0, jax.random.PRNGKey(7))
        state = v_engine.insert(prefix, v_engine.init_decode_state(), 0)
        out = []
        for step in range(4):
            state, result = v_engine.decode(None, None, state, jax.random.fold_in(decode_key, step))
            out.append(int(result.tokens[0]))
        v_engine.free_resource(0)
        return out

    a, b, c = run(jax.random.PRNGKey(1)), run(jax.random.PRNGKey(1)), run(jax.random.PRNGKey(2))
    assert a == b and a != c


def test_oengine_prefill_takes_top_k_before_the_key(tiny):
    model, processor = tiny
    engine = oEngine(model, processor, max_concurrent_decodes=2, max_length=64, prefill_lengths=[16], num_pages=8,
                     page_size=16)
    tokens, valids = _batch(PROMPTS[:2])
    # seed order: (..., temperature, top_p, top_k, rngs)
    prefixes, first = engine.prefill(None, None, tokens, valids, [5, 3], 0.0, 1.0, 0, jax.random.PRNGKey(0))
    assert first.tokens.tolist() == [greedy_generate(model, p, 1)[0] for p in PROMPTS[:2]]
    top1 = engine.prefill(None, None, tokens, valids, [5, 3], 1.0, 1.0, 1, jax.random.PRNGKey(5))[1]
    assert top1.tokens.tolist() == first.tokens.tolist()  # top_k=1 at temperature 1 is greedy: top_k is honoured


def test_vinference_count_tokens_takes_the_seeds_keywords(default_model):
    model, processor = default_model
    inf = vInference(model, processor, generation_config=vInferenceConfig(max_new_tokens=8))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]
    prefilled = len(processor.apply_chat_template(messages))
    assert inf.count_tokens(messages=messages) == inf.count_tokens(messages) == prefilled
    hello = len(processor.encode("hello world"))
    assert inf.count_tokens(text="hello world") == inf.count_tokens("hello world") == hello
    # oai_like: OpenAI's way of counting chat input (3 per message + content, 3 to prime the reply)
    contents = [len(processor.encode(m["content"], add_special_tokens=False)) for m in messages]
    assert inf.count_tokens(messages=messages, oai_like=True) == 3 + sum(3 + n for n in contents)
    assert inf.count_tokens(text="hello world", oai_like=True) == len(processor.encode("hello world",
                                                                                        add_special_tokens=False))
    with pytest.raises(TypeError, match="not both"):
        inf.count_tokens(messages=messages, text="hi")
    with pytest.raises(TypeError, match="needs messages"):
        inf.count_tokens()


def test_vinference_generate_returns_the_final_sample_state(tiny):
    model, processor = tiny
    inf = vInference(model, processor, generation_config=vInferenceConfig(max_new_tokens=8, streaming_chunks=4))
    states, gen = [], inf.generate([[5, 6, 7]], sampling_params=SamplingParams(max_tokens=8, temperature=0.0))
    while True:
        try:
            states.append(next(gen))
        except StopIteration as end:
            final = end.value
            break
    assert isinstance(final, vsurge.SampleState) and final is states[-1]
    assert final.is_sequence_finished.all() and final.row_tokens(0) == greedy_generate(model, [5, 6, 7], 8)


# ---------------------------------------------------------------- the seed's last differences (issue 35)
def test_vsurge_request_from_sampling_params_takes_the_seeds_keyword():
    params = SamplingParams(max_tokens=7, temperature=0.3, top_k=4, stop=["\n"])
    for request in (vSurgeRequest.from_sampling_params(prompt="Hi", sampling_params=params),
                    vSurgeRequest.from_sampling_params("Hi", params),
                    vSurgeRequest.from_sampling_params("Hi", params=params)):  # the older keyword
        assert (request.prompt, request.max_tokens, request.temperature, request.top_k) == ("Hi", 7, 0.3, 4)
        assert request.to_sampling_params() == params
    with pytest.raises(TypeError, match="not both"):
        vSurgeRequest.from_sampling_params("Hi", sampling_params=params, params=params)


def test_client_side_tokenization_takes_a_text_prompt(dense_surge, default_model):
    """The seed's is_client_side_tokenization is about the output (token ids, no text): its prompt is a str."""
    processor = default_model[1]

    async def run(prompt, client_side):
        request = vSurgeRequest(prompt=prompt, max_tokens=6, temperature=0.0, is_client_side_tokenization=client_side)
        return [s async for samples in dense_surge.complete(request) for s in samples]

    ids = asyncio.run(run("The capital of France is", True))
    text = asyncio.run(run("The capital of France is", False))
    assert all(s.text == "" for s in ids) and ids[-1].finish_reason
    assert [t for s in ids for t in s.token_ids] == [t for s in text for t in s.token_ids]
    tokenized = asyncio.run(run(processor.encode("The capital of France is"), True))
    assert [t for s in tokenized for t in s.token_ids] == [t for s in ids for t in s.token_ids]


def test_api_server_max_workers_sizes_its_thread_pool(dense_surge):
    from fastapi.testclient import TestClient

    from vsurge import vSurgeApiServer

    server = vSurgeApiServer({"smol": dense_surge}, max_workers=3)
    assert server.executor._max_workers == 3
    with TestClient(server.app) as client:  # the loop it serves on runs blocking work on those threads
        async def where():
            return await asyncio.to_thread(lambda: threading.current_thread().name)

        assert client.portal.call(where).startswith("vsurge-server")
    with pytest.raises(ValueError, match="max_workers"):
        vSurgeApiServer({"smol": dense_surge}, max_workers=0)
    with pytest.warns(UserWarning, match="oai_like_processor=False has no effect"):
        vSurgeApiServer({"smol": dense_surge}, oai_like_processor=False)


def test_seed_layering_the_engine_imports_nothing_from_seed():
    """(vInference now lives in seed/; tests/test_structure.py checks every package outside seed/)"""
    import pathlib
    import re

    root = pathlib.Path(vsurge.__file__).parent
    for package in ("engine",):
        paths = list((root / package).glob("*.py"))
        assert len(paths) > 10, package  # the folder is there: a loop over nothing checks nothing
        for path in paths:
            text = path.read_text()
            imports = re.findall(r"^\s*(?:from|import)\s+(\S+)", text, re.M)
            assert not [m for m in imports if m.startswith("..seed") or m.startswith("vsurge.seed")], path


def test_from_config_builds_vsurges_own_engines_and_the_seed_constructors_its_classes(tiny):
    from vsurge import EngineConfig, oDriver, vDriver
    from vsurge.engine.core import EngineCore
    from vsurge.engine.driver import Driver

    model, processor = tiny
    config = EngineConfig(max_slots=2, max_length=64, page_size=16, num_pages=8)
    own = vSurge.from_config(model, processor, config, paged=True, vsurge_name="own")
    engine = own.driver.engines[0]
    assert type(own.driver) is Driver and type(engine) is EngineCore and engine.config.num_pages == 8
    dense_pool = vSurge.from_config(model, processor, config, paged=False).driver.engines[0].pool
    assert type(dense_pool).__name__ == "SlotPages"
    paged = vSurge.create_odriver(model, processor, max_concurrent_decodes=2, max_length=64, page_size=16, num_pages=8,
                                  decode_steps=2, max_queue=5)
    assert isinstance(paged.driver, oDriver) and isinstance(paged.driver.engines[0], oEngine)
    assert paged.driver.engines[0].config.decode_steps == 2 and paged.driver.max_queue == 5  # field / deployment
    dense = vSurge.create_vdriver(model, processor, config=config)
    assert isinstance(dense.driver, vDriver) and isinstance(dense.driver.engines[0], vEngine)
