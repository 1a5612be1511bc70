"""Tensor parallelism on a mesh of 8 CPU devices: logits, engines and loading match one device.

Each check runs in a subprocess (tests/scale_checks.py) started with
XLA_FLAGS=--xla_force_host_platform_device_count=8: the device count is fixed when
JAX starts, and this process already has one. float32 weights: sharded matmuls
only change summation order, so logits agree to ~1e-6 relative and greedy tokens
exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tiny_models import chosen, write_tiny_model
from xla_flags import xla_flags

HERE = Path(__file__).parents[1]  # tests/: the helper scripts
LOGIT_RTOL = 1e-4  # relative to the largest logit; measured ~3e-7 in float32
INT8_RTOL = 1e-3  # int8 activations are quantized per row: TP moves a sum across devices, ~4e-5 measured


def run_check(name: str, *args, devices: int = 8, timeout: int = 600) -> dict:
    env = {**os.environ, "XLA_FLAGS": xla_flags(f"--xla_force_host_platform_device_count={devices}"),
           "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, str(HERE / "scale_checks.py"), name, *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return json.loads(lines[-1][len("RESULT "):])


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory, default_processor_dir):
    """Tiny random llama (4 query heads, 2 KV heads) and qwen2 (q/k/v biases) checkpoints."""
    out = {}
    for name in ("llama", "qwen2"):
        folder = tmp_path_factory.mktemp(f"tiny_{name}")
        write_tiny_model(name, folder, default_processor_dir)
        out[name] = folder
    return out


@pytest.fixture(scope="session")
def logits_result(tiny_dirs):
    return run_check("logits", *(f"{name}={path}" for name, path in tiny_dirs.items()))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("tp", ["1", "2", "4"])
def test_logits_at_tensor_parallel_sizes_equal_one_device(logits_result, arch, tp):
    r = logits_result[arch][tp]
    assert r["rel_err"] <= LOGIT_RTOL and r["argmax"], r
    assert r["placed_rel_err"] <= LOGIT_RTOL, r  # an in-memory model placed on a mesh: the same
    assert r["devices"] == int(tp)


def test_kv_heads_are_replicated_when_tp_exceeds_them(logits_result):
    for arch in ("llama", "qwen2"):
        assert logits_result[arch]["kv_heads"] == 2
        assert logits_result[arch]["2"]["kv_heads"] == 2  # 2 KV heads over 2 devices: one each
        assert logits_result[arch]["4"]["kv_heads"] == 4  # each KV head copied to 2 devices (vLLM's rule)


def test_int8_weights_run_sharded(logits_result):
    for arch in ("llama", "qwen2"):
        assert logits_result[arch]["int8_tp2_rel_err"] <= INT8_RTOL


def test_sharded_loading_never_holds_the_whole_model_on_one_device(logits_result):
    for arch in ("llama", "qwen2"):
        r = logits_result[arch]
        total = r["total_bytes"]
        for tp in (2, 4):
            # each device holds 1/tp of every matrix (the KV columns of tp=4 are copies: 2 of 16 per
            # group of 4 heads) plus the replicated norms: well under 1/tp + 5%
            assert r[str(tp)]["max_device_bytes"] <= total / tp * 1.05, (tp, r[str(tp)], total)
            # and no read of a matrix ever took more than its shard (KV rows: one of the 2 heads)
            assert r[str(tp)]["max_read_fraction"] <= max(1 / tp, 1 / 2), r[str(tp)]


@pytest.fixture(scope="session")
def engines_result(tiny_dirs):
    return run_check("engines", tiny_dirs["llama"])


def test_dense_and_paged_engines_and_the_generator_run_sharded(engines_result):
    r = engines_result
    assert r["dense_tp2"] == r["reference"]
    assert r["paged_tp4"] == r["reference"]
    assert r["generator_tp4"] == r["reference"]  # the dense KV cache of the reference path
    assert r["paged_mesh"] == {"data": 1, "model": 4}
    assert r["state_specs"] == ["P()", "P(None, 'model', None, None)"]  # KV pages over KV heads, slots replicated
    assert r["prefix_spec"] == "P('data', 'model', None, None)"  # the seed's prefixes: over KV heads too


def test_vinference_honours_input_partition_spec(engines_result):
    r = engines_result
    assert r["vinference_texts"] == r["vinference_expected"]
    assert "P('data',)" in r["vinference_row_specs"]  # step inputs' rows split over the data axis
    assert "'dp'" in r["vinference_bad_axis_error"]  # an axis the mesh lacks is refused by name


@pytest.fixture(scope="session")
def default_result():
    """Both default-model checks from one process on 3 devices (they load the same GGUF)."""
    return run_check("default", devices=3)


def test_default_model_dequantized_at_tp3_gives_the_logits_of_one_device(default_result):
    r = default_result["float32"]
    assert r["kv_heads"] == 3 and r["devices"] == 3  # 9 query heads, 3 KV heads: one KV head per device
    assert r["rel_err"] <= LOGIT_RTOL and r["argmax"], r
    assert r["max_device_bytes"] < r["total_bytes"] / 2  # GGUF dequantized per shard, the vocabulary split


# families whose sharding differs from Llama's: soft-caps and windows, Phi-3's fused checkpoint tensors,
# MLA's single latent KV head (replicated) with query heads split, experts split by units or whole (Llama 4's
# fed their inputs times their scores, from fused gate-then-up tensors), Gemma 4's KV heads replicated layer by
# layer (its global layers' one KV head copied to both devices, its sliding layers' two split)
SHARDED_FAMILIES = chosen("gemma2", "phi3", "deepseek_v3", "qwen3_moe", "gpt_oss", "llama4", "qwen3_next", "nemotron_h", "falcon_h1",
                           "lfm2", "gemma4")
# of those, the paged engine at TP 2 where its caches differ: MLA's latent pages, sinks and experts, a Gated
# DeltaNet's state rows beside the pages (Mamba-2's are replicated the same way), pages of per-layer KV heads and
# sliding windows (Gemma 4). Each family's engine compile costs ~10 s; the others' sharded weights are the
# logits check's
PAGED_SHARDED = chosen("deepseek_v3", "gpt_oss", "qwen3_next", "gemma4")


@pytest.fixture(scope="session")
def families_result(tiny_checkpoints):
    return run_check("families", *(f"{name}={tiny_checkpoints[name][0]}" + ("+paged" if name in PAGED_SHARDED else "")
                                   for name in SHARDED_FAMILIES))


@pytest.mark.parametrize("name", SHARDED_FAMILIES)
def test_families_at_tensor_and_expert_parallel_sizes_equal_one_device(families_result, name):
    r = families_result[name]
    for key in ("tp2",) + (("ep2",) if r["moe"] else ()):
        assert r[key]["rel_err"] <= LOGIT_RTOL, (key, r[key])
    if name in PAGED_SHARDED:  # the paged engine on a 2-device mesh: the same greedy tokens
        assert r["paged_tp2"] == r["reference"]
    if r["moe"]:  # tensor parallel splits each expert's units; expert parallel splits whole experts
        assert r["tp2"]["specs"] == {"layers.1.experts_gate_up": "P(None, None, 'model')"}, r["tp2"]
        assert r["ep2"]["specs"] == {"layers.1.experts_gate_up": "P('model', None, None)"}, r["ep2"]


def test_default_gguf_blocks_replicated_at_tp3(default_result):
    """The default GGUF kept in its blocks at TP 3: every block matrix replicated, logits and greedy
    tokens those of one device; at DP 3 each replica's blocks on its own device (this crashed)."""
    r = default_result["blocks"]
    assert r["blocks"] == 121 and r["replicated"]
    assert r["rel_err"] <= LOGIT_RTOL, r
    assert r["tp3"] == r["tp1"]
    assert r["text"].startswith("The capital of France is Paris."), r["text"]  # the real model's answer, not noise
    # data parallel: each replica's weights (blocks included) on its own device, the same tokens
    assert r["dp3"]["devices"] == [[0], [1], [2]] and r["dp3"]["tokens"] == r["tp1"], r["dp3"]
