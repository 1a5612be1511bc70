"""The Llama-family decoder (Llama 2/3.x, Mistral, Qwen2, Qwen3, SmolLM2) as a flax.nnx module.

Layer weights are stacked on a leading `num_layers` axis and the decoder runs
as one `lax.scan`, so compile time does not grow with depth. Q/K/V and
gate/up projections are fused into single matrices: fewer, larger matmuls.

Weight names and shapes (L layers, D hidden, F ffn, V vocab, Q = H*hd, K = KVH*hd):
    embed            (V, D)
    layers.attn_norm (L, D)         layers.mlp_norm  (L, D)
    layers.wqkv      (L, D, Q+2K)   layers.bqkv      (L, Q+2K)   [qkv_bias]
    layers.wo        (L, Q, D)      layers.bo        (L, D)      [o_bias]
    layers.q_norm    (L, hd)        layers.k_norm    (L, hd)     [qk_norm]
    layers.w_gate_up (L, D, 2F)     layers.w_down    (L, F, D)
    final_norm       (D,)           lm_head          (D, V)      [untied]
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ..config import ModelConfig
from ..kv.dense import NoCache
from ..ops.linear import linear, quantize_int8
from ..ops.norm import rms_norm
from ..ops.rope import apply_rope, inverse_frequencies, rope_cos_sin


def weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter name of the model and its shape."""
    c = config
    L, D, F, V = c.num_layers, c.hidden_size, c.intermediate_size, c.vocab_size
    qkv = c.q_size + 2 * c.kv_size
    shapes = {
        "embed": (V, D),
        "layers.attn_norm": (L, D),
        "layers.wqkv": (L, D, qkv),
        "layers.wo": (L, c.q_size, D),
        "layers.mlp_norm": (L, D),
        "layers.w_gate_up": (L, D, 2 * F),
        "layers.w_down": (L, F, D),
        "final_norm": (D,),
    }
    if c.qkv_bias:
        shapes["layers.bqkv"] = (L, qkv)
    if c.o_bias:
        shapes["layers.bo"] = (L, D)
    if c.qk_norm:
        shapes["layers.q_norm"] = (L, c.head_dim)
        shapes["layers.k_norm"] = (L, c.head_dim)
    if not c.tie_word_embeddings:
        shapes["lm_head"] = (D, V)
    return shapes


class DecoderLayers(nnx.Module):
    """All decoder layers' weights, stacked on axis 0."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], dtype, rngs: nnx.Rngs):
        for name, shape in shapes.items():
            if name.endswith("norm"):
                value = jnp.ones(shape, dtype)
            elif name.startswith("b"):
                value = jnp.zeros(shape, dtype)
            else:
                value = (0.02 * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)
            setattr(self, name, nnx.Param(value))


class LlamaForCausalLM(nnx.Module):
    def __init__(self, config: ModelConfig, *, dtype=jnp.float32, rngs: nnx.Rngs | None = None):
        rngs = rngs if rngs is not None else nnx.Rngs(0)
        self.config = config
        self.dtype = jnp.dtype(dtype)
        shapes = weight_shapes(config)
        layer_shapes = {k.split(".", 1)[1]: v for k, v in shapes.items() if k.startswith("layers.")}
        self.layers = DecoderLayers(layer_shapes, self.dtype, rngs)
        self.embed = nnx.Param((0.02 * jax.random.normal(rngs.params(), shapes["embed"])).astype(self.dtype))
        self.final_norm = nnx.Param(jnp.ones(shapes["final_norm"], self.dtype))
        if "lm_head" in shapes:
            self.lm_head = nnx.Param((0.02 * jax.random.normal(rngs.params(), shapes["lm_head"])).astype(self.dtype))

    # ---------------------------------------------------------------- weights
    QUANTIZABLE = ("wqkv", "wo", "w_gate_up", "w_down")

    @property
    def quantization(self) -> str | None:
        return "int8" if hasattr(self.layers, "wqkv_scale") else None

    def quantize(self, kind: str = "int8") -> "LlamaForCausalLM":
        """Replace the matrices by int8 + per-channel scales, in place (see ops/linear.py)."""
        if kind != "int8":
            raise ValueError(f"unsupported quantization {kind!r} (supported: int8)")
        if self.quantization:
            return self
        for name in self.QUANTIZABLE:
            q, scale = quantize_int8(getattr(self.layers, name)[...])
            getattr(self.layers, name).set_value(q)
            setattr(self.layers, name + "_scale", nnx.Param(scale))
        head = self.lm_head[...] if hasattr(self, "lm_head") else self.embed[...].T
        q, scale = quantize_int8(head)
        if hasattr(self, "lm_head"):
            self.lm_head.set_value(q)
        else:
            self.lm_head = nnx.Param(q)  # the float embedding stays for token lookups
        self.lm_head_scale = nnx.Param(scale)
        return self

    def named_weights(self) -> dict[str, jax.Array]:
        out = {"embed": self.embed[...], "final_norm": self.final_norm[...]}
        if hasattr(self, "lm_head"):
            out["lm_head"] = self.lm_head[...]
        if hasattr(self, "lm_head_scale"):
            out["lm_head_scale"] = self.lm_head_scale[...]
        out.update({f"layers.{k}": v for k, v in self._layer_weights().items()})
        return out

    def _layer_weights(self) -> dict[str, jax.Array]:
        names = [n.split(".", 1)[1] for n in weight_shapes(self.config) if n.startswith("layers.")]
        if self.quantization:
            names += [n + "_scale" for n in self.QUANTIZABLE]
        return {n: getattr(self.layers, n)[...] for n in names}

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights held in memory."""
        return sum(int(np.prod(w.shape)) * w.dtype.itemsize for w in self.named_weights().values())

    @property
    def decode_bytes(self) -> int:
        """Weight bytes one decode step reads: the embedding table only when it is also the output head."""
        weights = self.named_weights()
        if "lm_head" in weights:
            weights.pop("embed")
        return sum(int(np.prod(w.shape)) * w.dtype.itemsize for w in weights.values())

    # ---------------------------------------------------------------- forward
    def __call__(
        self,
        input_ids: jax.Array,  # (B, T) int32
        positions: jax.Array | None = None,  # (B, T) int32; default 0..T-1
        cache=None,  # a kv cache pytree with .attend(); None = no cache
        logits_index: jax.Array | None = None,  # (B,) take logits of one token per row
    ):
        """Returns (logits, cache): logits (B, T, V) float32, or (B, V) with `logits_index`."""
        b, t = input_ids.shape
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        if cache is None:
            cache = NoCache(self.config.sliding_window)
        hidden = self.embed[...][input_ids].astype(self.dtype)  # (B, T, D)
        hidden, cache = self.decode_layers(hidden, positions, cache)
        if logits_index is not None:
            hidden = jnp.take_along_axis(hidden, logits_index[:, None, None].astype(jnp.int32), axis=1)[:, 0]
        return self.logits(hidden), cache

    def decode_layers(self, hidden, positions, cache):
        """hidden: (B, T, D) -> (B, T, D) after every decoder layer and the final norm."""
        c = self.config
        cos, sin = rope_cos_sin(positions, jnp.asarray(inverse_frequencies(c)))  # derived, not a weight
        stacked = self._layer_weights()

        def layer(carry, xs):
            x, kv = carry
            w, index = xs
            x, kv = self._layer(x, kv, w, index, positions, cos, sin)
            return (x, kv), None

        layer_ids = jnp.arange(c.num_layers, dtype=jnp.int32)
        (hidden, cache), _ = jax.lax.scan(layer, (hidden, cache), (stacked, layer_ids))
        return rms_norm(hidden, self.final_norm[...], c.rms_norm_eps), cache

    def _layer(self, x, kv, w, index, positions, cos, sin):
        c = self.config
        b, t, _ = x.shape
        h = rms_norm(x, w["attn_norm"], c.rms_norm_eps)
        qkv = linear(h, w["wqkv"], w.get("wqkv_scale"))  # (B, T, Q+2K)
        if c.qkv_bias:
            qkv = qkv + w["bqkv"]
        q = qkv[..., : c.q_size].reshape(b, t, c.num_heads, c.head_dim)
        k = qkv[..., c.q_size : c.q_size + c.kv_size].reshape(b, t, c.num_kv_heads, c.head_dim)
        v = qkv[..., c.q_size + c.kv_size :].reshape(b, t, c.num_kv_heads, c.head_dim)
        if c.qk_norm:
            q = rms_norm(q, w["q_norm"], c.rms_norm_eps)
            k = rms_norm(k, w["k_norm"], c.rms_norm_eps)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        attn, kv = kv.attend(index, q, k, v, positions)  # (B, T, H, hd)
        out = linear(attn.reshape(b, t, c.q_size), w["wo"], w.get("wo_scale"))
        if c.o_bias:
            out = out + w["bo"]
        x = x + out
        h = rms_norm(x, w["mlp_norm"], c.rms_norm_eps)
        gate_up = linear(h, w["w_gate_up"], w.get("w_gate_up_scale"))  # (B, T, 2F)
        gate, up = gate_up[..., : c.intermediate_size], gate_up[..., c.intermediate_size :]
        x = x + linear(jax.nn.silu(gate) * up, w["w_down"], w.get("w_down_scale"))
        return x, kv

    def logits(self, hidden: jax.Array) -> jax.Array:
        """hidden: (..., D) -> (..., V) float32."""
        if hasattr(self, "lm_head"):
            scale = self.lm_head_scale[...] if hasattr(self, "lm_head_scale") else None
            out = linear(hidden, self.lm_head[...], scale)
        else:
            out = hidden @ self.embed[...].T
        return out.astype(jnp.float32)
