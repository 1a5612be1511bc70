"""Qwen3-MoE (Qwen3-30B-A3B, 235B-A22B): Qwen3's attention (per-head q/k RMSNorm, no biases)
with routed experts, top-k probabilities renormalized (`norm_topk_prob`), no shared expert.

HF: Qwen3MoeForCausalLM ("qwen3_moe"); GGUF: `qwen3moe`.
"""

from __future__ import annotations

from .qwen2_moe import Qwen2Moe


class Qwen3Moe(Qwen2Moe):
    name = "qwen3_moe"
    hf_architectures = ("Qwen3MoeForCausalLM",)
    gguf_architectures = ("qwen3moe", "qwen3vlmoe")  # (Qwen3-VL-MoE's text half alone: M-RoPE on text is 1-D)
    qk_norm = True
    renormalize = True
