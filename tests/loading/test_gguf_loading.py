"""GGUF files written by the gguf package's writer load into vsurge with the right weights.

Each test model mixes quantization types; the reference is (1) what the file's
blocks dequantize to, mapped back to HF layout by the test's own inverse
permutation, and (2) transformers' GGUF loader reading the same file.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

import vsurge
from gguf_files import Q, write_gguf
from vsurge.errors import UnsupportedModelError
from vsurge.models.parts.fused import unfuse_qkv

LLAMA_TYPES = {
    "token_embd.weight": Q.F16,
    "output.weight": Q.Q8_0,
    "attn_q.weight": Q.Q8_0,
    "attn_k.weight": Q.Q4_0,
    "attn_v.weight": Q.Q4_1,
    "attn_output.weight": Q.BF16,
    "ffn_gate.weight": Q.Q5_0,
    "ffn_up.weight": Q.Q4_K,
    "ffn_down.weight": Q.Q6_K,
}
QWEN_TYPES = {"token_embd.weight": Q.Q8_0, "attn_q.weight": Q.Q4_1, "attn_k.weight": Q.Q4_1,
              "ffn_up.weight": Q.Q6_K, "ffn_down.weight": Q.Q4_K}


def tiny_torch_model(cls_name: str, **extra):
    config = getattr(transformers, cls_name)(
        hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=49152, max_position_embeddings=512, rms_norm_eps=1e-5, **extra)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith(".bias"):
                p.add_(0.1 * torch.randn_like(p))
    return model


def hf_gguf_logits(path, ids):
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    with torch.no_grad():
        return ref(torch.tensor([ids])).logits[0].numpy()


def loaded_weight(model, hf_name: str) -> np.ndarray:
    """Pull one HF-named tensor back out of vsurge's fused layout (HF (out, in) order)."""
    layer = model.layers[int(hf_name.split(".")[2])]
    part = hf_name.split(".", 3)[3]
    if part.startswith("self_attn.") and part[10] in "qkv" and part[11:17] == "_proj.":
        q, k, v = unfuse_qkv(np.asarray(layer.wqkv[...]), model.config)
        return {"q": q, "k": k, "v": v}[part[10]].T
    if part in ("mlp.gate_proj.weight", "mlp.up_proj.weight"):
        return np.asarray(layer.w_gate_up[...])[:, (0 if "gate" in part else 1)::2].T
    return np.asarray(getattr(layer, {"self_attn.o_proj.weight": "wo", "mlp.down_proj.weight": "w_down"}[part])[...]).T


@pytest.mark.parametrize("arch,cls_name,types,extra", [
    ("llama", "LlamaConfig", LLAMA_TYPES, {}),
    ("qwen2", "Qwen2Config", QWEN_TYPES, {}),
])
def test_written_gguf_matches_dequantized_reference(arch, cls_name, types, extra, tmp_path, default_gguf_path):
    torch_model = tiny_torch_model(cls_name, **extra)
    path = tmp_path / f"tiny-{arch}.gguf"
    held = write_gguf(path, torch_model, arch, types, default_gguf_path)
    model, processor = vsurge.load(path, dtype=jnp.float32, progress=False)
    assert model.config.architecture == arch
    assert processor.eos_token_id == 2

    for hf_name, value in held.items():  # every matrix, after un-permutation, is what the file holds
        if ".layers." in hf_name and hf_name.endswith("proj.weight"):
            np.testing.assert_allclose(loaded_weight(model, hf_name), value, rtol=0, atol=1e-6,
                                       err_msg=hf_name)
    # Q8_0 / F16 round trips stay close to the original float weights.
    np.testing.assert_allclose(loaded_weight(model, "model.layers.0.self_attn.q_proj.weight"),
                               torch_model.model.layers[0].self_attn.q_proj.weight.detach().numpy(),
                               atol=0.01 if arch == "llama" else 0.1)

    ids = processor.encode("GGUF round trip: 12 ducks 🦆 swim.")
    ours = np.asarray(model(jnp.asarray([ids], jnp.int32))[0][0])
    ref = hf_gguf_logits(path, ids)
    assert np.abs(ours - ref).max() <= 1e-4 * max(1.0, np.abs(ref).max())


def test_unsupported_quant_type_names_the_tensor(tmp_path, default_gguf_path):
    # Q8_1 is a real GGML type that the gguf package cannot dequantize.
    path = tmp_path / "q8_1.gguf"
    write_gguf(path, tiny_torch_model("LlamaConfig"), "llama", {"attn_q.weight": Q.Q8_1}, default_gguf_path)
    with pytest.raises(UnsupportedModelError) as info:
        vsurge.load(path, progress=False)
    assert "blk.0.attn_q.weight" in str(info.value) and "Q8_1" in str(info.value)
