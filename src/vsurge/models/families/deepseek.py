"""DeepSeek-V2 / V2-Lite / V3 (and R1): multi-head latent attention (MLA) and a mixture of
experts with shared experts, the first `first_k_dense_replace` layers dense.

MLA caches one latent per token instead of per-head keys and values: c (kv_lora_rank) and the
rotary key k_pe (qk_rope_head_dim), i.e. one KV "head" whose key is [c | k_pe] and whose value
is c. Queries are absorbed into the latent space (q_nope @ W_uk per head, W_uk from kv_b_proj),
attention runs against the latent cache, and its output leaves through W_uv then o_proj: the
same scores as the expanded form, with a cache of (kv_lora + rope) * 2 values per token and layer
instead of heads * (nope + rope + v). The rotary dims of q and k_pe are stored interleaved in
DeepSeek's checkpoints (and GGUFs); their rows are put in rotate-half order at load.

Routing: V3 scores experts with sigmoids, chooses with a correction bias among the best
`topk_group` of `n_group` groups (a group scores its best two), renormalizes and scales by
routed_scaling_factor; V2 uses softmax probabilities ("group_limited_greedy": a group scores its
best expert). HF: DeepseekV2ForCausalLM ("deepseek_v2"), DeepseekV3ForCausalLM ("deepseek_v3");
GGUF: `deepseek2` (kv_b split into attn_k_b (transposed) and attn_v_b, as llama.cpp's converter
writes it).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import jax.numpy as jnp

from ...config import AttentionSpec, KVLayer, ModelConfig
from ...errors import UnsupportedModelError
from ...ops.linear import linear
from ...ops.moe import Routing
from ...ops.norm import rms_norm
from ...ops.rope import apply_rope, yarn_softmax_scale
from ..parts.base import CausalLM
from ..parts.blocks import mlp, mlp_weights, norm
from ..parts.config_io import GGUFMeta, check_activation, gguf_fields, hf_fields, hf_rope_parameters, rope_from_hf
from ..parts.moe import MoEConfig, expert_weights, router_weights, routed
from ..parts.spec import HeadSlice, Weight, tensor


@dataclass(frozen=True)
class DeepseekConfig(MoEConfig):
    q_lora_rank: int | None = None
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    scoring: str = "softmax"  # "sigmoid" (V3)
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0

    @property
    def routing(self) -> Routing:
        return Routing(self.num_experts, self.num_experts_per_tok, scoring=self.scoring,
                       norm_topk_prob=self.norm_topk_prob, groups=self.n_group, topk_groups=self.topk_group,
                       group_score="top2" if self.scoring == "sigmoid" else "max", scale=self.routed_scaling_factor)

    @property
    def kv_layout(self) -> tuple[KVLayer, ...]:
        latent = KVLayer(1, self.kv_lora_rank + self.qk_rope_head_dim, self.kv_lora_rank)
        return (latent,) * self.num_layers

    def attention_spec(self, layer: int) -> AttentionSpec:
        scale = (self.qk_nope_head_dim + self.qk_rope_head_dim) ** -0.5 * yarn_softmax_scale(self.rope)
        return AttentionSpec(scale=scale)

    def for_tensor_parallel(self, tp: int) -> ModelConfig:
        if self.num_heads % tp:
            raise ValueError(f"tensor_parallel_size {tp} must divide the model's {self.num_heads} attention heads")
        for what, size in self.split_sizes().items():
            if size % tp:
                raise ValueError(f"tensor_parallel_size {tp} must divide the model's {what} {size}")
        return self  # the latent cache is one head: every device keeps all of it


def _moe_layers(n: int, first_dense: int, freq: int = 1) -> tuple[bool, ...]:
    return tuple(i >= first_dense and i % freq == 0 for i in range(n))


class DeepSeek(CausalLM):
    name = "deepseek"
    hf_model_types = ("deepseek_v2", "deepseek_v3")
    hf_architectures = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")
    gguf_architectures = ("deepseek2",)
    config_class = DeepseekConfig

    @classmethod
    def ignores_tensor(cls, name: str, config) -> bool:
        """V3 checkpoints carry multi-token-prediction layers beyond num_hidden_layers: not used (a GGUF's:
        the base class)."""
        m = re.match(r"model\.layers\.(\d+)\.", name)
        return super().ignores_tensor(name, config) or (m is not None and int(m.group(1)) >= config.num_layers)

    @classmethod
    def config_from_hf(cls, cfg: dict, where: str) -> ModelConfig:
        check_activation(cfg, where, ("silu", "swish"))
        if cfg.get("attention_bias"):
            raise UnsupportedModelError(f"{where}: DeepSeek attention biases are not supported")
        v3 = cfg.get("model_type") == "deepseek_v3"
        rope_dim = int(cfg["qk_rope_head_dim"])
        fields = hf_fields(cfg, where, cls.name, head_dim=rope_dim)
        params = hf_rope_parameters(cfg)
        fields["rope"] = rope_from_hf({**params, "partial_rotary_factor": 1.0}, rope_dim, where,
                                      max_position_embeddings=fields["max_position_embeddings"])
        method = cfg.get("topk_method", "noaux_tc" if v3 else "greedy")
        grouped = method in ("group_limited_greedy", "noaux_tc")
        n = fields["num_layers"]
        return DeepseekConfig(
            **{**fields, "num_kv_heads": 1},
            q_lora_rank=cfg.get("q_lora_rank"), kv_lora_rank=int(cfg["kv_lora_rank"]),
            qk_nope_head_dim=int(cfg["qk_nope_head_dim"]), qk_rope_head_dim=rope_dim, v_head_dim=int(cfg["v_head_dim"]),
            num_experts=int(cfg.get("n_routed_experts") or 0), num_experts_per_tok=int(cfg.get("num_experts_per_tok") or 1),
            moe_intermediate_size=int(cfg.get("moe_intermediate_size") or 0),
            norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
            shared_intermediate_size=int(cfg.get("n_shared_experts") or 0) * int(cfg.get("moe_intermediate_size") or 0),
            moe_layers=_moe_layers(n, int(cfg.get("first_k_dense_replace", 0)), int(cfg.get("moe_layer_freq", 1)))
            if cfg.get("n_routed_experts") else (False,) * n,
            scoring=cfg.get("scoring_func", "sigmoid" if v3 else "softmax"),
            n_group=int(cfg.get("n_group") or 1) if grouped else 1,
            topk_group=int(cfg.get("topk_group") or 1) if grouped else 1,
            routed_scaling_factor=float(cfg.get("routed_scaling_factor", 1.0)))

    @classmethod
    def config_from_gguf(cls, meta: GGUFMeta, where: str) -> ModelConfig:
        rope_dim = int(meta.key("rope.dimension_count", required=True))
        fields = gguf_fields(meta, cls.name, head_dim=rope_dim)
        n = fields["num_layers"]
        kv_lora = int(meta.key("attention.kv_lora_rank", required=True))
        k_mla = int(meta.key("attention.key_length_mla", required=True))
        rope = fields["rope"]
        if rope.mscale:  # llama.cpp's DeepSeek converter writes 0.1 * mscale_all_dim, for legacy reasons
            rope = dataclasses.replace(rope, mscale=rope.mscale / 0.1, mscale_all_dim=rope.mscale / 0.1)
        # no gating key: V2 GGUFs (softmax), or a V3 converted from a config without `scoring_func`,
        # which its correction bias gives away (V3 scores with sigmoids)
        gating = int(meta.key("expert_gating_func", 2 if meta.has("blk.%d.exp_probs_b.bias" % (n - 1)) else 1))
        experts = int(meta.key("expert_count", 0) or 0)
        return DeepseekConfig(
            **{**fields, "num_kv_heads": 1, "rope": rope},
            q_lora_rank=meta.key("attention.q_lora_rank"), kv_lora_rank=kv_lora, qk_nope_head_dim=k_mla - rope_dim,
            qk_rope_head_dim=rope_dim, v_head_dim=int(meta.key("attention.value_length_mla", required=True)),
            num_experts=experts, num_experts_per_tok=int(meta.key("expert_used_count", 1)),
            moe_intermediate_size=int(meta.key("expert_feed_forward_length", 0) or 0),
            norm_topk_prob=bool(meta.key("expert_weights_norm", False)),
            shared_intermediate_size=int(meta.key("expert_shared_count", 0)) * int(meta.key("expert_feed_forward_length", 0) or 0),
            moe_layers=_moe_layers(n, int(meta.key("leading_dense_block_count", 0))) if experts else (False,) * n,
            scoring="sigmoid" if gating == 2 else "softmax", n_group=int(meta.key("expert_group_count", 1) or 1),
            topk_group=int(meta.key("expert_group_used_count", 1) or 1),
            routed_scaling_factor=float(meta.key("expert_weights_scale", 1.0) or 1.0))

    @classmethod
    def layer_weights(cls, c: DeepseekConfig, i: int):
        hf, gg, d = f"model.layers.{i}", f"blk.{i}", c.hidden_size
        a = f"{hf}.self_attn"
        h, nope, rope, v, kv = c.num_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, c.kv_lora_rank
        qk = nope + rope
        q_rows = dict(permuted_heads=h, permute_span=(nope, qk))  # each head's rotary rows are interleaved
        out = {"attn_norm": norm(d, f"{hf}.input_layernorm.weight", f"{gg}.attn_norm.weight")}
        if c.q_lora_rank:
            r = c.q_lora_rank
            out["wq_a"] = Weight((d, r), ("embed", None), tensor(f"{a}.q_a_proj.weight", (r, d)),
                                 tensor(f"{gg}.attn_q_a.weight", (r, d)), quantize=True)
            out["q_a_norm"] = Weight((r,), (None,), tensor(f"{a}.q_a_layernorm.weight", (r,)),
                                     tensor(f"{gg}.attn_q_a_norm.weight", (r,)), init="ones")
            out["wq_b"] = Weight((r, h * qk), (None, "heads"), tensor(f"{a}.q_b_proj.weight", (h * qk, r), **q_rows),
                                 tensor(f"{gg}.attn_q_b.weight", (h * qk, r), **q_rows), quantize=True)
        else:
            out["wq"] = Weight((d, h * qk), ("embed", "heads"), tensor(f"{a}.q_proj.weight", (h * qk, d), **q_rows),
                               tensor(f"{gg}.attn_q.weight", (h * qk, d), **q_rows), quantize=True)
        kv_rows = dict(permuted_heads=1, permute_span=(kv, kv + rope))
        out["wkv_a"] = Weight((d, kv + rope), ("embed", None),
                              tensor(f"{a}.kv_a_proj_with_mqa.weight", (kv + rope, d), **kv_rows),
                              tensor(f"{gg}.attn_kv_a_mqa.weight", (kv + rope, d), **kv_rows), quantize=True)
        out["kv_a_norm"] = Weight((kv,), (None,), tensor(f"{a}.kv_a_layernorm.weight", (kv,)),
                                  tensor(f"{gg}.attn_kv_a_norm.weight", (kv,)), init="ones")
        kv_b = (f"{a}.kv_b_proj.weight", (h * (nope + v), kv))
        out["w_uk"] = Weight((h, nope, kv), ("heads", None, None), HeadSlice(*kv_b, heads=h, part=(0, nope)),
                             tensor(f"{gg}.attn_k_b.weight", (h, kv, nope)))
        out["w_uv"] = Weight((h, v, kv), ("heads", None, None), HeadSlice(*kv_b, heads=h, part=(nope, nope + v)),
                             tensor(f"{gg}.attn_v_b.weight", (h, v, kv), matrix=False))
        out["wo"] = Weight((h * v, d), ("heads", "embed"), tensor(f"{a}.o_proj.weight", (d, h * v)),
                           tensor(f"{gg}.attn_output.weight", (d, h * v)), quantize=True)
        out["mlp_norm"] = norm(d, f"{hf}.post_attention_layernorm.weight", f"{gg}.ffn_norm.weight")
        if not c.is_moe(i):
            return {**out, **mlp_weights(d, c.intermediate_size, hf=f"{hf}.mlp", gguf=gg)}
        out.update(router_weights(c, f"{hf}.mlp.gate", f"{gg}.ffn_gate_inp"))
        if c.scoring == "sigmoid":
            e = c.num_experts
            out["router_correction"] = Weight((e,), (None,), tensor(f"{hf}.mlp.gate.e_score_correction_bias", (e,)),
                                              tensor(f"{gg}.exp_probs_b.bias", (e,)), init="zeros")
        out.update(expert_weights(c, hf_expert=lambda x, kind: f"{hf}.mlp.experts.{x}.{kind}_proj.weight", gguf=gg))
        if c.shared_intermediate_size:
            shared = mlp_weights(d, c.shared_intermediate_size, hf=f"{hf}.mlp.shared_experts", gguf=gg,
                                 gguf_suffix="_shexp")
            out.update({"shared_gate_up": shared["w_gate_up"], "shared_down": shared["w_down"]})
        return out

    def _attention(self, i, x, w, cache, ctx):
        """MLA of normed x (B, T, D) -> (B, T, D), against the latent cache."""
        c = self.config
        b, t, _ = x.shape
        nope, kv = c.qk_nope_head_dim, c.kv_lora_rank
        if "wq_a" in w:
            q = linear(rms_norm(linear(x, w["wq_a"], w.get("wq_a_scale")), w["q_a_norm"], c.rms_norm_eps),
                       w["wq_b"], w.get("wq_b_scale"))
        else:
            q = linear(x, w["wq"], w.get("wq_scale"))
        q = q.reshape(b, t, c.num_heads, nope + c.qk_rope_head_dim)  # (B, T, H, nope + rope)
        latent = linear(x, w["wkv_a"], w.get("wkv_a_scale"))  # (B, T, kv + rope)
        c_kv = rms_norm(latent[..., :kv], w["kv_a_norm"], c.rms_norm_eps)[:, :, None]  # (B, T, 1, kv)
        cos, sin = ctx.rope(c, i)
        q_pe, k_pe = apply_rope(q[..., nope:], cos, sin), apply_rope(latent[:, :, None, kv:], cos, sin)
        q_lat = jnp.einsum("bthn,hnc->bthc", q[..., :nope], w["w_uk"].astype(q.dtype))  # (B, T, H, kv)
        attn, cache = cache.attend(i, jnp.concatenate([q_lat, q_pe], -1), jnp.concatenate([c_kv, k_pe], -1), c_kv,
                                   ctx.positions, c.attention_spec(i))  # (B, T, H, kv)
        out = jnp.einsum("bthc,hvc->bthv", attn, w["w_uv"].astype(attn.dtype)).reshape(b, t, -1)
        return linear(out, w["wo"], w.get("wo_scale")), cache

    def layer(self, i, x, w, cache, ctx):
        c = self.config
        h, cache = self._attention(i, rms_norm(x, w["attn_norm"], c.rms_norm_eps), w, cache, ctx)
        x = x + h
        h = rms_norm(x, w["mlp_norm"], c.rms_norm_eps)
        if not c.is_moe(i):
            return x + mlp(h, w), cache
        out = routed(self, h, w, correction=w.get("router_correction"))
        if "shared_gate_up" in w:
            out = out + mlp(h, w, prefix="shared")
        return x + out, cache

