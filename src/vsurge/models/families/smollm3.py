"""SmolLM3: Llama's layers where every fourth layer (or those `no_rope_layers` marks 0) uses no
positions at all (NoPE); optional sliding windows on the NoPE layers.

HF: SmolLM3ForCausalLM ("smollm3"); GGUF: `smollm3` (q/k permuted as for `llama`; llama.cpp
fixes the NoPE step at 4).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...config import ModelConfig, Rope
from ..parts.config_io import GGUFMeta, gguf_fields, hf_layer_types
from .llama import Llama

NOPE_STEP = 4


@dataclass(frozen=True)
class SmolLM3Config(ModelConfig):
    rope_layers: tuple[bool, ...] = ()  # per layer: True = RoPE, False = NoPE

    def layer_rope(self, layer: int) -> Rope | None:
        return self.rope if self.rope_layers[layer] else None


class SmolLM3(Llama):
    name = "smollm3"
    hf_architectures = ("SmolLM3ForCausalLM",)
    gguf_architectures = ("smollm3",)
    config_class = SmolLM3Config

    @classmethod
    def hf_extra(cls, cfg: dict, fields: dict) -> dict:
        n = fields["num_layers"]
        interval = int(cfg.get("no_rope_layer_interval", NOPE_STEP))
        rope_layers = cfg.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(n)]
        window = cfg.get("sliding_window") if cfg.get("use_sliding_window") else None
        return {"rope_layers": tuple(bool(r) for r in rope_layers[:n]),
                "sliding_window": int(window) if window else None,
                "layer_types": hf_layer_types(cfg, n) if window else None}

    @classmethod
    def config_from_gguf(cls, meta: GGUFMeta, where: str) -> ModelConfig:
        fields = gguf_fields(meta, cls.name)
        return SmolLM3Config(**fields, qkv_bias=meta.has("blk.0.attn_q.bias"),
                             o_bias=meta.has("blk.0.attn_output.bias"),
                             rope_layers=tuple((i + 1) % NOPE_STEP != 0 for i in range(fields["num_layers"])))
