"""Hybrid families (recurrent layers beside attention: a state per sequence, kv/recurrent.py) through
the engines. Greedy outputs equal the reference Generator's (dense cache, one sequence at a time),
itself checked against transformers in tests/models/test_models_vs_transformers.py: prompts prefilled in
several chunks of one step and across steps, more prompts than slots (a slot's next sequence starts
from a zero state), a one-token prompt (decoded straight away), preemption, whole-prompt passes."""

from __future__ import annotations

import asyncio

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import vsurge
from vsurge import EngineConfig, SamplingParams, vSurge
from dense_generator import greedy_generate
from tiny_models import chosen

PROMPTS = ["The ducks of the river ran past the old mill where the miller counted them every morning",
           "one two three one two three one two", "Hi", "A", "Seven bells rang over the town square at noon"]
CONFIG = dict(max_slots=3, max_length=64, prefill_tokens=16, chunk_lengths=(8,), row_buckets=(4,),
              window_buckets=(8,), page_size=8, decode_steps=4)
PARAMS = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)


def load_family(tiny_checkpoints, name):
    model, processor = vsurge.load(tiny_checkpoints[name][0], dtype=jnp.float32, progress=False)
    ids = [processor.encode(p) for p in PROMPTS]
    return model, processor, ids, [greedy_generate(model, p, PARAMS.max_tokens) for p in ids]


@pytest.fixture(scope="module")
def hybrid(tiny_checkpoints):
    """Qwen3-Next (Gated DeltaNet), for the tests that run one hybrid family."""
    return load_family(tiny_checkpoints, "qwen3_next")


# (family, engine): each kind of recurrent layer through the paged engine (Granite 4.0-H's Mamba-2 mixer
# is Nemotron-H's; Falcon-H1 holds KV and a state in the same layer); the dense engine's pool differs
# only in how pages are handed out, so one family runs there
ENGINE_RUNS = [("qwen3_next", True), ("qwen3_next", False), ("falcon_h1", True), ("lfm2", True),
               ("nemotron_h", True)]
chosen(*(name for name, _ in ENGINE_RUNS))  # each a registered family's tiny checkpoint


@pytest.fixture(scope="module")
def hybrids(tiny_checkpoints, hybrid):
    """name -> (model, processor, prompt ids, reference tokens), each family loaded once."""
    loaded = {"qwen3_next": hybrid}

    def get(name):
        if name not in loaded:
            loaded[name] = load_family(tiny_checkpoints, name)
        return loaded[name]
    return get


def run(surge, prompts, params=PARAMS, *more):
    """Token ids of `prompts`' answers (then of each further list of prompts in `more`, in turn) from a
    started `surge`, stopped after."""
    surge.compile()
    surge.start()
    try:
        return [[r.token_ids for r in asyncio.run(surge.generate(batch, params))] for batch in (prompts, *more)]
    finally:
        surge.stop(5)


def test_the_state_layout_follows_the_layer_kinds(hybrid):
    config = hybrid[0].config
    assert [config.layer_kind(i) for i in range(config.num_layers)] == ["linear_attention"] * 3 + ["attention"]
    assert len(config.kv_layout) == 1 and config.kv_index(3) == 0 and config.state_index(2) == 2
    parts = dict(config.state_layout[0].parts)
    assert parts == {"conv": (3, 2 * 2 * 16 + 4 * 8), "ssm": (4, 16, 8)}


def test_mlp_only_layers_hold_neither_kv_nor_state():
    """Nemotron-H's MLP-only layers have no KV entry and no state: the indices skip them."""
    import transformers
    from tiny_models import COMMON, TINY_CONFIGS
    from vsurge.models.registry import config_from_hf

    cls_name, extra = TINY_CONFIGS["nemotron_h"]
    config = config_from_hf(getattr(transformers, cls_name)(**{**COMMON, **extra}).to_dict())
    assert [config.layer_kind(i) for i in range(config.num_layers)] == ["mamba2", "attention", "mamba2", "mlp",
                                                                        "mamba2"]
    assert config.attention_layers == (1,) and config.recurrent_layers == (0, 2, 4)
    assert len(config.kv_layout) == 1 and config.kv_index(1) == 0
    assert len(config.state_layout) == 3 and config.state_index(4) == 2


def test_a_layer_can_hold_both_kv_and_a_state(tiny_checkpoints):
    """Falcon-H1 runs attention and a Mamba-2 mixer side by side in every layer: one KV entry and one
    state per layer, each indexed by the layer itself."""
    import json

    from vsurge.models.registry import config_from_hf

    config = config_from_hf(json.loads((tiny_checkpoints["falcon_h1"][0] / "config.json").read_text()))
    n = config.num_layers
    assert config.attention_layers == config.recurrent_layers == tuple(range(n))
    assert len(config.kv_layout) == len(config.state_layout) == n
    assert [config.kv_index(i) for i in range(n)] == [config.state_index(i) for i in range(n)] == list(range(n))
    assert dict(config.state_layout[0].parts) == {"conv": (3, 128 + 2 * 2 * 16), "ssm": (8, 16, 16)}


# families whose shared-prefix resume is checked on the engine of their reference run (the same config:
# one engine compiled, not two); Qwen3-Next's runs in test_a_shared_prefix_..., with its states updated row by row
SHARED_PREFIX_ON_ENGINE_RUN = ("falcon_h1", "lfm2")


@pytest.mark.parametrize("name, paged", ENGINE_RUNS, ids=[f"{n}-{'paged' if p else 'dense'}" for n, p in ENGINE_RUNS])
def test_engines_give_the_reference_tokens(hybrids, name, paged):
    """Five prompts on three slots; the longest (~18 tokens) takes several 8-token chunk rows. (Falcon-H1 and
    LFM2: first the shared-prefix check of test_a_shared_prefix_computes_only_the_tail_after_its_latest_snapshot.)"""
    model, processor, ids, expected = hybrids(name)
    make = vSurge.create_odriver if paged else vSurge.create_vdriver
    surge = make(model, processor, config=EngineConfig(**CONFIG, num_pages=3 * 8))
    assert max(len(p) for p in ids) > 16 and min(len(p) for p in ids) == 1
    if name in SHARED_PREFIX_ON_ENGINE_RUN and paged:
        prompts, cold, hits = shared_prefix_prompts(model, processor, surge)
        got = run(surge, prompts[:1], PARAMS, prompts[1:], PROMPTS)
        # (hits: the start-up warm-up's, the three shared prompts', then the five PROMPTS')
        assert got[:2] == [cold[:1], cold[1:]] and hits[-8:-5] == [0, 40, 40], hits  # the 5 shared pages each
        assert got[2:] == [expected]
    else:
        assert run(surge, PROMPTS) == [expected]


def test_a_model_without_attention_layers_runs_with_no_kv_pages(hybrids):
    """Plain Mamba-2: no attention layer, so no KV pages at all; the pool, sized from free memory,
    still counts each sequence's tokens in pages, and the engine gives the reference tokens."""
    model, processor, ids, expected = hybrids("mamba2")
    assert model.config.attention_layers == () and model.config.kv_layout == ()
    surge = vSurge.create_odriver(model, processor, config=EngineConfig(**CONFIG))
    engine = surge.driver.engines[0]
    assert engine.pool.num_pages == CONFIG["max_slots"] * CONFIG["max_length"] // CONFIG["page_size"]
    assert run(surge, PROMPTS) == [expected]


def test_repeats_resume_from_a_snapshot_exactly(hybrid):
    """A prompt asked again resumes from the states snapshotted at its last page boundary (the prefix
    cache: 16 of its 18 tokens) and gives the reference tokens."""
    model, processor, ids, expected = hybrid
    surge = vSurge.create_odriver(model, processor, config=EngineConfig(**CONFIG, num_pages=3 * 8))
    pool = surge.driver.engines[0].pool
    assert pool.enable_prefix_caching
    pool.add_sequence = counted(pool.add_sequence, hits := [])
    assert run(surge, [PROMPTS[0]], PARAMS, [PROMPTS[0], PROMPTS[1]]) == [expected[:1], expected[:2]]
    assert hits[-3:] == [0, (len(ids[0]) - 2) // 8 * 8, 0] and pool.snapshots.restores == 1


@pytest.mark.parametrize("name,row_by_row", [("qwen3_next", False), ("qwen3_next", True)])
def test_speculation_rolls_the_states_back_to_the_accepted_draft(hybrids, name, row_by_row, monkeypatch):
    """Drafts on a hybrid model: each draft row runs from the state its predecessor left and keeps its
    own in a draft-state row, and the next step starts from the last accepted one's. Greedy tokens
    equal a plain run's with drafts all right, right then wrong, and all wrong (the proposer is
    replaced by one that knows the plain run's tokens: a random model's text seldom repeats), decode
    rows batched and, as Qwen3-Next's large states go, row by row."""
    from vsurge.engine import speculation
    from vsurge.kv import recurrent

    if row_by_row:
        monkeypatch.setattr(recurrent, "ROW_BY_ROW_BYTES", 0)
    model, processor, ids, _ = hybrids(name)
    prompts = [ids[0], ids[1], ids[4]]
    plain = [greedy_generate(model, p, 20) for p in prompts]

    def propose(tokens, k):
        i = next((i for i, p in enumerate(prompts) if tokens[:len(p)] == p), None)
        if i is None:  # the start-up warm-up's prompt
            return []
        at = len(tokens) - len(prompts[i])
        right = plain[i][at:at + k]
        wrong = [(t + 1) % model.config.vocab_size for t in right]
        return [right, right[:1] + wrong[1:], wrong][at % 3]

    monkeypatch.setattr(speculation, "propose", propose)
    surge = vSurge.create_odriver(model, processor, config=EngineConfig(
        **{**CONFIG, "row_buckets": (8,), "max_length": 48}, num_pages=3 * 6, speculative_tokens=3))
    assert surge.driver.engines[0].config.draft_state_rows == 8
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, logprobs=0)
    tokens, logprobs = streamed(surge, prompts, params)
    assert tokens == plain
    scheduler = surge.driver.replicas[0].scheduler
    drafted, kept = scheduler.num_draft_tokens, scheduler.num_accepted_tokens
    assert kept >= 6 and drafted - kept >= 6, (drafted, kept)
    assert surge.metrics.value("vsurge:spec_decode_num_draft_tokens_total") == drafted
    assert surge.metrics.value("vsurge:spec_decode_num_accepted_tokens_total") == kept
    # a state left after a rejected draft changes the logits even where the greedy token stays
    for got, want in zip(logprobs, reference_logprobs(model, prompts, plain)):
        np.testing.assert_allclose(got, want, atol=1e-4)


def reference_logprobs(model, prompts, answers) -> list[list[float]]:
    """Each answer token's logprob after its prompt and the answer before it: one compiled forward of
    the texts padded to one length (causal: the padding after a text changes none of its logits; run
    eagerly, each length compiled op by op took a minute)."""
    texts = [prompt + answer for prompt, answer in zip(prompts, answers)]
    padded = np.zeros((len(texts), max(map(len, texts))), np.int32)
    for row, text in zip(padded, texts):
        row[:len(text)] = text
    reference = jax.nn.log_softmax(nnx.jit(lambda m, ids: m(ids)[0])(model, jnp.asarray(padded)), -1)
    return [[float(reference[row, len(prompt) - 1 + i, t]) for i, t in enumerate(answer)]
            for row, (prompt, answer) in enumerate(zip(prompts, answers))]


def test_bfloat16_states_give_the_reference_within_rounding(hybrid, monkeypatch):
    """`state_dtype="bfloat16"` (the default for 16-bit and quantized weights): states, snapshots and
    draft states are stored in bfloat16 and computed in float32. The state memory halves, and the
    answers stay the reference's: tokens equal, chosen-token logprobs within bfloat16 rounding, with
    decode rows updated in place (the path Qwen3.5-sized states take) and drafts rejected, and a
    repeated prompt resuming from its bfloat16 snapshot."""
    from vsurge.engine import speculation
    from vsurge.engine.pools import state_cache_bytes
    from vsurge.kv import recurrent

    monkeypatch.setattr(recurrent, "ROW_BY_ROW_BYTES", 0)
    model, processor, ids, expected = hybrid
    assert recurrent.state_dtype("auto", model) == jnp.float32
    monkeypatch.setattr(speculation, "propose", lambda tokens, k: [1] * k)  # wrong drafts, mostly
    config = EngineConfig(**{**CONFIG, "row_buckets": (8,)}, num_pages=3 * 8, speculative_tokens=2,
                          state_dtype="bfloat16")
    surge = vSurge.create_odriver(model, processor, config=config)
    engine = surge.driver.engines[0]
    kv = jax.eval_shape(engine._empty_state).kv
    assert {leaf.dtype for leaf in jax.tree.leaves((kv.states, kv.snapshots, kv.drafts))} == {jnp.dtype("bfloat16")}
    rows = engine.pool.snapshots.rows
    assert 2 * state_cache_bytes(model, config, rows) == state_cache_bytes(
        model, config.replace(state_dtype="float32"), rows)
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, logprobs=0)
    prompts = [ids[0], ids[4], ids[0]]
    tokens, logprobs = streamed(surge, prompts, params)
    assert tokens == [expected[0], expected[4], expected[0]]
    assert engine.pool.snapshots.restores >= 1
    want = reference_logprobs(model, prompts, tokens)
    for got, expected_logprobs in zip(logprobs, want):
        np.testing.assert_allclose(got, expected_logprobs, rtol=0, atol=1e-3)
    flat = lambda rows: [v for row in rows for v in row]  # noqa: E731
    assert not np.allclose(flat(logprobs), flat(want), rtol=0, atol=1e-6)  # (rounded: the states were bfloat16)


def test_the_state_dtype_follows_the_weights_and_refuses_unknown_names(hybrid):
    from vsurge.kv import recurrent

    model = hybrid[0]
    half = type("Weights", (), {"param_dtype": jnp.bfloat16, "quantization": None})()
    blocks = type("Weights", (), {"param_dtype": jnp.float32, "quantization": "blocks"})()
    assert recurrent.state_dtype(None, model) == jnp.float32
    assert recurrent.state_dtype("auto", half) == recurrent.state_dtype("auto", blocks) == jnp.bfloat16
    assert recurrent.state_dtype("float32", half) == jnp.float32
    with pytest.raises(ValueError, match="--state-dtype"):
        recurrent.state_dtype("float16", model)
    with pytest.raises(ValueError, match="state_dtype"):
        EngineConfig(state_dtype="int8")


def streamed(surge, prompts, params):
    """(token ids, chosen-token logprobs) of each prompt's answer, streamed from a `surge` started
    and stopped here."""
    tokens, logprobs = [[] for _ in prompts], [[] for _ in prompts]

    async def collect():
        async for [sample] in await surge.generate(prompts, params, stream=True):
            i = sample.metadata["request_index"]
            tokens[i] += sample.token_ids
            logprobs[i] += [lp["logprob"] for lp in sample.logprobs or ()]

    surge.compile()
    surge.start()
    try:
        asyncio.run(collect())
    finally:
        surge.stop(5)
    return tokens, logprobs


def test_a_shared_prefix_computes_only_the_tail_after_its_latest_snapshot(hybrids, monkeypatch):
    """Prompts sharing a 5-page prefix with one cached before: each computes only what follows the
    last snapshotted page boundary inside the shared part, and gives the tokens of a cold run, for
    every kind of recurrent layer. Here Qwen3-Next's decode rows update their DeltaNet states in place
    one row after another, as a real model's large states do (kv/recurrent.py; the tiny states are
    below the size, so it is lowered; test_engines_give_the_reference_tokens runs the batched path)."""
    from vsurge.kv import recurrent

    monkeypatch.setattr(recurrent, "ROW_BY_ROW_BYTES", 0)
    # (Falcon-H1's and LFM2's layers: on their engine runs' engines, test_engines_give_the_reference_tokens)
    model, processor, _, _ = hybrids("qwen3_next")
    surge = vSurge.create_odriver(model, processor, config=EngineConfig(**CONFIG, num_pages=3 * 8))
    prompts, cold, hits = shared_prefix_prompts(model, processor, surge)
    assert run(surge, prompts[:1], PARAMS, prompts[1:]) == [cold[:1], cold[1:]]
    assert hits[-3:] == [0, 40, 40]  # the 5 shared pages each


def shared_prefix_prompts(model, processor, surge):
    """Three prompts sharing a 5-page prefix, their cold greedy tokens, and the list `surge`'s pool appends
    each admitted prompt's cached tokens to."""
    shared = processor.encode(" ".join(PROMPTS[0] for _ in range(3)))[:41]  # 5 pages and a token
    prompts = [shared + processor.encode(tail) for tail in (" and the end", " but then", " so")]
    pool = surge.driver.engines[0].pool
    pool.add_sequence = counted(pool.add_sequence, hits := [])
    return prompts, [greedy_generate(model, p, PARAMS.max_tokens) for p in prompts], hits


def counted(add_sequence, hits: list):
    """The pool's add_sequence, appending each admitted prompt's cached tokens to `hits`."""
    def add(table, tokens, slot=None):
        hits.append(add_sequence(table, tokens, slot))
        return hits[-1]
    return add


def test_preemption_recomputes_the_state(hybrid):
    """Nine pages for three sequences of up to 48 tokens: preempted ones recompute their states. One
    snapshot row, as the host-tier test's engine below: its programs are these (that test then loads them
    from the run's cache: ~8 s of compiling less)."""
    model, processor, ids, expected = hybrid
    surge = vSurge.create_odriver(model, processor, config=EngineConfig(**CONFIG, num_pages=9, state_snapshots=1))
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    [got] = run(surge, PROMPTS[:3], params)
    assert surge.metrics.value("vsurge:num_preemptions_total") > 0
    assert got == [greedy_generate(model, p, 30) for p in ids[:3]]


def test_preemption_swaps_snapshots_to_the_host_tier_and_back(hybrid):
    """One snapshot row and a host tier: evicted snapshots go to host memory, and preempted sequences
    (their pages swapped out) resume from them; the tokens are the reference's."""
    model, processor, ids, expected = hybrid
    surge = vSurge.create_odriver(model, processor, config=EngineConfig(
        **CONFIG, num_pages=9, state_snapshots=1, kv_host_cache_bytes=16 << 20))
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    [got] = run(surge, PROMPTS[:3], params)
    pool = surge.driver.engines[0].pool
    assert surge.metrics.value("vsurge:num_preemptions_total") > 0 and pool.swap_outs > 0
    assert pool.snapshots.to_host > 0 and pool.snapshots.from_tiers > 0
    for event, n in (("to_host", pool.snapshots.to_host), ("from_tiers", pool.snapshots.from_tiers)):
        # (the pool's counters include the start-up warm-up's, which the metrics leave out)
        assert 0 < surge.driver.metrics.value("vsurge:state_snapshots_total", event=event) <= n, event
    assert got == [greedy_generate(model, p, 30) for p in ids[:3]]
    pool.check()


def test_a_restart_resumes_a_prefix_from_its_snapshots_on_disk(hybrid, tmp_path):
    """With a disk tier every snapshot is written beside the pages, so a restarted engine resumes a
    cached prefix from disk (the states and the KV), and its greedy tokens equal a cold run's."""
    model, processor, _, _ = hybrid
    shared = processor.encode(" ".join(PROMPTS[0] for _ in range(3)))[:41]  # 5 pages and a token
    prompts = [shared + processor.encode(tail) for tail in (" and the end", " but then")]
    cold = [greedy_generate(model, p, 6) for p in prompts]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    config = EngineConfig(**CONFIG, num_pages=3 * 8, kv_cache_dir=str(tmp_path))
    first = vSurge.create_odriver(model, processor, config=config)
    assert run(first, prompts[:1], params) == [cold[:1]]
    snaps = first.driver.engines[0].pool.snapshots
    snaps.host.disk.flush()
    assert len(snaps.host.disk) >= 5  # one at each of the shared pages' ends
    second = vSurge.create_odriver(model, processor, config=config)  # a restart: nothing on the device
    pool = second.driver.engines[0].pool
    pool.add_sequence = counted(pool.add_sequence, hits := [])
    assert run(second, prompts[1:], params) == [cold[1:]]
    # (the start-up warm-up's prompt of padding resumed from a snapshot on disk too)
    assert hits[-1] == 40 and pool.snapshots.from_tiers == 2


def test_prompt_scoring_runs_each_prompt_from_a_fresh_state(hybrid, tiny_checkpoints):
    """The whole-prompt pass gives each prompt a row of its own (a state runs along a row): token
    logprobs equal transformers' log-softmax on the same weights."""
    import torch
    from test_models_vs_transformers import reference_logits

    model, processor, ids, _ = hybrid
    surge = vSurge.create_odriver(model, processor, config=EngineConfig(**CONFIG, num_pages=3 * 8))
    surge.start()
    try:
        scored = asyncio.run(surge.encode(ids[1:3], "score"))
    finally:
        surge.stop(5)
    for prompt, got in zip(ids[1:3], scored):
        logits = torch.tensor(reference_logits(tiny_checkpoints["qwen3_next"][1], np.array(prompt)))
        logp = torch.log_softmax(logits, -1).numpy()
        np.testing.assert_allclose(got.logprobs, [logp[t - 1, prompt[t]] for t in range(1, len(prompt))], atol=2e-4)


def test_vinference_gives_the_reference_text(tiny_checkpoints):
    from vsurge import vInference, vInferenceConfig

    model, processor = vsurge.load(tiny_checkpoints["qwen3_5"][0], dtype=jnp.float32, progress=False)
    vi = vInference(model, processor, generation_config=vInferenceConfig(max_new_tokens=8, streaming_chunks=4))
    outputs = vi.process_prompt(PROMPTS[:2], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    assert [o.text for o in outputs] == [processor.decode(greedy_generate(model, processor.encode(p), 8))
                                         for p in PROMPTS[:2]]


def test_tiled_value_heads_of_a_qwen35_gguf_through_the_paged_engine(tiny_checkpoints, tmp_path, default_gguf_path):
    """llama.cpp's qwen35 stores twice as many value heads as key heads in tiled order; the model tiles
    q/k to match, which the engine's in-place decode kernel then sees as one key head per value head:
    the engine's greedy tokens equal those of the HF checkpoint. The file holds a multi-token-prediction
    layer after the model's own, as the converter writes a released checkpoint: not run."""
    from gguf_families import with_nextn_blocks, write_family_gguf

    folder = tiny_checkpoints["qwen3_5"][0]
    write_family_gguf(tmp_path / "qwen35.gguf", folder, default_gguf_path)
    with_nextn_blocks(tmp_path / "qwen35.gguf", tmp_path / "qwen35-mtp.gguf")
    model, processor = vsurge.load(tmp_path / "qwen35-mtp.gguf", dtype=jnp.float32, progress=False)
    assert model.config.value_heads_tiled and model.config.num_layers == 4
    _, _, ids, expected = load_family(tiny_checkpoints, "qwen3_5")
    surge = vSurge.create_odriver(model, processor, config=EngineConfig(**CONFIG, num_pages=3 * 8))
    assert run(surge, PROMPTS) == [expected]
