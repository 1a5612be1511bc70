"""Mistral (v0.1 with a sliding window over every layer; later ones without): Llama's layers.

HF: MistralForCausalLM ("mistral"); GGUF: llama.cpp writes Mistral as `llama` (Llama's file),
older converters as `mistral`.
"""

from __future__ import annotations

from .llama import Llama


class Mistral(Llama):
    name = "mistral"
    hf_architectures = ("MistralForCausalLM",)
    gguf_architectures = ("mistral",)

    @classmethod
    def hf_extra(cls, cfg: dict, fields: dict) -> dict:
        window = cfg.get("sliding_window")
        return {"sliding_window": int(window) if window else None}
