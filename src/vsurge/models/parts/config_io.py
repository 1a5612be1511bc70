"""Reading the config keys most families share: HF `config.json` dicts and GGUF metadata.

A family's `config_from_hf` / `config_from_gguf` start from `hf_fields` /
`gguf_fields` (the fields of config.ModelConfig) and add their own keys.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ...config import Rope
from ...errors import ModelLoadError, UnsupportedModelError

ROPE_KINDS = ("default", "linear", "llama3", "yarn", "longrope")


class GGUFMeta:
    """A GGUF file's metadata and tensor directory, as the families read them.

    fields: key -> value; tensors: name -> shape in HF order (out, in); read: name -> float32
    numpy (for the few tensors a config is made of, e.g. rope frequency factors)."""

    def __init__(self, fields: dict, tensors: dict[str, tuple[int, ...]], read: Callable[[str], np.ndarray],
                 where: str):
        self.fields, self.tensors, self._read, self.where = fields, tensors, read, where
        self.arch = str(fields.get("general.architecture"))

    def get(self, key: str, default=None):
        value = self.fields.get(key)
        return default if value is None else value

    def key(self, name: str, default=None, required: bool = False):
        """`<arch>.<name>`; a missing required key is an error that names it."""
        value = self.get(f"{self.arch}.{name}", default)
        if value is None and required:
            raise ModelLoadError(f"{self.where}: metadata key {self.arch}.{name!r} is missing")
        return value

    def per_layer(self, name: str, layers: int, default=0) -> list:
        """`<arch>.<name>` for each of `layers` layers: the key's list as written, or its one value (or
        `default`) repeated (llama.cpp writes per-layer keys such as head_count_kv either way)."""
        value = self.key(name, default)
        return list(value)[:layers] if isinstance(value, list) else [value if value is not None else default] * layers

    def has(self, tensor: str) -> bool:
        return tensor in self.tensors

    def has_any(self, layer_tensor: str) -> bool:
        """Whether some layer holds `blk.<i>.<layer_tensor>` (hybrids: only the layers of one kind do)."""
        return any(name.startswith("blk.") and name.split(".", 2)[2] == layer_tensor for name in self.tensors)

    def read(self, tensor: str) -> np.ndarray:
        return self._read(tensor)


# ---------------------------------------------------------------- HF config.json
def _eos(value) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(v) for v in value) if isinstance(value, list) else (int(value),)


def hf_rope_parameters(cfg: dict) -> dict:
    """The rope parameters of a config.json in either spelling (transformers 4: rope_theta +
    rope_scaling; 5: rope_parameters), merged; `partial_rotary_factor` included when set."""
    params = dict(cfg.get("rope_parameters") or {})
    if cfg.get("rope_scaling"):
        params = {**params, **cfg["rope_scaling"]}
    params.setdefault("rope_theta", cfg.get("rope_theta", params.get("rope_theta", 10000.0)))
    if "partial_rotary_factor" in cfg and "partial_rotary_factor" not in params:
        params["partial_rotary_factor"] = cfg["partial_rotary_factor"]
    return params


def rope_from_hf(params: dict, head_dim: int, where: str, *, max_position_embeddings: int | None = None) -> Rope:
    """An HF rope parameter dict -> Rope."""
    kind = params.get("rope_type", params.get("type", "default")) or "default"
    if kind == "su":  # Phi-3's early name for longrope
        kind = "longrope"
    if kind not in ROPE_KINDS:
        raise UnsupportedModelError(f"{where}: rope scaling type {kind!r} is not supported "
                                    f"(supported: {', '.join(ROPE_KINDS)})")
    theta = float(params.get("rope_theta", 10000.0))
    partial = float(params.get("partial_rotary_factor", 1.0) or 1.0)
    dim = int(head_dim * partial) if partial != 1.0 else None
    original = params.get("original_max_position_embeddings")
    if kind == "default":
        return Rope(theta=theta, dim=dim)
    factor = params.get("factor")
    if factor is None and kind in ("yarn", "longrope") and original and max_position_embeddings:
        factor = max_position_embeddings / original  # how DeepSeek-V3 and Phi-3 state it
    rope = Rope(kind=kind, theta=theta, dim=dim, factor=float(factor or 1.0),
                original_max_position_embeddings=int(original) if original else None)
    if kind == "llama3":
        return _replace(rope, low_freq_factor=float(params.get("low_freq_factor", 1.0)),
                        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
                        original_max_position_embeddings=int(original or 8192))
    if kind == "yarn":
        if original is None:
            raise ModelLoadError(f"{where}: yarn rope scaling needs original_max_position_embeddings")
        return _replace(rope, beta_fast=float(params.get("beta_fast") or 32.0),
                        beta_slow=float(params.get("beta_slow") or 1.0), mscale=_opt(params.get("mscale")),
                        mscale_all_dim=_opt(params.get("mscale_all_dim")),
                        attention_factor=_opt(params.get("attention_factor")),
                        truncate=bool(params.get("truncate", True)))
    if kind == "longrope":
        return _replace(rope, short_factor=tuple(float(x) for x in params["short_factor"]),
                        long_factor=tuple(float(x) for x in params["long_factor"]),
                        attention_factor=_opt(params.get("attention_factor")))
    return rope


def _opt(x):
    return None if x is None else float(x)


def _replace(rope: Rope, **changes) -> Rope:
    import dataclasses

    return dataclasses.replace(rope, **changes)


def hf_fields(cfg: dict, where: str, architecture: str, *, head_dim: int | None = None) -> dict[str, Any]:
    """ModelConfig fields every family reads the same way from config.json."""
    try:
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        hd = head_dim or int(cfg.get("head_dim") or hidden // heads)
        max_pos = int(cfg.get("max_position_embeddings", 4096))
        return dict(
            architecture=architecture,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg.get("intermediate_size") or 0),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=hd,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope=rope_from_hf(hf_rope_parameters(cfg), hd, where, max_position_embeddings=max_pos),
            max_position_embeddings=max_pos,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=_eos(cfg.get("eos_token_id")),
            name=str(cfg.get("_name_or_path", "")),
        )
    except KeyError as e:
        raise ModelLoadError(f"{where}: required key {e.args[0]!r} is missing") from None


def hf_layer_types(cfg: dict, num_layers: int) -> tuple[str, ...] | None:
    """HF `layer_types` ("sliding_attention" / "full_attention" per layer) -> ("sliding" | "full", ...)."""
    types = cfg.get("layer_types")
    if not types:
        return None
    return tuple("sliding" if t == "sliding_attention" else "full" for t in types[:num_layers])


def json_float(x) -> float:
    """A config.json number; transformers 5 writes infinity as {"__float__": "Infinity"}."""
    return float(x["__float__"] if isinstance(x, dict) else x)


def check_activation(cfg: dict, where: str, allowed: tuple[str, ...], key: str = "hidden_act") -> str:
    act = cfg.get(key, allowed[0])
    if act not in allowed:
        raise UnsupportedModelError(f"{where}: {key} {act!r} is not supported (supported: {', '.join(allowed)})")
    return act


# ---------------------------------------------------------------- GGUF metadata
def gguf_rope(meta: GGUFMeta, head_dim: int) -> Rope:
    kind = meta.key("rope.scaling.type", "none")
    theta = float(meta.key("rope.freq_base", 10000.0))
    dim = meta.key("rope.dimension_count")
    dim = int(dim) if dim is not None and int(dim) != head_dim else None
    freq_factors = None
    if meta.has("rope_freqs.weight"):
        freq_factors = tuple(float(x) for x in meta.read("rope_freqs.weight").reshape(-1))
    if kind in ("none", None):
        return Rope(theta=theta, dim=dim, freq_factors=freq_factors)
    if kind == "linear":
        return Rope(kind="linear", theta=theta, dim=dim, factor=float(meta.key("rope.scaling.factor", required=True)),
                    freq_factors=freq_factors)
    if kind == "yarn":
        # YaRN's mscale_all_dim (the models that write it take mscale equal to it; DeepSeek's
        # converter writes a tenth of it, which models/families/deepseek.py undoes)
        log_mul = meta.key("rope.scaling.yarn_log_multiplier")
        mscale = float(log_mul) if log_mul else None
        return Rope(kind="yarn", theta=theta, dim=dim, factor=float(meta.key("rope.scaling.factor", required=True)),
                    original_max_position_embeddings=int(meta.key("rope.scaling.original_context_length",
                                                                  required=True)),
                    beta_fast=float(meta.key("rope.scaling.yarn_beta_fast", 32.0)),
                    beta_slow=float(meta.key("rope.scaling.yarn_beta_slow", 1.0)), mscale=mscale,
                    mscale_all_dim=mscale, freq_factors=freq_factors)
    raise UnsupportedModelError(f"{meta.where}: rope scaling type {kind!r} is not supported")


def _widest(value) -> int:
    """A per-model or per-layer (list) GGUF width as one number: the widest layer's."""
    return max((int(x) for x in value), default=0) if isinstance(value, list) else int(value or 0)


def gguf_fields(meta: GGUFMeta, architecture: str, *, head_dim: int | None = None) -> dict[str, Any]:
    """ModelConfig fields every family reads the same way from GGUF metadata."""
    hidden, heads = int(meta.key("embedding_length", required=True)), int(meta.key("attention.head_count",
                                                                                     required=True))
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = meta.key("vocab_size") or (len(tokens) if tokens is not None else None)
    if vocab is None and meta.has("token_embd.weight"):
        vocab = meta.tensors["token_embd.weight"][0]
    hd = head_dim or int(meta.key("attention.key_length", hidden // heads))
    kv = meta.key("attention.head_count_kv", heads)
    eos = meta.get("tokenizer.ggml.eos_token_id")
    return dict(
        architecture=architecture,
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=_widest(meta.key("feed_forward_length", 0)),
        # (llama.cpp's converter counts a checkpoint's multi-token-prediction layers, Qwen3.5's, GLM-4.5's, as
        # blocks after the model's own: nextn_predict_layers of them, which the model does not run)
        num_layers=int(meta.key("block_count", required=True)) - int(meta.key("nextn_predict_layers", 0) or 0),
        num_heads=heads,
        num_kv_heads=int(kv if not isinstance(kv, list) else kv[0]),
        head_dim=hd,
        rms_norm_eps=float(meta.key("attention.layer_norm_rms_epsilon", 1e-5)),
        rope=gguf_rope(meta, hd),
        max_position_embeddings=int(meta.key("context_length", 4096)),
        tie_word_embeddings=not meta.has("output.weight"),
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=(int(eos),) if eos is not None else (),
        name=str(meta.get("general.name", "")),
    )
