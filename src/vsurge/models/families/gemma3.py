"""Gemma 3 (text): Gemma 2's layers with a per-head q/k RMSNorm, no attention soft-cap, five
sliding-window layers to every global one, and two rotary bases (local 10k on sliding
layers; the global base, with its linear scaling, on the others).

HF: Gemma3ForCausalLM ("gemma3_text"); GGUF: `gemma3` (the sliding base is
`rope.freq_base_swa`, 10000 when absent, as llama.cpp assumes).
"""

from __future__ import annotations

import dataclasses

from ..parts.config_io import GGUFMeta, rope_from_hf
from .gemma2 import Gemma2, gguf_query_scalar


class Gemma3(Gemma2):
    name = "gemma3"
    hf_model_types = ("gemma3_text",)
    hf_architectures = ("Gemma3ForCausalLM",)
    gguf_architectures = ("gemma3",)
    sliding_pattern = 6

    @classmethod
    def hf_extra(cls, cfg: dict, fields: dict) -> dict:
        params = cfg.get("rope_parameters") or {}
        hd = fields["head_dim"]
        if "full_attention" in params:  # transformers 5: one dict per layer type
            full, local = params["full_attention"], params.get("sliding_attention") or {}
        else:  # transformers 4: rope_theta (+ rope_scaling) global, rope_local_base_freq local
            full = {**(cfg.get("rope_scaling") or {}), "rope_theta": cfg.get("rope_theta", 1_000_000.0)}
            local = {}
        full = {"rope_theta": 1_000_000.0, **full}
        local = {"rope_theta": cfg.get("rope_local_base_freq", 10_000.0), **local}
        where = "config.json"
        return {"qk_norm": True, "attn_softcap": None, "rope": rope_from_hf(full, hd, where),
                "local_rope": rope_from_hf(local, hd, where)}

    @classmethod
    def gguf_extra(cls, meta: GGUFMeta, fields: dict) -> dict:
        local = dataclasses.replace(fields["rope"], kind="default", factor=1.0,
                                    theta=float(meta.key("rope.freq_base_swa", 10_000.0)))
        return {"qk_norm": True, "local_rope": local, "attn_softcap": None,
                "query_pre_attn_scalar": gguf_query_scalar(meta, fields, 62)}
