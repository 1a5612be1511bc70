"""LoRA adapters (ops/lora.py, lora/): random PEFT adapters written by `peft` on tiny random
checkpoints. The model's logits with each adapter, several adapters and the base mixed in one pass,
equal PEFT's own model in float32 (<= 1e-4); bad adapters are refused with an error naming why; the
compiled pass multiplies every slot in one dot per site and never merges an adapter into a weight."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from vsurge.loading import load
from vsurge.lora import stacks
from vsurge.lora.adapter import AdapterError, load_peft
from vsurge.ops.lora import lora_rows
from lora_helpers import generate_with_adapters
from tiny_models import chosen, write_tiny_model

TOL = 1e-4
FAMILIES = chosen("llama", "qwen2", "phi3", "glm4", "gemma2")  # plain, biases, fused HF qkv/gate_up, interleaved rotary, gemma
SLOTS, RANK = 3, 8
WITH_EMBED_AND_HEAD = r".*(_proj|lm_head|embed_tokens)"  # PEFT's target_modules as a regex: every projection too


def write_peft_adapter(base_dir, folder, tokenizer_dir, rank: int, seed: int, **config):
    """A random LoRA adapter on every linear projection (B non-zero), saved by PEFT; -> PEFT's model."""
    from peft import LoraConfig, get_peft_model

    base = write_tiny_model(config.pop("family"), base_dir, tokenizer_dir, **config.pop("base", {}))  # (seeds torch)
    torch.manual_seed(seed)
    model = get_peft_model(base, LoraConfig(r=rank, lora_alpha=config.pop("alpha", 2 * rank),
                                            target_modules=config.pop("targets", "all-linear"),
                                            init_lora_weights=False, **config))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.normal_(0.0, 0.1)
    model.save_pretrained(folder)
    return model.eval()


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory, default_processor_dir):
    """(our float32 model with adapter slots, [(adapter, its PEFT model)], the base torch model)."""
    name = request.param
    root = tmp_path_factory.mktemp(f"lora_{name}")
    torch_base = write_tiny_model(name, root / "base", default_processor_dir)
    adapters = []
    # the second adapter also adapts the embedding and the output head (PEFT's Embedding and lm_head LoRA)
    for k, (rank, rslora, targets) in enumerate(((RANK, False, "all-linear"), (4, True, WITH_EMBED_AND_HEAD))):
        peft_model = write_peft_adapter(root / f"base{k}", root / f"adapter{k}", default_processor_dir, rank,
                                        seed=10 + k, family=name, use_rslora=rslora, targets=targets)
        adapters.append(peft_model)
    model, _ = load(str(root / "base"), dtype="float32", progress=False, load_processor=False)
    stacks.attach(model, SLOTS, RANK)
    loaded = [load_peft(f"a{k}", root / f"adapter{k}", model, RANK) for k in range(len(adapters))]
    return model, list(zip(loaded, adapters)), torch_base, root


def forward_with(model):
    graphdef, state = nnx.split(model)

    @jax.jit
    def run(state, tokens, ids):
        with lora_rows(ids):
            logits, _ = nnx.merge(graphdef, state)(tokens)
        return logits

    return lambda tokens, ids: np.asarray(run(state, jnp.asarray(tokens), jnp.asarray(ids)))


def reference(torch_model, tokens) -> np.ndarray:
    with torch.no_grad():
        return torch_model(torch.tensor(tokens, dtype=torch.long)).logits.numpy()


def test_logits_equal_peft_per_adapter_and_base(family):
    model, adapters, torch_base, _ = family
    for slot, (adapter, _) in enumerate(adapters):
        stacks.write(model, slot + 1, adapter)  # slot 0 stays empty: a slot without an adapter adds nothing
    rng = np.random.default_rng(0)
    prompts = rng.integers(0, model.config.vocab_size, (3, 9))
    refs = [reference(torch_base, prompts[:1]), reference(adapters[0][1], prompts[1:2]),
            reference(adapters[1][1], prompts[2:3])]
    # the base (ids -1), adapter 0 (slot 1), adapter 1 (slot 2); mixing them in one stream: the next test
    forward = forward_with(model)
    for row, (ids, ref) in enumerate(zip((-1, 1, 2), refs)):
        got = forward(prompts[row:row + 1], np.full(9, ids, np.int32))
        assert np.abs(got - ref).max() <= TOL, (row, np.abs(got - ref).max())
    # the adapters change the logits (else the test above proves nothing)
    assert np.abs(refs[1] - reference(torch_base, prompts[1:2])).max() > 1e-2
    # without adapter ids (a pass outside a step) nothing is added
    graphdef, state = nnx.split(model)
    plain = np.asarray(nnx.merge(graphdef, state)(jnp.asarray(prompts[1:2]))[0])
    assert np.abs(plain - reference(torch_base, prompts[1:2])).max() <= TOL


def test_rows_of_different_adapters_in_one_stream_get_their_own_deltas(family):
    """A step's token stream mixes sequences: each token takes its own adapter's delta. Checked on one
    projection site at a time against the per-adapter dots (numpy)."""
    model, adapters, _, _ = family
    from vsurge.ops.lora import lora_deltas

    layer = model.layers[0]
    a, bs = layer.lora_qkv_a[...], (layer.lora_q_b[...], layer.lora_k_b[...], layer.lora_v_b[...])
    x = np.random.default_rng(1).normal(size=(1, 6, a.shape[0])).astype(np.float32)
    ids = np.array([1, -1, 2, 2, 0, 1], np.int32)
    with lora_rows(jnp.asarray(ids)):
        deltas = lora_deltas(jnp.asarray(x), a, bs)
    a_np, b_np = np.asarray(a), [np.asarray(b) for b in bs]
    for t, slot in enumerate(ids):
        for s, d in enumerate(deltas):
            want = 0 if slot < 0 else x[0, t] @ a_np[:, slot, s] @ b_np[s][slot]
            np.testing.assert_allclose(np.asarray(d)[0, t], want, atol=1e-5)


def test_compiled_pass_has_one_dot_per_site_however_many_slots(family):
    """2 + 2 + 3 + 2 dots of adapters per layer (A then B of each projection: qkv 1 + 3, o 1 + 1,
    gate_up 1 + 2, down 1 + 1), plus the embedding's B (its A is read by token) and the head's A and B, the
    same with 3 slots as the count of adapters used: no dot per adapter, and the base weights stay as they
    are (no merged copy)."""
    model, adapters, _, _ = family
    graphdef, state = nnx.split(model)

    def run(state, tokens, ids):
        with lora_rows(ids):
            return nnx.merge(graphdef, state)(tokens)[0]

    def dots(ids_on: bool) -> int:
        fn = run if ids_on else (lambda state, tokens, ids: nnx.merge(graphdef, state)(tokens)[0])
        text = jax.jit(fn).lower(state, jnp.zeros((1, 5), jnp.int32), jnp.zeros(5, jnp.int32)).as_text()
        return text.count("stablehlo.dot_general")

    extra = dots(True) - dots(False)
    assert extra == 11 * model.config.num_layers + 1 + 2, extra  # + the embedding's B, the head's A and B
    weights_before = {k: np.asarray(v) for k, v in model.named_weights().items()}
    stacks.write(model, 0, adapters[0][0])
    assert all(np.array_equal(weights_before[k], np.asarray(v)) for k, v in model.named_weights().items())


# ------------------------------------------------------------ bad adapters
def _adapter_dir(tmp_path, config: dict | None, tensors: dict | None):
    from safetensors.numpy import save_file

    folder = tmp_path / "bad"
    folder.mkdir(exist_ok=True)
    if config is not None:
        (folder / "adapter_config.json").write_text(json.dumps(config))
    if tensors is not None:
        save_file(tensors, str(folder / "adapter_model.safetensors"))
    return folder


BASE_CONFIG = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}
Q = "base_model.model.model.layers.0.self_attn.q_proj"


@pytest.mark.parametrize("case, config, tensors, message", [
    ("no config", None, {}, "no adapter_config.json"),
    ("dora", {**BASE_CONFIG, "use_dora": True}, {}, "DoRA"),
    ("bias", {**BASE_CONFIG, "bias": "all"}, {}, "biases"),
    ("prefix tuning", {"peft_type": "PREFIX_TUNING"}, {}, "not LoRA"),
    ("no weights file", BASE_CONFIG, None, "no adapter_model.safetensors"),
    ("rank too high", {**BASE_CONFIG, "r": 64}, {f"{Q}.lora_A.weight": np.zeros((64, 64), np.float32),
                                                 f"{Q}.lora_B.weight": np.zeros((64, 64), np.float32)}, "--max-lora-rank"),
    ("another base", BASE_CONFIG, {f"{Q}.lora_A.weight": np.zeros((4, 100), np.float32),
                                   f"{Q}.lora_B.weight": np.zeros((64, 4), np.float32)}, "another base model"),
    ("unknown module", BASE_CONFIG, {"base_model.model.model.layers.0.self_attn.rotary.lora_A.weight": np.zeros((4, 4), np.float32),
                                     "base_model.model.model.layers.0.self_attn.rotary.lora_B.weight": np.zeros((4, 4), np.float32)},
     "does not serve adapters on"),
    ("embedding of another vocabulary", BASE_CONFIG,
     {"base_model.model.model.embed_tokens.lora_embedding_A": np.zeros((4, 100), np.float32),
      "base_model.model.model.embed_tokens.lora_embedding_B": np.zeros((576, 4), np.float32)}, "takes 100 inputs"),
    ("resized vocabulary", BASE_CONFIG,
     {"base_model.model.model.embed_tokens.base_layer.weight": np.zeros((50000, 576), np.float32)},
     "resize the vocabulary"),
    ("not a matrix", BASE_CONFIG, {"base_model.model.model.norm.weight": np.zeros((4,), np.float32)},
     "not a LoRA A/B matrix"),
    ("half a pair", BASE_CONFIG, {f"{Q}.lora_A.weight": np.zeros((4, 64), np.float32)}, "lora_B missing"),
])
def test_bad_adapters_are_refused_naming_the_problem(tmp_path, default_model, case, config, tensors, message):
    model = default_model[0]
    with pytest.raises(AdapterError, match=message):
        load_peft("bad", _adapter_dir(tmp_path, config, tensors), model, 16)


def test_a_corrupt_weights_file_is_refused(tmp_path, default_model):
    folder = _adapter_dir(tmp_path, BASE_CONFIG, None)
    (folder / "adapter_model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(AdapterError, match="not a readable safetensors"):
        load_peft("bad", folder, default_model[0], 16)


# ------------------------------------------------------------ the engine: adapters mixed in its steps
# one decode program of 8 rows (the tests' 2 to 8 requests at once): the 2- and 4-row ones only cost compiles
ENGINE = dict(max_slots=8, max_length=64, prefill_tokens=32, chunk_lengths=(16,), row_buckets=(8,), page_size=16,
              decode_steps=4)


@pytest.fixture(scope="module")
def llama_adapters(tmp_path_factory, default_processor_dir):
    """A tiny Llama and three random PEFT adapters of ranks 8, 4, 8 (the third on the embedding and head too):
    (base dir, [(dir, PEFT model)], torch base)."""
    root = tmp_path_factory.mktemp("lora_engine")
    torch_base = write_tiny_model("llama", root / "base", default_processor_dir)
    adapters = [(root / f"adapter{k}", write_peft_adapter(root / f"base{k}", root / f"adapter{k}", default_processor_dir,
                                                           rank, seed=20 + k, family="llama", targets=targets))
                for k, (rank, targets) in enumerate(((8, "all-linear"), (4, "all-linear"), (8, WITH_EMBED_AND_HEAD)))]
    return root / "base", adapters, torch_base


def peft_greedy(torch_model, prompt, steps):
    with torch.no_grad():
        out = torch_model.generate(torch.tensor([prompt]), max_new_tokens=steps, do_sample=False, pad_token_id=0,
                                   eos_token_id=None)
    return out[0, len(prompt):].tolist()


def test_engine_mixes_three_adapters_and_the_base_over_two_slots(llama_adapters):
    """Eight requests (the base and three adapters, two prompts each) at once on an engine with two adapter
    slots: every request gets exactly the greedy tokens of PEFT's model for its adapter; adapters take
    turns in the slots (loaded more than twice), and pages cached under one adapter never serve another."""
    from vsurge import EngineConfig, SamplingParams, vSurge

    base_dir, adapters, torch_base = llama_adapters
    model, processor = load(str(base_dir), dtype="float32", progress=False)
    surge = vSurge.create_odriver(model, processor, config=EngineConfig(**ENGINE, max_loras=2, max_lora_rank=8))
    for k, (folder, _) in enumerate(adapters):
        surge.load_adapter(f"a{k}", str(folder))
    rng = np.random.default_rng(3)
    shared = rng.integers(0, model.config.vocab_size, 20).tolist()  # a page-long prefix every request shares
    prompts = [shared + rng.integers(0, model.config.vocab_size, 5).tolist() for _ in range(2)]
    jobs = [(name, prompt) for name in (None, "a0", "a1", "a2") for prompt in prompts]
    steps = 8
    params = SamplingParams(max_tokens=steps, temperature=0.0, ignore_eos=True)

    surge.compile()
    surge.start()
    try:
        got = generate_with_adapters(surge, [(prompt, params, name) for name, prompt in jobs])
        again = generate_with_adapters(surge, [(prompt, params, name) for name, prompt in jobs])  # cached prefixes
    finally:
        surge.stop(5)
    models = {None: torch_base, **{f"a{k}": peft for k, (_, peft) in enumerate(adapters)}}
    want = [peft_greedy(models[name], prompt, steps) for name, prompt in jobs]
    assert got == want
    assert again == want
    assert len({tuple(w) for w in want}) == len(want)  # the adapters make a difference
    assert surge.engine.adapters.loads >= 3


def test_requests_name_only_loaded_adapters(llama_adapters, default_model):
    import asyncio

    from vsurge import EngineConfig, SamplingParams, vSurge

    base_dir, adapters, _ = llama_adapters
    model, processor = load(str(base_dir), dtype="float32", progress=False)
    surge = vSurge.create_odriver(model, processor, config=EngineConfig(**ENGINE, max_loras=1, max_lora_rank=4))
    with pytest.raises(AdapterError, match="rank 8 .* above the server's --max-lora-rank 4"):
        surge.load_adapter("big", str(adapters[0][0]))
    surge.load_adapter("small", str(adapters[1][0]))
    assert surge.adapter_names == ["small"]
    assert surge.unload_adapter("small") and not surge.unload_adapter("small")

    async def submit():
        surge.submit([1, 2, 3], SamplingParams(max_tokens=2), adapter="small")

    with pytest.raises(ValueError, match="no LoRA adapter named 'small'"):
        asyncio.run(submit())
    plain = vSurge.create_odriver(*default_model, config=EngineConfig(**ENGINE))
    with pytest.raises(AdapterError, match="serves no LoRA adapters"):
        plain.load_adapter("x", str(adapters[1][0]))


def test_a_gguf_lora_holds_the_same_adapter_as_its_peft_source(llama_adapters, tmp_path):
    """llama.cpp's LoRA form (tests/gguf_files.write_gguf_lora, as convert_lora_to_gguf.py writes it: q/k rows
    of B interleaved, scaled by alpha / r at load) reads into the very weights of the PEFT adapter it came
    from, so every token equals; a GGUF that is not a LoRA adapter is refused."""
    from gguf_files import write_gguf_lora

    base_dir, adapters, torch_base = llama_adapters
    model, _ = load(str(base_dir), dtype="float32", progress=False, load_processor=False)
    folder = adapters[0][0]
    write_gguf_lora(tmp_path / "a0.gguf", folder, torch_base.config)
    from_peft = load_peft("a0", folder, model, RANK)
    from_gguf = load_peft("a0", str(tmp_path / "a0.gguf"), model, RANK)
    assert from_peft.weights.keys() == from_gguf.weights.keys() and len(from_peft.weights) == 7 * torch_base.config.num_hidden_layers
    for key, (a, b) in from_peft.weights.items():
        np.testing.assert_allclose(from_gguf.weights[key][0], a, atol=1e-7)
        np.testing.assert_allclose(from_gguf.weights[key][1], b, atol=1e-7)
    (tmp_path / "model.gguf").write_bytes((tmp_path / "a0.gguf").read_bytes().replace(b"adapter", b"modelxx"))
    with pytest.raises(AdapterError, match="not a LoRA adapter GGUF"):
        load_peft("x", str(tmp_path / "model.gguf"), model, RANK)


def test_adapters_run_tensor_and_data_parallel_on_both_engines(llama_adapters):
    """The base and three adapters over two slots, all at once, on the paged engine at TP 2 and the dense
    engine on a (data 2, model 2) mesh: each request's greedy tokens equal PEFT's; the stacks are split
    like the projections they adapt (B of q by its columns, A of o by its rows)."""
    from test_sharding import run_check

    base_dir, adapters, torch_base = llama_adapters
    got = run_check("lora", base_dir, *(folder for folder, _ in adapters), devices=4)
    models = [torch_base, *(peft for _, peft in adapters)]
    want = [peft_greedy(m, p, 6) for m in models for p in got["prompts"]]
    assert got["paged_tp2"] == want
    assert got["dense_dp2_tp2"] == want
    assert got["specs"]["lora_q_b"] == "P(None, None, 'model')" and got["specs"]["lora_o_a"] == "P('model', None, None, None)"


def test_adapters_with_speculation_and_structured_outputs(llama_adapters, default_model):
    """An adapter's request with n-gram drafts (a prompt that repeats itself, so drafts are proposed and
    mostly rejected) gets PEFT's greedy tokens, the verify rows running with its adapter; beside it, an
    adapter's request constrained to a choice answers one of the choices."""
    from vsurge import EngineConfig, SamplingParams, vSurge

    base_dir, adapters, _ = llama_adapters
    model, processor = load(str(base_dir), dtype="float32", progress=False)
    surge = vSurge.create_odriver(model, processor, config=EngineConfig(**ENGINE, max_loras=2, max_lora_rank=8,
                                                                        speculative_tokens=3))
    for k, (folder, _) in enumerate(adapters[:2]):
        surge.load_adapter(f"a{k}", str(folder))
    prompt = [7, 8, 9, 10, 11] * 4
    steps = 12
    speculating = SamplingParams(max_tokens=steps, temperature=0.0, ignore_eos=True, speculative_tokens=3)
    choice = SamplingParams(max_tokens=8, temperature=0.0, structured={"choice": ["yes", "no", "maybe"]})

    surge.compile()
    surge.start()
    try:
        drafted, chosen = generate_with_adapters(surge, [(prompt, speculating, "a0"), (prompt, choice, "a1")])
    finally:
        surge.stop(5)
    assert drafted == peft_greedy(adapters[0][1], prompt, steps)
    assert surge.metrics.value("vsurge:spec_decode_num_draft_tokens_total") > 0
    assert processor.decode(chosen, skip_special_tokens=True) in ("yes", "no", "maybe")
