"""Sharded checks that need several JAX devices, run in a subprocess by test_sharding.py.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/scale_checks.py CHECK ARGS...

(the device count is fixed when JAX starts, and pytest's own process already has one device).
Each check prints one JSON line `RESULT {...}` that the test reads and asserts on.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

import vsurge  # noqa: E402
from dense_generator import greedy_generate  # noqa: E402
from reference_generation import greedy_reference  # noqa: E402
from vsurge.loading.hf import SafetensorsSource  # noqa: E402
from vsurge.ops.quantized import is_quantized  # noqa: E402
from vsurge.hardware.sharding import make_mesh, mesh_of, per_device_bytes, place_model  # noqa: E402

IDS = [[1, 5, 9, 200, 3000, 7, 11, 400, 42, 4242, 17, 99]]
PROMPTS = ["Hello there", "The capital of France", "1 2 3 4", "Once upon a time in a land far away"]


def forward(model, ids=IDS):
    """Full-sequence logits (T, V) of one jitted forward pass (sharded by the weights' shardings)."""
    graphdef, state = nnx.split(model)
    return np.asarray(jax.jit(lambda s, x: nnx.merge(graphdef, s)(x)[0][0])(state, jnp.asarray(ids, jnp.int32)))


def rel_err(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def check_logits(*named_paths):
    """NAME=PATH per model. Logits at TP 1/2/4 (loaded sharded, and an in-memory model placed on a
    mesh) and int8 at TP 2 vs one device; what each device holds; how much of each tensor a read took."""
    reads: list[float] = []
    original = SafetensorsSource.read

    def counting_read(self, name, index=()):  # fraction of the tensor each read touches
        out = original(self, name, index)
        if len(self.shape(name)) == 2:
            reads.append(out.size / float(np.prod(self.shape(name))))
        return out

    SafetensorsSource.read = counting_read
    result = {}
    for named in named_paths:
        name, path = named.split("=", 1)
        ref_model, _ = vsurge.load(path, dtype="float32", progress=False, load_processor=False)
        ref = forward(ref_model)
        int8_ref = forward(vsurge.load(path, dtype="float32", quantization="int8", progress=False,
                                       load_processor=False)[0])
        out = {"kv_heads": ref_model.config.num_kv_heads, "total_bytes": ref_model.weight_bytes}
        for tp in (1, 2, 4):
            reads.clear()
            model, _ = vsurge.load(path, dtype="float32", progress=False, load_processor=False,
                                   tensor_parallel_size=tp)
            logits = forward(model)
            held = per_device_bytes(model.named_weights())
            same_argmax = bool((logits.argmax(-1) == ref.argmax(-1)).all())
            out[str(tp)] = {"rel_err": rel_err(logits, ref), "argmax": same_argmax,
                            "kv_heads": model.config.num_kv_heads, "devices": len(held),
                            "max_device_bytes": max(held.values()), "max_read_fraction": max(reads),
                            "placed_rel_err": rel_err(forward(place_model(ref_model, make_mesh(tp))), ref)}
        q8, _ = vsurge.load(path, dtype="float32", quantization="int8", progress=False, load_processor=False,
                            tensor_parallel_size=2)
        out["int8_tp2_rel_err"] = rel_err(forward(q8), int8_ref)
        result[name] = out
    print("RESULT " + json.dumps(result), flush=True)


def _surge(model, processor, kind: str, **parallel):
    """A small started vSurge: 4 slots, one decode and one prefill program shape."""
    from vsurge import EngineConfig, vSurge

    config = EngineConfig(max_slots=4, max_length=128, prefill_tokens=128, chunk_lengths=(32,), row_buckets=(4,),
                          window_buckets=(1,), prefill_first=True, page_size=128, num_pages=8, decode_steps=4)
    make = vSurge.create_vdriver if kind == "dense" else vSurge.create_odriver
    surge = make(model, processor, config=config, **parallel)
    surge.compile()
    surge.start()
    return surge


def _generate(surge, prompts, max_tokens: int):
    from vsurge import SamplingParams

    try:
        results = asyncio.run(surge.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                                                     ignore_eos=True)))
        return [r.token_ids for r in results]
    finally:
        surge.stop(5)


def check_engines(path):
    """Greedy tokens of the dense engine at TP 2, the paged engine at TP 4 (KV heads replicated) and
    the reference Generator (dense KV cache) at TP 4 against the Generator on one device."""
    model, processor = vsurge.load(path, dtype="float32", progress=False)
    prompts = [processor.encode(p) for p in PROMPTS]
    reference = [greedy_generate(model, ids, 10) for ids in prompts]
    tp2, _ = vsurge.load(path, dtype="float32", progress=False, load_processor=False, tensor_parallel_size=2)
    tp4, _ = vsurge.load(path, dtype="float32", progress=False, load_processor=False, tensor_parallel_size=4)
    dense = _generate(_surge(tp2, processor, "dense"), prompts, 10)
    paged = _surge(tp4, processor, "paged")
    state_specs = {str(s.spec) for s in jax.tree.leaves(paged.engine.get_state_shardings(is_decode=True))}
    paged_out = _generate(paged, prompts, 10)
    generator = [greedy_generate(tp4, ids, 10) for ids in prompts]
    print("RESULT " + json.dumps({"reference": reference, "dense_tp2": dense, "paged_tp4": paged_out,
                                  "generator_tp4": generator, "state_specs": sorted(state_specs),
                                  "paged_mesh": dict(mesh_of(tp4).shape),
                                  "prefix_spec": str(paged.engine.get_prefix_destination_sharding().spec),
                                  **vinference_on_data_and_model(path, model, processor)}), flush=True)


def vinference_on_data_and_model(path, model, processor) -> dict:
    """vInference on a (data 2, model 2) mesh with input_partition_spec=PartitionSpec("data"): the
    rows of every step input split over `data`; texts as on one device."""
    from jax.sharding import PartitionSpec

    from vsurge import SamplingParams, vInference, vInferenceConfig

    mesh_model, _ = vsurge.load(path, dtype="float32", progress=False, load_processor=False, tensor_parallel_size=2,
                                data_parallel_size=2)
    config = vInferenceConfig(max_new_tokens=10, streaming_chunks=5)
    try:
        vInference(mesh_model, processor, generation_config=config, input_partition_spec=PartitionSpec("dp"))
        bad_axis_error = ""
    except ValueError as e:
        bad_axis_error = str(e)
    vinf = vInference(mesh_model, processor, generation_config=config, input_partition_spec=PartitionSpec("data"))
    outputs = vinf.process_prompt(PROMPTS, SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True))
    expected = [processor.decode(greedy_generate(model, vinf.prompt_ids(p), 10)) for p in PROMPTS]
    engine = next(iter(vinf._buckets.buckets.values())).engine
    decode = next(program for key, program in engine._compiled.items() if key[0] == "decode")
    row_specs = sorted({str(s.spec) for s in jax.tree.leaves(decode.input_shardings[0][3])})
    return {"vinference_texts": [o.text for o in outputs], "vinference_expected": expected,
            "vinference_row_specs": row_specs, "vinference_bad_axis_error": bad_axis_error}


def check_default():
    """The embedded default model (9 query heads, 3 KV heads), in one process (it loads once per form, and
    the process starts once): dequantized to float32 per shard, logits at TP 3 vs one device; and kept in its
    GGUF blocks (replicated on every device) at TP 3, logits and greedy tokens vs one device, the blocks'
    shardings, and 3 data-parallel replicas, each on its own device."""
    return {"float32": _default_float32_tp3(), "blocks": _default_blocks_tp3()}


def _default_prompt(processor) -> list[int]:
    return processor.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])


def _default_float32_tp3() -> dict:
    """Logits of one forward pass: the weights' split is what differs from one device (the KV cache's split at
    TP 3 is the blocks' greedy decoding below)."""
    model, processor = vsurge.load("default", dtype="float32", progress=False)
    ids = _default_prompt(processor)
    ref = forward(model, [ids])  # (T, V)
    del model
    tp3, _ = vsurge.load("default", dtype="float32", progress=False, load_processor=False, tensor_parallel_size=3)
    logits = forward(tp3, [ids])
    held = per_device_bytes(tp3.named_weights())
    return {"rel_err": rel_err(logits, ref), "argmax": bool((logits.argmax(-1) == ref.argmax(-1)).all()),
            "kv_heads": tp3.config.num_kv_heads, "devices": len(held), "max_device_bytes": max(held.values()),
            "total_bytes": tp3.weight_bytes}


def _default_blocks_tp3() -> dict:
    model, processor = vsurge.load("default", progress=False)
    ids = _default_prompt(processor)
    ref, one = forward(model, [ids]), greedy_reference(model, ids, 8)
    from vsurge.scale.replicas import replica_models

    replicas = replica_models(model, tensor_parallel_size=1, data_parallel_size=3)  # each on its own device
    dp3 = {"devices": [sorted({d.id for w in r.named_weights().values() for leaf in jax.tree.leaves(w)
                               for d in leaf.devices()}) for r in replicas],
           "tokens": greedy_reference(replicas[-1], ids, 8)}  # one replica off device 0 runs (each compiles anew)
    del model, replicas
    tp3, _ = vsurge.load("default", progress=False, load_processor=False, tensor_parallel_size=3)
    blocks = {n: w for n, w in tp3.named_weights().items() if is_quantized(w)}
    return {"rel_err": rel_err(forward(tp3, [ids]), ref), "tp1": one, "tp3": greedy_reference(tp3, ids, 8),
            "text": processor.decode(one), "blocks": len(blocks), "dp3": dp3,
            "replicated": all(len(w.sharding.device_set) == 3 and w.sharding.is_fully_replicated
                              for w in blocks.values())}


def check_families(*named_paths):
    """Each family (NAME=PATH[+paged]) at TP 2 (and, for mixtures of experts, EP 2: whole experts per
    device) against one device: logits of a full forward pass; and, with +paged, greedy tokens of the
    paged engine at TP 2 against the reference Generator on one device. (TP 4, where KV heads are copied, is checked on
    Llama and Qwen2 by check_logits; here it only repeated TP 2's splits at twice the compile time.)"""
    result = {}
    for named in named_paths:
        name, path = named.split("=", 1)
        path, paged = path.removesuffix("+paged"), path.endswith("+paged")
        model, processor = vsurge.load(path, dtype="float32", progress=False)
        ref = forward(model)
        prompts = [processor.encode(p) for p in PROMPTS[:2]]
        out = {"moe": hasattr(model.config, "expert_parallel")}
        for tp in (2,):
            for ep in ((False, True) if out["moe"] else (False,)):
                sharded, _ = vsurge.load(path, dtype="float32", progress=False, load_processor=False,
                                         tensor_parallel_size=tp, expert_parallel=ep)
                specs = {n: str(w.sharding.spec) for n, w in sharded.named_weights().items()
                         if n == "layers.1.experts_gate_up"}
                out[f"{'ep' if ep else 'tp'}{tp}"] = {"rel_err": rel_err(forward(sharded), ref), "specs": specs}
        if paged:
            tp2, _ = vsurge.load(path, dtype="float32", progress=False, load_processor=False, tensor_parallel_size=2)
            out["paged_tp2"] = _generate(_surge(tp2, processor, "paged"), prompts, 8)
            out["reference"] = [greedy_generate(model, ids, 8) for ids in prompts]
        result[name] = out
    print("RESULT " + json.dumps(result), flush=True)


def check_lora(base, *adapters):
    """Greedy tokens of requests for the base model and three adapters over two slots, at once: the paged
    engine at TP 2 and the dense engine on a (data 2, model 2) mesh."""
    from lora_helpers import generate_with_adapters
    from vsurge import EngineConfig, SamplingParams

    model, processor = vsurge.load(base, dtype="float32", progress=False)
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, model.config.vocab_size, n).tolist() for n in (25, 9)]
    jobs = [(name, p) for name in (None, "a0", "a1", "a2") for p in prompts]
    # (one decode program of 8 rows: the 8 requests run at once, so 2- and 4-row programs only cost compiles)
    config = EngineConfig(max_slots=8, max_length=64, prefill_tokens=32, chunk_lengths=(16,), row_buckets=(8,),
                          page_size=16, num_pages=48, decode_steps=4, max_loras=2, max_lora_rank=8)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)

    def run(kind, **parallel):
        make = vsurge.vSurge.create_vdriver if kind == "dense" else vsurge.vSurge.create_odriver
        surge = make(model, processor, config=config, **parallel)
        for k, folder in enumerate(adapters):
            surge.load_adapter(f"a{k}", folder)
        specs = {n: str(getattr(v[...].sharding, "spec", None)) for n, v in vars(surge.engine.model.layers[0]).items()
                 if n in ("lora_qkv_a", "lora_q_b", "lora_o_a", "lora_o_b")}
        surge.compile()
        surge.start()
        try:
            return generate_with_adapters(surge, [(prompt, params, name) for name, prompt in jobs]), specs
        finally:
            surge.stop(5)

    paged, specs = run("paged", tensor_parallel_size=2)
    dense, _ = run("dense", tensor_parallel_size=2, data_parallel_size=2)
    print("RESULT " + json.dumps({"paged_tp2": paged, "dense_dp2_tp2": dense, "specs": specs, "prompts": prompts}),
          flush=True)


if __name__ == "__main__":
    checks = {"logits": check_logits, "engines": check_engines, "families": check_families, "lora": check_lora}
    if sys.argv[1] == "default":
        print("RESULT " + json.dumps(check_default()), flush=True)
    else:
        checks[sys.argv[1]](*sys.argv[2:])
