"""Qwen2 / Qwen2.5: Llama's layers with q/k/v biases (no o bias); sliding windows only when
`use_sliding_window` (on the layers from `max_window_layers` on).

HF: Qwen2ForCausalLM ("qwen2"); GGUF: `qwen2` (rotate-half q/k as stored: not permuted).
"""

from __future__ import annotations

from ..parts.config_io import check_activation, hf_fields, hf_layer_types
from .llama import Llama


class Qwen2(Llama):
    name = "qwen2"
    hf_architectures = ("Qwen2ForCausalLM",)
    gguf_architectures = ("qwen2", "qwen2vl")  # (Qwen2.5-VL's text half alone: M-RoPE on text is 1-D rotary)
    gguf_permuted_qk = False

    @classmethod
    def config_from_hf(cls, cfg, where):
        check_activation(cfg, where, ("silu", "swish"))
        fields = hf_fields(cfg, where, cls.name)
        window, types = None, None
        if cfg.get("use_sliding_window") and cfg.get("sliding_window"):
            window = int(cfg["sliding_window"])
            types = hf_layer_types(cfg, fields["num_layers"]) or tuple(
                "sliding" if i >= int(cfg.get("max_window_layers", 0)) else "full" for i in range(fields["num_layers"]))
        return cls.config_class(**fields, qkv_bias=True, o_bias=False, sliding_window=window, layer_types=types,
                                **cls.hf_extra(cfg, fields))
