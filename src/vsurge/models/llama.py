"""The Llama-family decoder (Llama 2/3.x, Mistral, Qwen2, Qwen3, SmolLM2) as a flax.nnx module.

Each decoder layer holds its own weights and the forward pass is a Python loop
over the layers (unrolled in the compiled program). XLA:CPU feeds a layer's
own arrays straight into its dots, whereas a `lax.scan` over stacked weights
copies every layer's slice before the dot (docs/performance.md); a KV cache
keeps one array per layer for the same reason. Q/K/V and gate/up projections
are fused into single matrices: fewer, larger matmuls. Their columns are laid out
so that any tensor-parallel column shard holds whole KV groups and matching
gate/up columns (models/fused.py).

Weight names and shapes (D hidden, F ffn, V vocab, Q = H*hd, K = KVH*hd), per layer i:
    layers.i.attn_norm (D,)          layers.i.mlp_norm  (D,)
    layers.i.wqkv      (D, Q+2K)     layers.i.bqkv      (Q+2K,)  [qkv_bias]  (grouped per KV head)
    layers.i.wo        (Q, D)        layers.i.bo        (D,)     [o_bias]
    layers.i.q_norm    (hd,)         layers.i.k_norm    (hd,)    [qk_norm]
    layers.i.w_gate_up (D, 2F)       layers.i.w_down    (F, D)           (gate/up interleaved)
and embed (V, D), final_norm (D,), lm_head (D, V) [untied]. `weight_axes` names
every axis logically; sharding.py maps the names onto mesh axes.

Two dtypes: `param_dtype` for the weights and `dtype` for activations (the
residual stream, norms, attention and the KV cache). bfloat16 weights with
float32 activations multiply in bfloat16 and accumulate in float32
(ops/linear.py): on CPUs with AVX512-BF16 that is twice as fast as float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ..config import ModelConfig
from ..kv.dense import NoCache
from ..ops.linear import linear, matmul_t, quantize_int8
from ..ops.norm import rms_norm
from ..ops.rope import apply_rope, inverse_frequencies, rope_cos_sin
from ..sharding import constrain
from .fused import split_gate_up, split_qkv

QUANTIZABLE = ("wqkv", "wo", "w_gate_up", "w_down")


def layer_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every weight of one decoder layer and its shape."""
    c = config
    D, F = c.hidden_size, c.intermediate_size
    qkv = c.q_size + 2 * c.kv_size
    shapes = {"attn_norm": (D,), "wqkv": (D, qkv), "wo": (c.q_size, D), "mlp_norm": (D,),
              "w_gate_up": (D, 2 * F), "w_down": (F, D)}
    if c.qkv_bias:
        shapes["bqkv"] = (qkv,)
    if c.o_bias:
        shapes["bo"] = (D,)
    if c.qk_norm:
        shapes["q_norm"] = (c.head_dim,)
        shapes["k_norm"] = (c.head_dim,)
    return shapes


def layer_axes(config: ModelConfig) -> dict[str, tuple[str, ...]]:
    """Logical axis names of every weight of one layer (same keys as layer_shapes). The fused
    qkv columns are whole KV groups ("kv_heads"); gate/up columns are interleaved units ("mlp")."""
    axes = {"attn_norm": ("embed",), "wqkv": ("embed", "kv_heads"), "wo": ("heads", "embed"),
            "mlp_norm": ("embed",), "w_gate_up": ("embed", "mlp"), "w_down": ("mlp", "embed"),
            "bqkv": ("kv_heads",), "bo": ("embed",), "q_norm": ("head_dim",), "k_norm": ("head_dim",)}
    return {name: axes[name] for name in layer_shapes(config)}


def weight_axes(config: ModelConfig) -> dict[str, tuple[str, ...]]:
    """Logical axis names of every parameter (same keys as weight_shapes; an int8 model's
    `<name>_scale` takes the axis of its weight's columns)."""
    axes = {"embed": ("vocab", "embed"), "final_norm": ("embed",)}
    for i in range(config.num_layers):
        axes.update({f"layers.{i}.{k}": v for k, v in layer_axes(config).items()})
    if not config.tie_word_embeddings:
        axes["lm_head"] = ("embed", "vocab")
    return axes


def weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter name of the model and its shape."""
    c = config
    shapes = {"embed": (c.vocab_size, c.hidden_size), "final_norm": (c.hidden_size,)}
    for i in range(c.num_layers):
        shapes.update({f"layers.{i}.{k}": v for k, v in layer_shapes(c).items()})
    if not c.tie_word_embeddings:
        shapes["lm_head"] = (c.hidden_size, c.vocab_size)
    return shapes


def _init(name: str, shape, dtype, rngs: nnx.Rngs) -> nnx.Param:
    if name.endswith("norm"):
        return nnx.Param(jnp.ones(shape, dtype))
    if name.startswith("b"):
        return nnx.Param(jnp.zeros(shape, dtype))
    return nnx.Param((0.02 * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype))


class DecoderLayer(nnx.Module):
    """One layer's weights (attention + MLP)."""

    def __init__(self, config: ModelConfig, param_dtype, rngs: nnx.Rngs):
        for name, shape in layer_shapes(config).items():
            setattr(self, name, _init(name, shape, param_dtype, rngs))

    def weights(self) -> dict[str, jax.Array]:
        return {name: value[...] for name, value in vars(self).items() if isinstance(value, nnx.Param)}


class LlamaForCausalLM(nnx.Module):
    def __init__(self, config: ModelConfig, *, dtype=jnp.float32, param_dtype=None, rngs: nnx.Rngs | None = None):
        rngs = rngs if rngs is not None else nnx.Rngs(0)
        self.config = config
        self.dtype = jnp.dtype(dtype)
        self.param_dtype = jnp.dtype(param_dtype or dtype)
        self.layers = nnx.List([DecoderLayer(config, self.param_dtype, rngs) for _ in range(config.num_layers)])
        self.embed = _init("embed", (config.vocab_size, config.hidden_size), self.param_dtype, rngs)
        self.final_norm = _init("final_norm", (config.hidden_size,), self.param_dtype, rngs)
        if not config.tie_word_embeddings:
            self.lm_head = _init("lm_head", (config.hidden_size, config.vocab_size), self.param_dtype, rngs)

    # ---------------------------------------------------------------- weights
    @property
    def quantization(self) -> str | None:
        return "int8" if hasattr(self.layers[0], "wqkv_scale") else None

    def quantize(self, kind: str = "int8") -> "LlamaForCausalLM":
        """Replace the matrices by int8 + per-channel scales, in place (see ops/linear.py)."""
        if kind != "int8":
            raise ValueError(f"unsupported quantization {kind!r} (supported: int8)")
        if self.quantization:
            return self
        for layer in self.layers:
            for name in QUANTIZABLE:
                q, scale = quantize_int8(getattr(layer, name)[...])
                getattr(layer, name).set_value(q)
                setattr(layer, name + "_scale", nnx.Param(scale))
        head = self.lm_head[...] if hasattr(self, "lm_head") else self.embed[...].T
        q, scale = quantize_int8(head)
        if hasattr(self, "lm_head"):
            self.lm_head.set_value(q)
        else:
            self.lm_head = nnx.Param(q)  # the float embedding stays for token lookups
        self.lm_head_scale = nnx.Param(scale)
        return self

    def prepare_mixed_dtypes(self) -> "LlamaForCausalLM":
        """Layouts for weights whose dtype differs from the activations' (bfloat16 weights on CPU),
        so that XLA:CPU never converts a whole (V, D) table inside a program:
        - a tied model gets a (D, V) copy of its embedding as the output head: XLA:CPU has no
          bfloat16 dot that reads the (V, D) table transposed and converted all of it to float32
          every decode call (~30 ms at V=49k); costs V * D weights;
        - the embedding is held as its raw bits (uint16): a bfloat16 gather inside the decode loop
          made XLA convert the whole table (hoisted out of the loop) before taking a few rows,
          ~16 ms per call at V=49k; a gather of integer rows is exact and reads only those rows."""
        if self.param_dtype == self.dtype:
            return self
        if self.config.tie_word_embeddings and not hasattr(self, "lm_head"):
            self.lm_head = nnx.Param(jnp.asarray(self.embed[...].T))  # the embedding stays for token lookups
        table = self.embed[...]
        if jnp.issubdtype(table.dtype, jnp.floating) and table.dtype.itemsize == 2:
            self.embed = nnx.Param(jax.lax.bitcast_convert_type(table, jnp.uint16))
        return self

    def embedding_table(self) -> jax.Array:
        """The (V, D) embedding in the weights' dtype (whichever way it is held)."""
        table = self.embed[...]
        return jax.lax.bitcast_convert_type(table, self.param_dtype) if table.dtype == jnp.uint16 else table

    def named_weights(self) -> dict[str, jax.Array]:
        out = {"embed": self.embed[...], "final_norm": self.final_norm[...]}
        for name in ("lm_head", "lm_head_scale"):
            if hasattr(self, name):
                out[name] = getattr(self, name)[...]
        for i, layer in enumerate(self.layers):
            out.update({f"layers.{i}.{k}": v for k, v in layer.weights().items()})
        return out

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
        hidden, cache = self.decode_layers(self.embed_tokens(input_ids), positions, cache)
        if logits_index is not None:
            hidden = jnp.take_along_axis(hidden, logits_index[:, None, None].astype(jnp.int32), axis=1)[:, 0]
        return self.logits(hidden), cache

    def embed_tokens(self, input_ids: jax.Array) -> jax.Array:
        """(...) int32 -> (..., D) in the activation dtype."""
        table = self.embed[...]
        if table.dtype == jnp.uint16:  # raw bits of the weights' dtype (prepare_mixed_dtypes)
            return jax.lax.bitcast_convert_type(table[input_ids], self.param_dtype).astype(self.dtype)
        return table[input_ids].astype(self.dtype)

    def decode_layers(self, hidden, positions, cache):
        """hidden: (B, T, D) -> (B, T, D) after every decoder layer and the final norm."""
        c = self.config
        cos, sin = rope_cos_sin(positions, jnp.asarray(inverse_frequencies(c)))  # derived, not a weight
        for i, layer in enumerate(self.layers):
            with jax.named_scope(f"layer_{i}"):
                hidden, cache = self._layer(hidden, cache, layer.weights(), i, positions, cos, sin)
        return rms_norm(hidden, self.final_norm[...], c.rms_norm_eps), cache

    def _layer(self, x, kv, w, index, positions, cos, sin):
        c = self.config
        b, t, _ = x.shape
        h = rms_norm(x, w["attn_norm"], c.rms_norm_eps)
        qkv = linear(h, w["wqkv"], w.get("wqkv_scale"))  # (B, T, Q+2K) grouped per KV head
        if c.qkv_bias:
            qkv = qkv + w["bqkv"].astype(qkv.dtype)
        q, k, v = split_qkv(qkv, c)  # (B, T, H, hd), (B, T, KVH, hd) x 2
        if c.qk_norm:
            q = rms_norm(q, w["q_norm"], c.rms_norm_eps)
            k = rms_norm(k, w["k_norm"], c.rms_norm_eps)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        with jax.named_scope("attention"):
            attn, kv = kv.attend(index, q, k, v, positions)  # (B, T, H, hd)
        out = linear(attn.reshape(b, t, c.q_size), w["wo"], w.get("wo_scale"))
        if c.o_bias:
            out = out + w["bo"].astype(out.dtype)
        x = x + out
        h = rms_norm(x, w["mlp_norm"], c.rms_norm_eps)
        gate_up = linear(h, w["w_gate_up"], w.get("w_gate_up_scale"))  # (B, T, 2F) interleaved
        gate, up = split_gate_up(gate_up)  # (B, T, F) x 2
        x = x + linear(jax.nn.silu(gate) * up, w["w_down"], w.get("w_down_scale"))
        return x, kv

    def logits(self, hidden: jax.Array) -> jax.Array:
        """hidden: (..., D) -> (..., V) float32."""
        if hasattr(self, "lm_head"):
            scale = self.lm_head_scale[...] if hasattr(self, "lm_head_scale") else None
            out = linear(hidden, self.lm_head[...], scale)
        else:
            out = matmul_t(hidden, self.embed[...])  # tied: hidden @ embed.T
        # vocabulary-parallel head: each device computes its vocabulary slice, then the logits are
        # gathered once here (not in every sampling stage, and not the head's weights instead)
        out = constrain(out, (None,) * (out.ndim - 1) + ("vocab",))
        return constrain(out.astype(jnp.float32), ())
