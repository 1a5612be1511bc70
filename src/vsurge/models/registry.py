"""Which architectures vsurge runs, and how an HF `config.json` maps onto ModelConfig."""

from __future__ import annotations

from typing import Any

from ..config import ModelConfig, RopeScaling
from ..errors import UnsupportedModelError

# HF model_type -> what sets it apart from plain Llama.
SUPPORTED_ARCHITECTURES: dict[str, dict[str, Any]] = {
    "llama": {},
    "mistral": {},
    "qwen2": {"qkv_bias": True},
    "qwen3": {"qk_norm": True},
}


def rope_scaling_from(params: dict | None, where: str) -> RopeScaling:
    """Parse HF `rope_scaling` / `rope_parameters` (transformers 4 and 5 spellings)."""
    if not params:
        return RopeScaling()
    kind = params.get("rope_type", params.get("type", "default")) or "default"
    if kind == "default":
        return RopeScaling()
    if kind == "linear":
        return RopeScaling(kind="linear", factor=float(params["factor"]))
    if kind == "llama3":
        return RopeScaling(
            kind="llama3",
            factor=float(params["factor"]),
            low_freq_factor=float(params.get("low_freq_factor", 1.0)),
            high_freq_factor=float(params.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(params.get("original_max_position_embeddings", 8192)),
        )
    raise UnsupportedModelError(
        f"{where}: rope scaling type {kind!r} is not supported (supported: default, linear, llama3)"
    )


def config_from_hf(cfg: dict, where: str = "config.json") -> ModelConfig:
    """Build a ModelConfig from a parsed HF config.json; `where` names the file in errors."""
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED_ARCHITECTURES:
        archs = cfg.get("architectures")
        raise UnsupportedModelError(
            f"{where}: model_type {model_type!r} (architectures {archs}) is not supported; "
            f"supported: {', '.join(sorted(SUPPORTED_ARCHITECTURES))}"
        )
    act = cfg.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise UnsupportedModelError(f"{where}: hidden_act {act!r} is not supported (only silu)")
    if cfg.get("mlp_bias"):
        raise UnsupportedModelError(f"{where}: mlp_bias=true is not supported")
    try:
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        rope = cfg.get("rope_parameters") or {}
        rope_scaling = cfg.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
        theta = cfg.get("rope_theta", rope.get("rope_theta", 10000.0))
        extra = SUPPORTED_ARCHITECTURES[model_type]
        attention_bias = bool(cfg.get("attention_bias", False))
        window = cfg.get("sliding_window")
        if model_type in ("qwen2", "qwen3") and not cfg.get("use_sliding_window", False):
            window = None
        eos = cfg.get("eos_token_id")
        eos = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        return ModelConfig(
            architecture=model_type,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            rope_scaling=rope_scaling_from(rope_scaling, where),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=extra.get("qkv_bias", False) or attention_bias,
            o_bias=attention_bias and model_type != "qwen2",
            qk_norm=extra.get("qk_norm", False),
            sliding_window=int(window) if window else None,
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos,
            name=str(cfg.get("_name_or_path", "")),
        )
    except KeyError as e:
        raise UnsupportedModelError(f"{where}: required key {e.args[0]!r} is missing") from None
