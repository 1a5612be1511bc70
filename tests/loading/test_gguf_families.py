"""Every family loads from GGUF (written as llama.cpp's converter writes it) to transformers' logits.

tests/gguf_families.py writes each tiny checkpoint as its llama.cpp architecture (checked
against the real converter with benchmarks/families_vs_llamacpp.py); vsurge's load must give the
logits of the transformers model the checkpoint came from, and, for the architectures
transformers' own GGUF loader reads, transformers' logits from the same file.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

import vsurge
from gguf_families import AS_CONVERTED, FAMILIES, GGUF_ARCH, write_family_gguf
from gguf_files import Q
from test_models_vs_transformers import reference_logits
from tiny_models import VOCAB, chosen, write_tiny_model

# where transformers' GGUF reader reads these tiny configs right (it misses e.g. a head_dim that is not
# hidden / heads, experts' own intermediate size, Gemma's soft-caps and local rotary base, LongRoPE)
TRANSFORMERS_READS = set(chosen("llama", "mistral", "qwen2"))
TOL = 1e-4


def prompt(name: str) -> np.ndarray:
    # llama.cpp's converter writes Mistral as `llama` without its sliding window (6 tokens here):
    # stay inside it
    return np.random.default_rng(7).integers(0, VOCAB, 6 if name == "mistral" else 20)


def logits_of(model, ids) -> np.ndarray:
    from flax import nnx
    import jax

    graphdef, state = nnx.split(model)
    forward = jax.jit(lambda state, ids: nnx.merge(graphdef, state)(ids)[0][0])
    return np.asarray(forward(state, jnp.asarray(ids[None], jnp.int32)))


def checkpoint(name: str, tiny_checkpoints, tmp_path, default_processor_dir):
    """The family's tiny checkpoint (folder, torch model), as the converter can write it without loss."""
    if name not in AS_CONVERTED:
        return tiny_checkpoints[name]
    folder = tmp_path / f"{name}-hf"
    return folder, write_tiny_model(name, folder, default_processor_dir, **AS_CONVERTED[name])


@pytest.mark.parametrize("name", FAMILIES)
def test_family_gguf_gives_the_checkpoints_logits(name, tiny_checkpoints, tmp_path, default_gguf_path,
                                                  default_processor_dir):
    folder, torch_model = checkpoint(name, tiny_checkpoints, tmp_path, default_processor_dir)
    path = tmp_path / f"{name}.gguf"
    write_family_gguf(path, folder, default_gguf_path)
    model, processor = vsurge.load(path, dtype=jnp.float32, progress=False)
    assert GGUF_ARCH[torch_model.config.model_type] in type(model).gguf_architectures
    assert processor.eos_token_id == 2
    ids = prompt(name)
    ours = logits_of(model, ids)
    assert np.abs(ours - reference_logits(torch_model, ids)).max() <= TOL
    if name in TRANSFORMERS_READS:  # an independent reader of the same file
        ref = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name,
                                                                dtype=torch.float32).eval()
        assert np.abs(ours - reference_logits(ref, ids)).max() <= TOL


def test_quantized_stacked_experts_load_by_expert(tiny_checkpoints, tmp_path, default_gguf_path):
    """Q8_0 expert stacks (E, F, D): each expert's rows dequantize on their own; logits stay within
    the format's error of the float file."""
    folder, _ = tiny_checkpoints["qwen3_moe"]
    types = {k: Q.Q8_0 for k in ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight",
                                 "attn_q.weight")}
    write_family_gguf(tmp_path / "f32.gguf", folder, default_gguf_path)
    write_family_gguf(tmp_path / "q8.gguf", folder, default_gguf_path, types=types)
    ids = prompt("qwen3_moe")
    exact = logits_of(vsurge.load(tmp_path / "f32.gguf", dtype=jnp.float32, progress=False)[0], ids)
    q8 = logits_of(vsurge.load(tmp_path / "q8.gguf", dtype=jnp.float32, progress=False)[0], ids)
    err = np.abs(q8 - exact).max()
    assert 0 < err < 0.02 * np.abs(exact).max()


def test_quantized_experts_load_in_the_cpus_fast_dtype(tiny_checkpoints, tmp_path, default_gguf_path):
    """Without a dtype, a Q8_0 file's expert stacks (not held in blocks) load as the CPU's default weight
    dtype, bfloat16 where it multiplies it natively (half the bytes a decode step reads), the rest
    float32; the logits stay within the format's error of the float32 load."""
    from vsurge.hardware.devices import default_dtype

    folder, _ = tiny_checkpoints["qwen3_moe"]
    types = {k: Q.Q8_0 for k in ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")}
    write_family_gguf(tmp_path / "q8.gguf", folder, default_gguf_path, types=types)
    fast = vsurge.load(tmp_path / "q8.gguf", progress=False)[0]
    assert fast.stack_dtype == jnp.dtype(default_dtype()) and fast.param_dtype == jnp.float32
    ids = prompt("qwen3_moe")
    exact = logits_of(vsurge.load(tmp_path / "q8.gguf", dtype=jnp.float32, progress=False)[0], ids)
    assert np.abs(logits_of(fast, ids) - exact).max() < 0.02 * np.abs(exact).max()


# the hybrids' matrices that llama.cpp quantizes, as its converter stores them
HYBRID_Q8_0 = {"qwen3_next": ("attn_q.weight", "attn_qkv.weight", "attn_gate.weight", "ssm_ba.weight", "ssm_out.weight",
                              "ffn_gate_exps.weight"),
               "lfm2": ("shortconv.in_proj.weight", "shortconv.out_proj.weight", "attn_q.weight", "attn_output.weight",
                        "ffn_gate.weight", "ffn_down.weight"),
               "mamba2": ("ssm_in.weight", "ssm_out.weight")}


KEPT_IN_BLOCKS = {"qwen3_next": ("w_qkv", "w_z", "w_out"), "lfm2": ("w_b", "w_c", "w_x", "w_out"),
                  "mamba2": ("w_z", "w_xbc", "w_out")}


@pytest.mark.parametrize("name", sorted(HYBRID_Q8_0))
def test_hybrid_matrices_in_q8_0_blocks(name, tiny_checkpoints, tmp_path, default_gguf_path):
    """A hybrid's matrices in Q8_0 (Qwen3-Next's per-head query/gate rows and DeltaNet projections,
    LFM2's B | C | x rows of one in_proj, Mamba-2's z | xBC | dt rows of ssm_in): read as rows of the
    stored blocks, kept in blocks where the CPU kernel is built; logits within the format's error of
    the float file."""
    folder, _ = tiny_checkpoints[name]
    types = {k: Q.Q8_0 for k in HYBRID_Q8_0[name]}
    write_family_gguf(tmp_path / "f32.gguf", folder, default_gguf_path)
    write_family_gguf(tmp_path / "q8.gguf", folder, default_gguf_path, types=types)
    from vsurge import kernels

    ids = prompt(name)
    exact = logits_of(vsurge.load(tmp_path / "f32.gguf", dtype=jnp.float32, progress=False)[0], ids)
    blocks = "blocks" if kernels.available() else None  # (else dequantized: the same rows read)
    model = vsurge.load(tmp_path / "q8.gguf", dtype=jnp.float32, quantization=blocks, progress=False)[0]
    if blocks:  # the recurrent layers' projections, cut from one stored tensor by rows, stay in blocks
        from vsurge.ops.quantized import is_quantized

        held = {k for k, w in model.named_weights().items() if is_quantized(w)}
        assert all(any(k.endswith(w) for k in held) for w in KEPT_IN_BLOCKS[name]), sorted(held)
    q8 = logits_of(model, ids)
    err = np.abs(q8 - exact).max()
    assert 0 < err < 0.02 * np.abs(exact).max()
