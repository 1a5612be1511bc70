"""Load a GGUF file (llama.cpp's format): our reader (gguf_file.py), the `gguf` package's dequantizers.

Tensors are dequantized to float, renamed to HF names and, for arch `llama`,
Q/K rows are permuted back from llama.cpp's interleaved RoPE layout to HF's
rotate-half layout, so the same model code serves both sources. Quantized
blocks run along each row (HF's input dimension), so a range of rows (one
device's shard of the output dimension) is dequantized on its own.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from ..config import ModelConfig, RopeScaling
from ..errors import ModelLoadError, UnsupportedModelError
from .gguf_file import GGUFFile

# GGUF arch -> flags that differ from plain Llama, and whether Q/K rows are permuted.
GGUF_ARCHITECTURES = {
    "llama": {"permuted_qk": True},
    "mistral": {"permuted_qk": True},
    "qwen2": {"permuted_qk": False},
    "qwen3": {"permuted_qk": False},
}

# Types this loader promises; others still load if the `gguf` package can dequantize them.
TESTED_QUANT_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K")

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


def open_gguf(path: Path) -> GGUFFile:
    if not path.exists():
        raise ModelLoadError(f"file {str(path)!r} is missing")
    try:
        return GGUFFile(path)
    except Exception as e:  # ValueError/struct.error/UnicodeError/... on garbage
        raise ModelLoadError(f"file {str(path)!r} is not a readable GGUF file: {e}") from None


def field_value(reader: GGUFFile, key: str, default=None):
    value = reader.fields.get(key)
    return default if value is None else value


def hf_name(gguf_name: str) -> str | None:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    return None


def dequantize(tensor, rows: tuple[int, int] | None = None) -> np.ndarray:
    """A reader tensor (rows [start, stop) of it, or all) -> float32 numpy in HF (out, in) order."""
    kind = tensor.tensor_type
    data = tensor.data if rows is None else tensor.data[rows[0]:rows[1]]
    if kind == gguf.GGMLQuantizationType.F32:
        return np.array(data, np.float32)
    if kind == gguf.GGMLQuantizationType.F16:
        return np.asarray(data).astype(np.float32)
    try:
        return gguf.quants.dequantize(data, kind).astype(np.float32, copy=False)
    except NotImplementedError:
        raise UnsupportedModelError(
            f"tensor {tensor.name!r} uses quantization type {kind.name}, which cannot be "
            f"dequantized (supported: {', '.join(TESTED_QUANT_TYPES)} and the other types "
            f"of the gguf package)"
        ) from None


def _unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's interleaving of each head's rotary half-dimensions (rows)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def config_from_gguf(reader: GGUFFile, path: Path) -> ModelConfig:
    arch = field_value(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise UnsupportedModelError(
            f"{str(path)!r}: GGUF architecture {arch!r} is not supported; "
            f"supported: {', '.join(GGUF_ARCHITECTURES)}"
        )

    def key(name, default=None, required=True):
        value = field_value(reader, f"{arch}.{name}", default)
        if value is None and required:
            raise ModelLoadError(f"{str(path)!r}: metadata key {arch}.{name!r} is missing")
        return value

    tensor_names = {t.name for t in reader.tensors}
    hidden, heads = int(key("embedding_length")), int(key("attention.head_count"))
    tokens = field_value(reader, "tokenizer.ggml.tokens")
    vocab = key("vocab_size", None, required=False) or (len(tokens) if tokens is not None else None)
    if vocab is None:
        embed = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
        vocab = int(embed.shape[-1]) if embed is not None else None
    scaling_type = key("rope.scaling.type", "none", required=False)
    if scaling_type in ("none", None):
        scaling = RopeScaling()
    elif scaling_type == "linear":
        scaling = RopeScaling(kind="linear", factor=float(key("rope.scaling.factor")))
    else:
        raise UnsupportedModelError(f"{str(path)!r}: rope scaling type {scaling_type!r} is not supported")
    freq_factors = None
    if "rope_freqs.weight" in tensor_names:
        t = next(t for t in reader.tensors if t.name == "rope_freqs.weight")
        freq_factors = tuple(float(x) for x in dequantize(t).reshape(-1))
    eos = field_value(reader, "tokenizer.ggml.eos_token_id")
    head_count_kv = key("attention.head_count_kv", heads, required=False)
    window = key("attention.sliding_window", None, required=False)
    return ModelConfig(
        architecture=arch,
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(key("feed_forward_length")),
        num_layers=int(key("block_count")),
        num_heads=heads,
        num_kv_heads=int(head_count_kv),
        head_dim=int(key("attention.key_length", hidden // heads, required=False)),
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-5, required=False)),
        rope_theta=float(key("rope.freq_base", 10000.0, required=False)),
        rope_scaling=scaling,
        rope_freq_factors=freq_factors,
        max_position_embeddings=int(key("context_length", 4096, required=False)),
        tie_word_embeddings="output.weight" not in tensor_names,
        qkv_bias="blk.0.attn_q.bias" in tensor_names,
        o_bias="blk.0.attn_output.bias" in tensor_names,
        qk_norm="blk.0.attn_q_norm.weight" in tensor_names,
        sliding_window=int(window) if window else None,
        bos_token_id=field_value(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=(int(eos),) if eos is not None else (),
        name=str(field_value(reader, "general.name", path.stem)),
    )


class GGUFSource:
    """The tensors of a GGUF file under their HF names, dequantized on demand."""

    def __init__(self, reader: GGUFFile, config: ModelConfig, path: Path):
        self.path = path
        self.config = config
        self.permuted = GGUF_ARCHITECTURES[config.architecture]["permuted_qk"]
        self._tensors = {}
        for t in reader.tensors:
            if t.name == "rope_freqs.weight":
                continue  # folded into the config
            name = hf_name(t.name)
            self._tensors[name or t.name] = t

    def names(self) -> set[str]:
        return set(self._tensors)

    def where(self, name: str) -> str:
        t = self._tensors.get(name)
        return f"{str(self.path)!r}" + (f" (GGUF tensor {t.name!r})" if t is not None else "")

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(int(n) for n in reversed(self._tensors[name].shape))

    def read(self, name: str, rows: tuple[int, int] | None = None, cols: tuple[int, int] | None = None) -> np.ndarray:
        """Rows [start, stop) and columns [start, stop) in HF order (None: all); only those rows
        are dequantized (whole heads of Q/K, which llama.cpp permutes within each head)."""
        total = self.shape(name)[0]
        start, stop = rows if rows is not None else (0, total)
        permuted = self.permuted and (".q_proj." in name or ".k_proj." in name)
        heads = (self.config.num_heads if ".q_proj." in name else self.config.num_kv_heads) if permuted else 1
        if permuted and total % (2 * heads) == 0:
            size = total // heads  # rows of one head
            first, last = start // size, -(-stop // size)
            arr = _unpermute_rows(dequantize(self._tensors[name], (first * size, last * size)), last - first)
            arr = arr[start - first * size:stop - first * size]
        else:
            arr = dequantize(self._tensors[name], None if rows is None else (start, stop))
        return arr if cols is None else arr[:, cols[0]:cols[1]]

    def get(self, name: str) -> np.ndarray:
        return self.read(name)
