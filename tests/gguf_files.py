"""Write small GGUF files from torch checkpoints with the `gguf` package's writer.

Tensors are renamed and (for arch llama) Q/K rows permuted exactly as
llama.cpp's converter does, then quantized per tensor with the chosen type.
K-quant types cannot be produced by gguf-py, so those tensors get random but
valid blocks (their reference value is whatever they dequantize to).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType

HF_TO_GGUF_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
HF_TO_GGUF_GLOBAL = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
# Types gguf-py cannot quantize get random blocks; these are the byte offsets of
# each block's float16 scale fields, set to a small value so weights stay sane.
_RAW_BLOCK_SCALES = {Q.Q4_K: (0, 2), Q.Q6_K: (208,), Q.Q5_K: (0, 2), Q.Q3_K: (108,), Q.Q2_K: (80, 82),
                     Q.Q8_1: (0, 2)}


def gguf_name(hf_name: str) -> str:
    if hf_name in HF_TO_GGUF_GLOBAL:
        return HF_TO_GGUF_GLOBAL[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    return f"blk.{layer}.{HF_TO_GGUF_LAYER[rest]}"


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter: rotate-half rows -> interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def random_blocks(rows: int, cols: int, qtype, rng) -> np.ndarray:
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, cols // block_size, type_size), dtype=np.uint8)
    scale = np.frombuffer(np.float16(0.002).tobytes(), np.uint8)
    for offset in _RAW_BLOCK_SCALES[qtype]:
        raw[:, :, offset : offset + 2] = scale
    return raw.reshape(rows, -1)


@lru_cache(maxsize=4)
def _tokenizer_fields(source: Path) -> dict:
    from vsurge.loading.gguf_file import GGUFFile  # one pass with struct: gguf's reader takes seconds here

    return {k: v for k, v in GGUFFile(source).fields.items() if k.startswith("tokenizer.")}


def copy_tokenizer_metadata(writer: gguf.GGUFWriter, source: Path) -> None:
    f = _tokenizer_fields(Path(source))
    writer.add_tokenizer_model(f["tokenizer.ggml.model"])
    writer.add_tokenizer_pre(f["tokenizer.ggml.pre"])
    writer.add_token_list(f["tokenizer.ggml.tokens"])
    writer.add_token_types(f["tokenizer.ggml.token_type"])
    writer.add_token_merges(f["tokenizer.ggml.merges"])
    writer.add_bos_token_id(f["tokenizer.ggml.bos_token_id"])
    writer.add_eos_token_id(f["tokenizer.ggml.eos_token_id"])
    writer.add_pad_token_id(f["tokenizer.ggml.padding_token_id"])
    writer.add_add_bos_token(False)
    writer.add_chat_template(f["tokenizer.chat_template"])


def write_gguf(path: Path, torch_model, arch: str, types: dict[str, object], tokenizer_source: Path,
               seed: int = 0) -> dict[str, np.ndarray]:
    """Write `torch_model` as GGUF. types: GGUF tensor suffix (e.g. "attn_q.weight") -> quant type
    (default F32). Returns HF name -> the float32 array the file really holds (HF layout)."""
    cfg = torch_model.config
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny-{arch}")
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    writer.add_rope_dimension_count(head_dim)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_vocab_size(cfg.vocab_size)
    copy_tokenizer_metadata(writer, tokenizer_source)

    held: dict[str, np.ndarray] = {}
    for hf_name, tensor in torch_model.state_dict().items():
        if hf_name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        name = gguf_name(hf_name)
        w = tensor.detach().float().numpy()
        qtype = types.get(name.split(".", 2)[-1] if name.startswith("blk.") else name, Q.F32)
        if w.ndim == 1:
            qtype = Q.F32  # norms and biases stay float32, as llama.cpp keeps them
        permute_heads = None
        if arch == "llama" and hf_name.endswith("q_proj.weight"):
            permute_heads = cfg.num_attention_heads
        elif arch == "llama" and hf_name.endswith("k_proj.weight"):
            permute_heads = cfg.num_key_value_heads
        stored = llama_cpp_permute(w, permute_heads) if permute_heads else w
        if qtype in _RAW_BLOCK_SCALES:
            data = random_blocks(stored.shape[0], stored.shape[1], qtype, rng)
        elif qtype == Q.F32:
            data = stored.astype(np.float32)
        elif qtype == Q.F16:
            data = stored.astype(np.float16)
        else:
            data = gguf.quants.quantize(stored, qtype)
        if qtype in (Q.F32, Q.F16):
            writer.add_tensor(name, data)
            value = data.astype(np.float32)
        else:
            writer.add_tensor(name, data, raw_dtype=qtype)
            try:
                value = gguf.quants.dequantize(data, qtype)
            except NotImplementedError:  # e.g. Q8_1: written to test the loader's error
                continue
        if permute_heads:  # back to HF layout: what a correct loader must produce
            value = value.reshape(permute_heads, value.shape[0] // permute_heads // 2, 2, -1)
            value = value.swapaxes(1, 2).reshape(stored.shape)
        held[hf_name] = value
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return held


def write_gguf_lora(path: Path, peft_dir: Path, config, arch: str = "llama") -> None:
    """A PEFT LoRA adapter written as llama.cpp's convert_lora_to_gguf.py writes it with `--outtype f32`: per
    adapted projection `<its GGUF tensor>.lora_a` (r, in) and `.lora_b` (out, r), B's rows in the base tensor's
    GGUF layout (q/k interleaved for `llama`), general.type "adapter", adapter.type "lora", adapter.lora.alpha.
    (Checked tensor by tensor against the real converter's output on a tiny Llama when this was written.)"""
    import json

    from safetensors.numpy import load_file

    alpha = float(json.loads((peft_dir / "adapter_config.json").read_text())["lora_alpha"])
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    for key, value in sorted(load_file(str(peft_dir / "adapter_model.safetensors")).items()):
        module, part = key.removeprefix("base_model.model.").rsplit(".lora_", 1)
        name = gguf_name(module + ".weight")
        value = value.astype(np.float32)
        if part.startswith("B") and arch == "llama" and module.endswith(("q_proj", "k_proj")):
            heads = config.num_attention_heads if module.endswith("q_proj") else config.num_key_value_heads
            value = llama_cpp_permute(value, heads)
        writer.add_tensor(f"{name}.lora_{part[0].lower()}", value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
