"""AWQ and GPTQ checkpoints read as they are (loading/packed.py).

The checkpoints are tiny random models whose linear layers are quantized here (4-bit codes, a
scale and zero point per group) and packed with AutoAWQ's own packing code (its packing_utils,
read from the installed `autoawq` package without importing the package, which would pull in its
GPU dependencies): AWQ's interleaved "gemm" layout, and GPTQ's layout by AutoAWQ's converter to
exllama/GPTQ (`unpack_reorder_pack`, `pack_exllama`). AutoAWQ's `dequantize_gemm` checks the
AWQ tensors decode to the intended weights. The reference is transformers run on those
dequantized weights; vsurge must match it holding the layers in blocks (Q4_1, or Q4_0 where the
zero points are all 8), and dequantized where the groups are not contiguous (GPTQ act-order).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import vsurge
from tiny_models import write_tiny_model
from vsurge import kernels
from vsurge.errors import ModelLoadError, UnsupportedModelError
from vsurge.ops.quantized import QuantizedWeight, dequantize, is_quantized

torch = pytest.importorskip("torch")
from safetensors.torch import load_file, save_file  # noqa: E402

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ's (packing_utils.AWQ_ORDER): checked against its unpacker below
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LOGIT_RTOL = 2e-3  # the kernel's two-pass int8 activations (test_gguf_blocks.py measures the same)


def awq_packing():
    """AutoAWQ's packing_utils module, loaded from its file (it imports only torch)."""
    spec = importlib.util.find_spec("awq")
    if spec is None:
        pytest.skip("autoawq is not installed (make test installs it with --no-deps)")
    path = Path(list(spec.submodule_search_locations)[0]) / "utils" / "packing_utils.py"
    module_spec = importlib.util.spec_from_file_location("awq_packing_utils", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    assert tuple(module.AWQ_ORDER) == AWQ_ORDER
    return module


def quantize_asym(w: np.ndarray, group: int, rng, symmetric: bool = False, g_idx=None):
    """W (N, K) float -> codes (K, N), zeros (G, N), scales (G, N) float16: 4-bit min/max per group."""
    n, k = w.shape
    g_idx = np.arange(k) // group if g_idx is None else g_idx
    groups = g_idx.max() + 1
    scales = np.zeros((groups, n), np.float32)
    zeros = np.zeros((groups, n), np.int32)
    for g in range(groups):
        cols = w[:, g_idx == g]
        if symmetric:
            scale = np.abs(cols).max(1) / 7
            zero = np.full(n, 8)
        else:
            lo, hi = np.minimum(cols.min(1), 0), np.maximum(cols.max(1), 0)
            scale = (hi - lo) / 15
            zero = np.clip(np.round(-lo / scale), 1, 15).astype(np.int32)  # GPTQ v1 stores zero - 1
        scales[g], zeros[g] = scale, zero
    scales = scales.astype(np.float16)
    s = scales.astype(np.float32)[g_idx].T  # (N, K)
    codes = np.clip(np.round(w / s) + zeros[g_idx].T, 0, 15).astype(np.int32)
    return codes.T, zeros, scales


def pack_awq(values: np.ndarray) -> np.ndarray:
    """int (R, N) 4-bit values -> int32 (R, N / 8): nibble j of each word holds column AWQ_ORDER[j]."""
    r, n = values.shape
    v = values.reshape(r, n // 8, 8)[:, :, list(AWQ_ORDER)].astype(np.uint32)
    return np.ascontiguousarray((v << (4 * np.arange(8, dtype=np.uint32))).sum(-1), np.uint32).view(np.int32)


def write_packed(folder: Path, model, method: str, group: int, *, symmetric=False, act_order=False, seed=0):
    """Quantizes `model`'s decoder linears into folder/model.safetensors in AWQ or GPTQ layout, rewrites
    config.json's quantization_config; returns {weight name: dequantized float32 (N, K)}."""
    pu = awq_packing()
    rng = np.random.default_rng(seed)
    state = {k: v.contiguous() for k, v in load_file(folder / "model.safetensors").items()}
    dequantized = {}
    for name in list(state):
        if not any(f".{lin}.weight" in name for lin in LINEARS):
            continue
        w = state.pop(name).float().numpy()
        n, k = w.shape
        size = group if group > 0 else k
        g_idx = rng.permutation(np.arange(k) // size) if act_order else None
        codes, zeros, scales = quantize_asym(w, size, rng, symmetric=symmetric, g_idx=g_idx)
        gi = np.arange(k) // size if g_idx is None else g_idx
        deq = (codes - zeros[gi]).astype(np.float32) * scales.astype(np.float32)[gi]  # (K, N)
        prefix = name[: -len(".weight")]
        qweight, qzeros = torch.from_numpy(pack_awq(codes)), torch.from_numpy(pack_awq(zeros))
        t_scales = torch.from_numpy(scales)
        if method == "awq":
            if not act_order:  # AutoAWQ's own unpacker agrees with what was meant
                theirs = pu.dequantize_gemm(qweight, qzeros, t_scales, 4, size).float().numpy()
                np.testing.assert_allclose(theirs, deq, rtol=1e-3, atol=1e-6)
            state.update({f"{prefix}.qweight": qweight, f"{prefix}.qzeros": qzeros, f"{prefix}.scales": t_scales})
        else:
            if act_order:  # GPTQ rows are packed in input order; the groups come from g_idx
                qweight, qzeros = pu.pack_exllama(torch.from_numpy(codes), torch.from_numpy(zeros - 1), 4)
            else:
                qweight, qzeros = pu.unpack_reorder_pack(qweight, qzeros, 4)
            state.update({f"{prefix}.qweight": qweight.to(torch.int32), f"{prefix}.qzeros": qzeros.to(torch.int32),
                          f"{prefix}.scales": t_scales, f"{prefix}.g_idx": torch.from_numpy(gi.astype(np.int32))})
        dequantized[name] = deq.T
    save_file(state, folder / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = (
        {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm"}
        if method == "awq" else
        {"quant_method": "gptq", "bits": 4, "group_size": group, "sym": symmetric, "desc_act": act_order,
         "checkpoint_format": "gptq"})
    (folder / "config.json").write_text(json.dumps(config))
    return dequantized


def reference_logits(model, dequantized: dict, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        for name, w in dequantized.items():
            model.get_parameter(name).copy_(torch.from_numpy(w))
        return model(torch.tensor([ids])).logits[0].float().numpy()


def jitted_logits(model, ids):
    graphdef, state = nnx.split(model)
    return np.asarray(jax.jit(lambda s, x: nnx.merge(graphdef, s)(x)[0][0])(state, jnp.asarray([ids], jnp.int32)))


CASES = {  # name: (family, method, group size, symmetric, act order, format the layers are held in)
    "awq-g32": ("llama", "awq", 32, False, False, "q4_1"),
    "awq-g64-qwen2": ("qwen2", "awq", 64, False, False, "q4_1"),
    "gptq-g64": ("llama", "gptq", 64, False, False, "q4_1"),
    "gptq-sym-whole-rows": ("qwen2", "gptq", -1, True, False, "q4_0"),
    "gptq-act-order": ("llama", "gptq", 32, False, True, None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_packed_checkpoint_matches_transformers_on_its_dequantized_weights(case, tmp_path, default_processor_dir):
    family, method, group, symmetric, act_order, held = CASES[case]
    torch_model = write_tiny_model(family, tmp_path, default_processor_dir)
    dequantized = write_packed(tmp_path, torch_model, method, group, symmetric=symmetric, act_order=act_order)
    ids = list(range(100, 140, 3))
    ref = reference_logits(torch_model, dequantized, ids)
    # float32 for what is not in blocks (the embedding, norms, head): the reference's dtype
    model, _ = vsurge.load(tmp_path, dtype=jnp.float32, quantization="blocks" if kernels.available() else None,
                           progress=False, load_processor=False)
    formats = set(model.block_formats())
    if held and kernels.available():
        assert formats == {held}, formats
        layer = model.layers[0]
        qkv = layer.wqkv[...]
        assert isinstance(qkv, QuantizedWeight)
        name = next(n for n in dequantized if ".layers.0." in n and "down_proj" in n)
        down = np.asarray(jax.jit(dequantize)(layer.w_down[...]))
        np.testing.assert_allclose(down, dequantized[name], rtol=1e-3, atol=2e-3 * np.abs(down).max())
    else:
        assert not formats  # act-order groups: dequantized at load
    ours = jitted_logits(model, ids)
    rel = np.abs(ours - ref).max() / np.abs(ref).max()
    assert rel <= (LOGIT_RTOL if held else 1e-4), rel
    assert (ours.argmax(-1) == ref.argmax(-1)).all()


def test_explicit_dtype_dequantizes_a_packed_checkpoint(tmp_path, default_processor_dir):
    torch_model = write_tiny_model("llama", tmp_path, default_processor_dir)
    dequantized = write_packed(tmp_path, torch_model, "awq", 32)
    model, _ = vsurge.load(tmp_path, dtype=jnp.float32, progress=False, load_processor=False)
    assert not any(is_quantized(w) for w in model.named_weights().values())
    ids = [5, 17, 300, 4000, 12]
    np.testing.assert_allclose(jitted_logits(model, ids), reference_logits(torch_model, dequantized, ids),
                               rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="quantized already"):
        vsurge.load(tmp_path, quantization="int4", progress=False, load_processor=False)


@pytest.mark.parametrize("change, error, match", [
    ({"bits": 3}, UnsupportedModelError, "3-bit"),
    ({"quant_method": "awq", "version": "gemv"}, UnsupportedModelError, "gemm"),
    ({"checkpoint_format": "marlin"}, UnsupportedModelError, "marlin"),
])
def test_unsupported_schemes_are_refused_by_name(change, error, match, tmp_path, default_processor_dir):
    torch_model = write_tiny_model("llama", tmp_path, default_processor_dir)
    write_packed(tmp_path, torch_model, "gptq", 32)
    path = tmp_path / "config.json"
    config = json.loads(path.read_text())
    config["quantization_config"].update(change)
    path.write_text(json.dumps(config))
    with pytest.raises(error, match=match):
        vsurge.load(tmp_path, progress=False, load_processor=False)


def test_a_missing_part_is_named(tmp_path, default_processor_dir):
    torch_model = write_tiny_model("llama", tmp_path, default_processor_dir)
    write_packed(tmp_path, torch_model, "gptq", 32)
    state = load_file(tmp_path / "model.safetensors")
    del state["model.layers.1.mlp.up_proj.scales"]
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"model\.layers\.1\.mlp\.up_proj\.scales"):
        vsurge.load(tmp_path, progress=False, load_processor=False)


@pytest.mark.parametrize("part, match", [("qzeros", r"qzeros holds"), ("qweight", r"qweight has shape")])
def test_a_part_of_the_wrong_shape_is_named(part, match, tmp_path, default_processor_dir):
    torch_model = write_tiny_model("llama", tmp_path, default_processor_dir)
    write_packed(tmp_path, torch_model, "awq", 32)
    state = load_file(tmp_path / "model.safetensors")
    name = f"model.layers.0.self_attn.o_proj.{part}"
    state[name] = state[name][:, :-1].contiguous()  # one packed column short
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(ModelLoadError, match=match):
        vsurge.load(tmp_path, progress=False, load_processor=False)
