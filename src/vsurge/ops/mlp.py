"""Gated MLPs: activation(gate) * up, then down. Gate and up come interleaved in one matrix
(models/parts/fused.py), so any column shard holds matching pairs."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .linear import linear, settled

# GPT-OSS's clamped SwiGLU: its two constants
SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0


def split_gate_up(gate_up):
    """gate_up (..., 2F) interleaved -> gate (..., F), up (..., F)."""
    pairs = settled(gate_up).reshape(*gate_up.shape[:-1], -1, 2)
    return pairs[..., 0], pairs[..., 1]


def gated(gate_up: jax.Array, activation: str) -> jax.Array:
    """(..., 2F) interleaved gate/up -> (..., F): activation(gate) * up."""
    gate, up = split_gate_up(gate_up)
    if activation in ("silu", "swish"):
        return jax.nn.silu(gate) * up
    if activation in ("gelu_pytorch_tanh", "gelu_tanh", "gelu_new"):
        return jax.nn.gelu(gate, approximate=True) * up
    if activation == "gelu":
        return jax.nn.gelu(gate, approximate=False) * up
    if activation == "swiglu_oai":  # GPT-OSS: clamped, with a sigmoid slope and (up + 1)
        gate = jnp.minimum(gate, SWIGLU_LIMIT)
        up = jnp.clip(up, -SWIGLU_LIMIT, SWIGLU_LIMIT)
        return (up + 1) * (gate * jax.nn.sigmoid(gate * SWIGLU_ALPHA))
    raise ValueError(f"unsupported activation {activation!r}")


def gated_mlp(x, w_gate_up, w_down, activation: str = "silu", scales=(None, None)):
    """x (..., D) -> (..., D) through (D, 2F) interleaved gate/up and (F, D) down."""
    h = gated(linear(x, w_gate_up, scales[0]), activation)
    return linear(h, w_down, scales[1])
