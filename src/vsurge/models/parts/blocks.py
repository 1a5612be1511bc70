"""Pieces most families are built from: grouped-query attention and gated MLPs, each as its
weight declarations (HF and llama.cpp tensor names) and its forward pass.

Weight names inside a layer (D hidden, F ffn, Q = H*hd, K = KVH*hd):
    wqkv  (D, Q+2K)   fused q/k/v, grouped per KV head (models/parts/fused.py)   bqkv (Q+2K,)
    wo    (Q, D)                                                         bo   (D,)
    q_norm, k_norm  (hd,) per-head RMSNorm, or (Q,) / (K,) over all heads (OLMo 2)
    sinks (H,)        per-head softmax sink logits (GPT-OSS)
    w_gate_up (D, 2F) gate/up interleaved          w_down (F, D)
Norm names are the family's own (attn_norm, mlp_norm, post_attn_norm, ...).
"""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp

from ...config import ModelConfig
from ...kv.recurrent import by_length
from ...ops.linear import linear
from ...ops.lora import adapted
from ...ops.mlp import gated
from ...ops.norm import rms_norm
from ...ops.rope import apply_rope
from ...ops.short_conv import causal_conv, causal_conv_in_place, causal_conv_step
from .fused import split_qkv
from .spec import FusedQKV, GateUp, Tensor, Weight, tensor


# ---------------------------------------------------------------- declarations
def norm(d: int, hf: str | None, gguf: str | None, *, hf_offset: float = 0.0) -> Weight:
    """An RMSNorm weight; hf_offset 1 for checkpoints storing w where the model multiplies by
    1 + w (Gemma: llama.cpp's converter stores 1 + w already)."""
    return Weight((d,), ("embed",), hf and tensor(hf, (d,), offset=hf_offset), gguf and tensor(gguf, (d,)),
                  init="ones")


def attention_weights(c: ModelConfig, *, hf: str, gguf: str | None, permuted_qk: bool = False,
                      hf_qkv: str | None = None, gguf_qkv: str | None = None, qk_norm_width: str = "head",
                      qk_norm_offset: float = 0.0, sinks: bool = False,
                      interleaved_rotary: int = 0) -> dict[str, Weight]:
    """q/k/v/o (+ biases, q/k norms, sinks) of one layer. hf / gguf: the tensor name prefixes
    ("model.layers.3.self_attn", "blk.3"). permuted_qk: llama.cpp's converter stored the q/k rows
    interleaved per head (its `llama` rotary layout). interleaved_rotary: the first that many dims
    of each q/k head rotate in adjacent pairs in the checkpoint itself, both formats (GLM-4,
    Cohere 2): put in rotate-half order at load. hf_qkv / gguf_qkv: the checkpoint fuses q, k, v
    into one tensor of that name (Phi-3). qk_norm_width "head" (hd,) or "all" (Q,)/(K,)."""
    D, Q, K, H, KVH, hd = c.hidden_size, c.q_size, c.kv_size, c.num_heads, c.num_kv_heads, c.head_dim
    qkv = Q + 2 * K

    def parts(prefix: str | None, fused: str | None, kind: str, shape_tail: tuple, gguf_names: bool):
        if prefix is None:
            return None
        if fused is not None:
            name = f"{prefix}.{fused}.{kind}"
            full = (qkv, *shape_tail)
            q = Tensor(name, full, rows=(0, Q))
            k = Tensor(name, full, rows=(Q, Q + K))
            v = Tensor(name, full, rows=(Q + K, qkv))
        else:
            names = ("attn_q", "attn_k", "attn_v") if gguf_names else ("q_proj", "k_proj", "v_proj")
            perm = (permuted_qk and gguf_names) or interleaved_rotary
            span = (0, interleaved_rotary) if interleaved_rotary else None
            q = Tensor(f"{prefix}.{names[0]}.{kind}", (Q, *shape_tail), permuted_heads=H if perm else 0,
                       permute_span=span)
            k = Tensor(f"{prefix}.{names[1]}.{kind}", (K, *shape_tail), permuted_heads=KVH if perm else 0,
                       permute_span=span)
            v = Tensor(f"{prefix}.{names[2]}.{kind}", (K, *shape_tail))
        if shape_tail:  # matrices: the model reads them (in, out)
            q, k, v = (dataclasses.replace(t, transpose=True) for t in (q, k, v))
        return FusedQKV(q, k, v, H, KVH, hd)

    out = {
        "wqkv": Weight((D, qkv), ("embed", "kv_heads"), parts(hf, hf_qkv, "weight", (D,), False),
                       parts(gguf, gguf_qkv, "weight", (D,), True), quantize=True, kv_groups=True),
        "wo": Weight((Q, D), ("heads", "embed"), tensor(f"{hf}.o_proj.weight", (D, Q)),
                     gguf and tensor(f"{gguf}.attn_output.weight", (D, Q)), quantize=True),
    }
    if c.qkv_bias:
        out["bqkv"] = Weight((qkv,), ("kv_heads",), parts(hf, hf_qkv, "bias", (), False),
                             parts(gguf, gguf_qkv, "bias", (), True), init="zeros", kv_groups=True)
    if c.o_bias:
        out["bo"] = Weight((D,), ("embed",), tensor(f"{hf}.o_proj.bias", (D,)),
                           gguf and tensor(f"{gguf}.attn_output.bias", (D,)), init="zeros")
    if c.qk_norm:
        qn, kn = (hd, hd) if qk_norm_width == "head" else (Q, K)
        axis = ("head_dim",) if qk_norm_width == "head" else (None,)
        out["q_norm"] = Weight((qn,), axis, tensor(f"{hf}.q_norm.weight", (qn,), offset=qk_norm_offset),
                               gguf and tensor(f"{gguf}.attn_q_norm.weight", (qn,)), init="ones")
        out["k_norm"] = Weight((kn,), axis, tensor(f"{hf}.k_norm.weight", (kn,), offset=qk_norm_offset),
                               gguf and tensor(f"{gguf}.attn_k_norm.weight", (kn,)), init="ones")
    if sinks:
        out["sinks"] = Weight((H,), ("heads",), tensor(f"{hf}.sinks", (H,)),
                              gguf and tensor(f"{gguf}.attn_sinks.weight", (H,)), init="zeros")
    return out


def mlp_weights(d: int, f: int, *, hf: str, gguf: str | None, hf_gate_up: str | None = None,
                gguf_gate_up: str | None = None, gguf_suffix: str = "") -> dict[str, Weight]:
    """A gated MLP: w_gate_up (D, 2F) and w_down (F, D). hf / gguf: name prefixes ("model.layers.3.mlp",
    "blk.3"); *_gate_up: the checkpoint fuses gate and up rows into one tensor (Phi-3).
    gguf_suffix: llama.cpp's suffix of the tensor kind ("_shexp" for a shared expert)."""
    def gate_up(prefix, fused, gate, up):
        if prefix is None:
            return None
        if fused is not None:
            name = f"{prefix}.{fused}.weight"
            return GateUp(tensor(name, (2 * f, d), rows=(0, f)), tensor(name, (2 * f, d), rows=(f, 2 * f)))
        return GateUp(tensor(f"{prefix}.{gate}.weight", (f, d)), tensor(f"{prefix}.{up}.weight", (f, d)))

    s = gguf_suffix
    return {
        "w_gate_up": Weight((d, 2 * f), ("embed", "mlp"), gate_up(hf, hf_gate_up, "gate_proj", "up_proj"),
                            gate_up(gguf, gguf_gate_up, f"ffn_gate{s}", f"ffn_up{s}"), quantize=True),
        "w_down": Weight((f, d), ("mlp", "embed"), tensor(f"{hf}.down_proj.weight", (d, f)),
                         gguf and tensor(f"{gguf}.ffn_down{s}.weight", (d, f)), quantize=True),
    }


# ---------------------------------------------------------------- forward
def project_qkv(c: ModelConfig, x, w: dict, qk_norm_width: str = "head"):
    """x (B, T, D) -> q (B, T, H, hd), k, v (B, T, KVH, hd), q/k normed when the layer has norms."""
    b, t, _ = x.shape
    qkv = linear(x, w["wqkv"], w.get("wqkv_scale"))  # (B, T, Q+2K) grouped per KV head
    if "bqkv" in w:
        qkv = qkv + w["bqkv"].astype(qkv.dtype)
    q, k, v = split_qkv(qkv, c)
    deltas = adapted(x, w, "qkv", ("q", "k", "v"))  # LoRA adapters (ops/lora.py), before the norms
    if deltas is not None:
        q, k, v = (p + d.reshape(p.shape) for p, d in zip((q, k, v), deltas))
    if "q_norm" in w:
        if qk_norm_width == "head":
            q, k = rms_norm(q, w["q_norm"], c.rms_norm_eps), rms_norm(k, w["k_norm"], c.rms_norm_eps)
        else:  # over every head at once (HF order: head-major)
            q = rms_norm(q.reshape(b, t, -1), w["q_norm"], c.rms_norm_eps).reshape(q.shape)
            k = rms_norm(k.reshape(b, t, -1), w["k_norm"], c.rms_norm_eps).reshape(k.shape)
    return q, k, v


def attention(c: ModelConfig, i: int, x, w: dict, cache, ctx, qk_norm_width: str = "head", query_scale=None,
              rotated_qk_norm: bool = False):
    """Self-attention of layer i on normed input x (B, T, D) -> (out (B, T, D), cache).
    query_scale (B, T): multiplies the rotated queries (Ministral 3's position-dependent temperature).
    rotated_qk_norm: a weightless RMSNorm over head_dim of the rotated q and k (Llama 4)."""
    b, t, _ = x.shape
    q, k, v = project_qkv(c, x, w, qk_norm_width)
    rope = ctx.rope(c, i)
    if rope is not None:
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    if rotated_qk_norm:
        q, k = rms_norm(q, None, c.rms_norm_eps), rms_norm(k, None, c.rms_norm_eps)
    if query_scale is not None:
        q = (q * query_scale[:, :, None, None]).astype(q.dtype)
    with jax.named_scope("attention"):
        attn, cache = cache.attend(c.kv_index(i), q, k, v, ctx.positions, c.attention_spec(i), w.get("sinks"))
    attn = attn.reshape(b, t, -1)
    out = linear(attn, w["wo"], w.get("wo_scale"))
    deltas = adapted(attn, w, "o", ("o",))
    if deltas is not None:
        out = out + deltas[0]
    if "bo" in w:
        out = out + w["bo"].astype(out.dtype)
    return out, cache


def mlp(x, w: dict, activation: str = "silu", prefix: str = "w"):
    """Gated MLP of normed input x (..., D) with weights `{prefix}_gate_up`, `{prefix}_down`."""
    h = linear(x, w[f"{prefix}_gate_up"], w.get(f"{prefix}_gate_up_scale"))
    deltas = adapted(x, w, "gate_up", ("gate", "up")) if prefix == "w" else None
    if deltas is not None:  # back into the interleaved gate/up columns (models/parts/fused.py)
        h = h + jnp.stack(deltas, axis=-1).reshape(h.shape)
    h = gated(h, activation)
    out = linear(h, w[f"{prefix}_down"], w.get(f"{prefix}_down_scale"))
    deltas = adapted(h, w, "down", ("down",)) if prefix == "w" else None
    return out if deltas is None else out + deltas[0]


def pre_norm_layer(c: ModelConfig, i: int, x, w: dict, cache, ctx, activation: str = "silu"):
    """The Llama layer: x + attn(norm(x)), then x + mlp(norm(x))."""
    h, cache = attention(c, i, rms_norm(x, w["attn_norm"], c.rms_norm_eps), w, cache, ctx)
    x = x + h
    return x + mlp(rms_norm(x, w["mlp_norm"], c.rms_norm_eps), w, activation), cache


def short_conv_op(weight, bias=None, row_by_row: bool = False):
    """The cache op (kv/recurrent.py by_length) of a short convolution with `weight` (C, K) and `bias`:
    prompts by `causal_conv`, decode rows by `causal_conv_step`, or in place where the kernel runs."""
    return by_length(lambda xs, window, valid: causal_conv(xs[0], weight, bias, window, valid),
                     lambda xs, window, valid: causal_conv_step(xs[0], weight, bias, window, valid),
                     row_by_row=row_by_row, in_place=partial(causal_conv_in_place, weight=weight, bias=bias))
