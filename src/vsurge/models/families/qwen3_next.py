"""Qwen3-Next and Qwen3.5 (text): Gated DeltaNet linear attention on most layers (three in four),
gated full attention on the rest, a routed mixture of experts with a sigmoid-gated shared expert
(Qwen3-Next, Qwen3.5-MoE) or a dense MLP (Qwen3.5).

Gated DeltaNet layer (D hidden; Hk key heads of dk, Hv value heads of dv, Hv a multiple of Hk):
    w_qkv (D, 2*Hk*dk + Hv*dv)  q | k | v, each head-major      conv (C, 1, K) depthwise, C = that width
    w_z (D, Hv*dv) output gate   w_b, w_a (D, Hv) write strength and decay inputs
    dt_bias, A_log (Hv,)         gdn_norm (dv,) gated RMSNorm    w_out (Hv*dv, D)
    q, k, v = silu(causal_conv(x @ w_qkv)); q, k L2-normalised; beta = sigmoid(x @ w_b);
    g = -exp(A_log) * softplus(x @ w_a + dt_bias); the gated delta rule (ops/gated_delta.py) over a
    (Hv, dk, dv) state per sequence, then norm(out) * silu(z) @ w_out.
Qwen3-Next stores q/k/v/z in one projection grouped per key head ([q, k, v..., z...] per head) and
b/a likewise: read into the layout above at load (HeadRows). Its state per sequence and layer is
the conv window (K-1, C) and the delta-rule state (Hv, dk, dv) (kv/recurrent.py).

Full-attention layer: q_proj holds each head's query and output gate ([q_h, gate_h] per head);
per-head q/k RMSNorm, partial rotary, output * sigmoid(gate). Every RMSNorm but the gated one
multiplies by 1 + w.

HF: Qwen3NextForCausalLM ("qwen3_next"), Qwen3_5ForCausalLM ("qwen3_5_text"), Qwen3_5MoeForCausalLM
("qwen3_5_moe_text"); a whole Qwen3.5 / Qwen3.5-MoE checkpoint, its vision tower beside the text model,
loads as qwen3_5_vl.py's family (images and text).
GGUF: `qwen3next` as llama.cpp's converter writes Qwen3-Next (q/k/v of the DeltaNet projection
regrouped head-major as attn_qkv, z as attn_gate, A stored as -exp(A_log), the convolution squeezed
to (C, K), every norm but the gated one stored as 1 + w); Qwen3.5's `qwen35` / `qwen35moe` likewise, with b/a
as ssm_beta / ssm_alpha, and, where there are more value heads than key heads, the value heads of every
DeltaNet tensor "tiled" (value head j pairs with key head j mod Hk, not j // (Hv/Hk)): the model then
tiles q and k to Hv heads (value_heads_tiled) instead of regrouping the tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from ...config import AttentionSpec, StateLayer
from ...kv.recurrent import by_length
from ...ops.gated_delta import gated_delta_in_place, gated_delta_rule, gated_delta_step, gated_rms_norm, l2_normalize
from ...ops.linear import linear
from ...ops.norm import rms_norm
from ...ops.rope import apply_rope
from ..parts.base import CausalLM
from ..parts.blocks import mlp, mlp_weights, norm, short_conv_op
from ..parts.config_io import GGUFMeta, check_activation, gguf_fields, hf_fields
from ..parts.moe import MoEConfig, qwen_moe_weights, routed_and_shared
from .qwen2_moe import moe_layer_flags
from ..parts.spec import HeadRows, Mapped, Weight, tensor


@dataclass(frozen=True)
class Qwen3NextConfig(MoEConfig):
    linear_layers: tuple[bool, ...] = ()  # per layer: Gated DeltaNet (True) or full attention
    linear_key_heads: int = 0
    linear_value_heads: int = 0
    linear_key_dim: int = 0
    linear_value_dim: int = 0
    conv_kernel: int = 4
    grouped_projections: bool = True  # Qwen3-Next's per-key-head qkvz / ba layout (Qwen3.5: separate)
    value_heads_tiled: bool = False  # llama.cpp's qwen35: value head j pairs with key head j mod Hk

    def layer_kind(self, layer: int) -> str:
        return "linear_attention" if self.linear_layers[layer] else "attention"

    def is_moe(self, layer: int) -> bool:
        return self.num_experts > 0 and super().is_moe(layer)

    @property
    def key_width(self) -> int:
        return self.linear_key_heads * self.linear_key_dim

    @property
    def value_width(self) -> int:
        return self.linear_value_heads * self.linear_value_dim

    @property
    def conv_width(self) -> int:
        return 2 * self.key_width + self.value_width

    @property
    def state_layout(self) -> tuple[StateLayer, ...]:
        layer = StateLayer((("conv", (self.conv_kernel - 1, self.conv_width)),
                            ("ssm", (self.linear_value_heads, self.linear_key_dim, self.linear_value_dim))))
        return (layer,) * len(self.recurrent_layers)

    def attention_spec(self, layer: int) -> AttentionSpec:
        return AttentionSpec(scale=self.head_dim ** -0.5)



class _Columns:
    """Recipes of (in, w_i) matrices side by side -> (in, sum w_i)."""

    def __init__(self, *parts):
        self.parts = parts

    def tensors(self):
        return list(dict.fromkeys(t for part in self.parts for t in part.tensors()))

    def read(self, source, spans, kv_replicas: int = 1):
        whole = np.concatenate([part.read(source, [spans[0], (0, part.width)]) for part in self.parts], axis=1)
        return whole[:, spans[1][0]:spans[1][1]]


class _Sized:
    """A recipe with its output width (for _Columns)."""

    def __init__(self, recipe, width: int):
        self.recipe, self.width = recipe, width

    def tensors(self):
        return self.recipe.tensors()

    def read(self, source, spans, kv_replicas: int = 1):
        return self.recipe.read(source, spans, kv_replicas)


class Qwen3Next(CausalLM):
    name = "qwen3_next"
    hf_model_types = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")
    hf_architectures = ("Qwen3NextForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM")
    config_class = Qwen3NextConfig
    gguf_architectures = ("qwen3next", "qwen35", "qwen35moe")

    @classmethod
    def ignores_tensor(cls, name: str, config) -> bool:
        return super().ignores_tensor(name, config) or name.startswith("mtp.")  # (multi-token prediction)

    @classmethod
    def config_from_hf(cls, cfg: dict, where: str):
        check_activation(cfg, where, ("silu", "swish"))
        fields = hf_fields(cfg, where, cls.name)
        n = fields["num_layers"]
        types = cfg.get("layer_types") or [
            "full_attention" if (i + 1) % int(cfg.get("full_attention_interval", 4)) == 0 else "linear_attention"
            for i in range(n)]
        experts = int(cfg.get("num_experts") or 0)
        return cls.config_class(
            **fields, qk_norm=True, num_experts=experts, num_experts_per_tok=int(cfg.get("num_experts_per_tok", 1)),
            moe_intermediate_size=int(cfg.get("moe_intermediate_size") or 0),
            norm_topk_prob=bool(cfg.get("norm_topk_prob", True)),
            shared_intermediate_size=int(cfg.get("shared_expert_intermediate_size") or 0),
            moe_layers=moe_layer_flags(cfg, n) if experts else (False,) * n,
            linear_layers=tuple(t == "linear_attention" for t in types[:n]),
            linear_key_heads=int(cfg["linear_num_key_heads"]), linear_value_heads=int(cfg["linear_num_value_heads"]),
            linear_key_dim=int(cfg["linear_key_head_dim"]), linear_value_dim=int(cfg["linear_value_head_dim"]),
            conv_kernel=int(cfg.get("linear_conv_kernel_dim", 4)),
            grouped_projections=cfg.get("model_type") == "qwen3_next")

    @classmethod
    def config_from_gguf(cls, meta: GGUFMeta, where: str):
        fields = gguf_fields(meta, cls.name)
        n = fields["num_layers"]
        recurrent = meta.key("attention.recurrent_layers")
        interval = int(meta.key("full_attention_interval", 4))
        linear = (tuple(bool(x) for x in recurrent[:n]) if recurrent is not None
                  else tuple((i + 1) % interval != 0 for i in range(n)))
        hk, hv = int(meta.key("ssm.group_count", required=True)), int(meta.key("ssm.time_step_rank", required=True))
        experts = int(meta.key("expert_count", 0) or 0)
        return cls.config_class(
            **fields, qk_norm=True, num_experts=experts, num_experts_per_tok=int(meta.key("expert_used_count", 1)),
            moe_intermediate_size=int(meta.key("expert_feed_forward_length", 0) or 0), norm_topk_prob=True,
            shared_intermediate_size=int(meta.key("expert_shared_feed_forward_length", 0) or 0),
            moe_layers=tuple(meta.has(f"blk.{i}.ffn_gate_inp.weight") for i in range(n)), linear_layers=linear,
            linear_key_heads=hk, linear_value_heads=hv, linear_key_dim=int(meta.key("ssm.state_size", required=True)),
            linear_value_dim=int(meta.key("ssm.inner_size", required=True)) // hv,
            conv_kernel=int(meta.key("ssm.conv_kernel", 4)), grouped_projections=meta.arch == "qwen3next",
            value_heads_tiled=meta.arch != "qwen3next" and hv != hk)

    @classmethod
    def global_weights(cls, config):
        out = super().global_weights(config)
        out["final_norm"] = norm(config.hidden_size, "model.norm.weight", "output_norm.weight", hf_offset=1.0)
        return out

    # ------------------------------------------------------------ weights
    @classmethod
    def layer_weights(cls, c: Qwen3NextConfig, i: int):
        hf, gg, d = f"model.layers.{i}", f"blk.{i}", c.hidden_size
        out = {"attn_norm": norm(d, f"{hf}.input_layernorm.weight", f"{gg}.attn_norm.weight", hf_offset=1.0),
               "mlp_norm": norm(d, f"{hf}.post_attention_layernorm.weight", f"{gg}.post_attention_norm.weight",
                                hf_offset=1.0)}
        out.update(cls._linear_weights(c, f"{hf}.linear_attn", gg) if c.linear_layers[i]
                   else cls._attention_weights(c, f"{hf}.self_attn", gg))
        if not c.is_moe(i):
            return {**out, **mlp_weights(d, c.intermediate_size, hf=f"{hf}.mlp", gguf=gg)}
        return {**out, **qwen_moe_weights(c, hf, gg, shared_gate=True)}

    @classmethod
    def _attention_weights(cls, c: Qwen3NextConfig, hf: str, gg: str) -> dict[str, Weight]:
        d, h, hd, kv = c.hidden_size, c.num_heads, c.head_dim, c.kv_size
        q_shape = (2 * h * hd, d)  # (the converter keeps each head's [query, gate] rows)
        q_hf, q_gg = f"{hf}.q_proj.weight", f"{gg}.attn_q.weight"
        return {
            "wq": Weight((d, h * hd), ("embed", "heads"), HeadRows(q_hf, q_shape, h, (0, hd)),
                         HeadRows(q_gg, q_shape, h, (0, hd)), quantize=True),
            "wgate": Weight((d, h * hd), ("embed", "heads"), HeadRows(q_hf, q_shape, h, (hd, 2 * hd)),
                            HeadRows(q_gg, q_shape, h, (hd, 2 * hd)), quantize=True),
            "wk": Weight((d, kv), ("embed", "kv_heads"), tensor(f"{hf}.k_proj.weight", (kv, d)),
                         tensor(f"{gg}.attn_k.weight", (kv, d)), quantize=True),
            "wv": Weight((d, kv), ("embed", "kv_heads"), tensor(f"{hf}.v_proj.weight", (kv, d)),
                         tensor(f"{gg}.attn_v.weight", (kv, d)), quantize=True),
            "wo": Weight((h * hd, d), ("heads", "embed"), tensor(f"{hf}.o_proj.weight", (d, h * hd)),
                         tensor(f"{gg}.attn_output.weight", (d, h * hd)), quantize=True),
            "q_norm": norm(hd, f"{hf}.q_norm.weight", f"{gg}.attn_q_norm.weight", hf_offset=1.0),
            "k_norm": norm(hd, f"{hf}.k_norm.weight", f"{gg}.attn_k_norm.weight", hf_offset=1.0),
        }

    @classmethod
    def _linear_weights(cls, c: Qwen3NextConfig, hf: str, gg: str) -> dict[str, Weight]:
        d, hk, hv, dk, dv = c.hidden_size, c.linear_key_heads, c.linear_value_heads, c.linear_key_dim, c.linear_value_dim
        r = hv // hk
        if c.grouped_projections:  # per key head: [q (dk), k (dk), v (r*dv), z (r*dv)] and [b (r), a (r)]
            qkvz = (f"{hf}.in_proj_qkvz.weight", (c.conv_width + c.value_width, d))
            ba = (f"{hf}.in_proj_ba.weight", (2 * hv, d))
            qkv = _Columns(_Sized(HeadRows(*qkvz, hk, (0, dk)), hk * dk),
                           _Sized(HeadRows(*qkvz, hk, (dk, 2 * dk)), hk * dk),
                           _Sized(HeadRows(*qkvz, hk, (2 * dk, 2 * dk + r * dv)), hv * dv))
            z = HeadRows(*qkvz, hk, (2 * dk + r * dv, 2 * dk + 2 * r * dv))
            b, a = HeadRows(*ba, hk, (0, r)), HeadRows(*ba, hk, (r, 2 * r))
        else:
            qkv = tensor(f"{hf}.in_proj_qkv.weight", (c.conv_width, d))
            z = tensor(f"{hf}.in_proj_z.weight", (c.value_width, d))
            b, a = tensor(f"{hf}.in_proj_b.weight", (hv, d)), tensor(f"{hf}.in_proj_a.weight", (hv, d))
        k = c.conv_kernel
        # llama.cpp's converter: q | k | v head-major as attn_qkv, z as attn_gate, b/a as HF groups them
        # (Qwen3-Next's ssm_ba) or apart (Qwen3.5's ssm_beta, ssm_alpha); A = -exp(A_log); the convolution
        # squeezed to (C, K)
        if c.grouped_projections:
            ba_gg = (f"{gg}.ssm_ba.weight", (2 * hv, d))
            b_gg, a_gg = HeadRows(*ba_gg, hk, (0, r)), HeadRows(*ba_gg, hk, (r, 2 * r))
        else:
            b_gg, a_gg = tensor(f"{gg}.ssm_beta.weight", (hv, d)), tensor(f"{gg}.ssm_alpha.weight", (hv, d))
        return {
            "w_qkv": Weight((d, c.conv_width), ("embed", None), qkv, tensor(f"{gg}.attn_qkv.weight", (c.conv_width, d)),
                            quantize=True),
            "w_z": Weight((d, c.value_width), ("embed", None), z, tensor(f"{gg}.attn_gate.weight", (c.value_width, d)),
                          quantize=True),
            "w_b": Weight((d, hv), ("embed", None), b, b_gg),
            "w_a": Weight((d, hv), ("embed", None), a, a_gg),
            "conv": Weight((c.conv_width, 1, k), (None, None, None),
                           tensor(f"{hf}.conv1d.weight", (c.conv_width, 1, k), matrix=False),
                           Mapped(tensor(f"{gg}.ssm_conv1d.weight", (c.conv_width, k), matrix=False),
                                   (c.conv_width, 1, k), lambda w: w)),
            "dt_bias": Weight((hv,), (None,), tensor(f"{hf}.dt_bias", (hv,)), tensor(f"{gg}.ssm_dt.bias", (hv,)),
                              init="ones"),
            "A_log": Weight((hv,), (None,), tensor(f"{hf}.A_log", (hv,)),
                            Mapped(tensor(f"{gg}.ssm_a", (hv,)), (hv,), lambda a: np.log(-a.astype(np.float32))),
                            init="zeros"),
            "gdn_norm": Weight((dv,), (None,), tensor(f"{hf}.norm.weight", (dv,)), tensor(f"{gg}.ssm_norm.weight", (dv,)),
                               init="ones"),
            "w_out": Weight((c.value_width, d), (None, "embed"), tensor(f"{hf}.out_proj.weight", (d, c.value_width)),
                            tensor(f"{gg}.ssm_out.weight", (d, c.value_width)), quantize=True),
        }

    # ------------------------------------------------------------ forward
    def layer(self, i, x, w, cache, ctx):
        c = self.config
        h = rms_norm(x, w["attn_norm"], c.rms_norm_eps)
        if c.linear_layers[i]:
            h, cache = self._gated_delta_net(i, h, w, cache, ctx.positions)
        else:
            h, cache = self._gated_attention(i, h, w, cache, ctx)
        x = x + h
        h = rms_norm(x, w["mlp_norm"], c.rms_norm_eps)
        return x + (routed_and_shared(self, h, w) if c.is_moe(i) else mlp(h, w)), cache

    def _gated_attention(self, i, x, w, cache, ctx):
        c = self.config
        b, t, _ = x.shape
        heads = lambda a, n: a.reshape(b, t, n, c.head_dim)  # noqa: E731
        q = rms_norm(heads(linear(x, w["wq"], w.get("wq_scale")), c.num_heads), w["q_norm"], c.rms_norm_eps)
        k = rms_norm(heads(linear(x, w["wk"], w.get("wk_scale")), c.num_kv_heads), w["k_norm"], c.rms_norm_eps)
        v = heads(linear(x, w["wv"], w.get("wv_scale")), c.num_kv_heads)
        rope = ctx.rope(c, i)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        attn, cache = cache.attend(c.kv_index(i), q, k, v, ctx.positions, c.attention_spec(i))
        gate = jax.nn.sigmoid(linear(x, w["wgate"], w.get("wgate_scale")).astype(jnp.float32))
        attn = (attn.reshape(b, t, -1).astype(jnp.float32) * gate).astype(x.dtype)
        return linear(attn, w["wo"], w.get("wo_scale")), cache

    def _gated_delta_net(self, i, x, w, cache, positions):
        c = self.config
        b, t, _ = x.shape
        hk, hv, dk, dv = c.linear_key_heads, c.linear_value_heads, c.linear_key_dim, c.linear_value_dim
        index = c.state_index(i)
        kernel = w["conv"][:, 0, :]  # (C, K)
        conv = short_conv_op(kernel, row_by_row=True)
        mixed = linear(x, w["w_qkv"], w.get("w_qkv_scale"))  # (B, T, C)
        mixed, cache = cache.recurrent(index, "conv", conv, (mixed,), positions, (c.conv_kernel - 1, c.conv_width))
        mixed = jax.nn.silu(mixed.astype(jnp.float32))
        q = l2_normalize(mixed[..., :c.key_width].reshape(b, t, hk, dk))
        k = l2_normalize(mixed[..., c.key_width:2 * c.key_width].reshape(b, t, hk, dk))
        v = mixed[..., 2 * c.key_width:].reshape(b, t, hv, dv)
        if c.value_heads_tiled:  # value head j reads key head j mod Hk: give each value head its own
            q, k = jnp.tile(q, (1, 1, hv // hk, 1)), jnp.tile(k, (1, 1, hv // hk, 1))  # (B, T, Hv, dk)
        beta = jax.nn.sigmoid(linear(x, w["w_b"]).astype(jnp.float32))  # (B, T, Hv)
        a = linear(x, w["w_a"]).astype(jnp.float32) + w["dt_bias"].astype(jnp.float32)
        g = -jnp.exp(w["A_log"].astype(jnp.float32)) * jax.nn.softplus(a)  # (B, T, Hv) log decay
        delta = by_length(lambda xs, state, valid: gated_delta_rule(*xs, state, valid),
                          lambda xs, state, valid: gated_delta_step(*xs, state, valid), row_by_row=True,
                          in_place=gated_delta_in_place)
        out, cache = cache.recurrent(index, "ssm", delta, (q, k, v, g, beta), positions, (hv, dk, dv))
        z = linear(x, w["w_z"], w.get("w_z_scale")).reshape(b, t, hv, dv)
        out = gated_rms_norm(out.astype(x.dtype), w["gdn_norm"], z, c.rms_norm_eps)  # (B, T, Hv, dv)
        return linear(out.reshape(b, t, -1), w["w_out"], w.get("w_out_scale")), cache
