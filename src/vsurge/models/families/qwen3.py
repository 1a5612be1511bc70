"""Qwen3 (dense): Llama's layers with a per-head RMSNorm on q and k before RoPE.

HF: Qwen3ForCausalLM ("qwen3"); GGUF: `qwen3` (q/k not permuted).
"""

from __future__ import annotations

from .llama import Llama


class Qwen3(Llama):
    name = "qwen3"
    hf_architectures = ("Qwen3ForCausalLM",)
    gguf_architectures = ("qwen3", "qwen3vl")  # (Qwen3-VL's text half alone: M-RoPE on text is 1-D rotary)
    gguf_permuted_qk = False

    @classmethod
    def hf_extra(cls, cfg: dict, fields: dict) -> dict:
        return {"qk_norm": True}
