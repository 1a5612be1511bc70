"""Llama 4 (text): Llama's pre-norm layers with three kinds of attention layer and a mixture of
experts that scales each expert's input.

- RoPE layers (`no_rope_layers[i] == 1`) rotate adjacent pairs of each q/k head (put in rotate-half
  order at load), RMS-normalize q and k without weights after the rotation (`use_qk_norm`), and
  attend within local chunks of `attention_chunk_size` positions (AttentionSpec.chunk): a query
  at position p sees keys k <= p with k // C == p // C.
- NoPE layers (one in four) attend to the whole context without positions, their queries scaled
  by log1p(floor((p + 1) / floor_scale)) * attn_scale + 1 (`attn_temperature_tuning`).
- MoE layers (every `interleave_moe_layer_step`-th, or `moe_layers`): the router's top-k logits
  through a sigmoid, each chosen expert fed its input times that score (Routing.scale_inputs), plus
  a shared expert; the others a dense MLP of `intermediate_size_mlp`. The experts are stored fused:
  gate_up_proj (E, D, 2F) with gate then up, down_proj (E, F, D), both (in, out).

HF: Llama4ForCausalLM ("llama4_text"), and the text model of a whole Llama 4 checkpoint
(Llama4ForConditionalGeneration, "llama4": its `text_config`, weights under language_model.model and
language_model.lm_head; the vision tower and projector are not read). GGUF: `llama4` as llama.cpp's
converter writes it (q/k as HF stores them, the experts split into ffn_{gate,up,down}_exps, the shared
expert as *_shexp, Llama 3 rope scaling as rope_freqs); the file does not carry the chunk size, the NoPE
layers, the temperature tuning or the q/k norm, so they are llama.cpp's: chunks of 8192, NoPE every
fourth layer, floor_scale 8192 and attn_scale 0.1, q/k norms unless 128 experts (Maverick); a
`sliding_window` of 0 means no chunks and rotary everywhere.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import jax.numpy as jnp

from ...config import AttentionSpec, Rope
from ...ops.moe import Routing
from ...ops.norm import rms_norm
from ..parts.base import CausalLM
from ..parts.blocks import attention, attention_weights, mlp, mlp_weights, norm
from ..parts.config_io import GGUFMeta, check_activation, gguf_fields, hf_fields
from ..parts.moe import MoEConfig, expert_axes, routed_and_shared, router_weights
from ..parts.spec import Columns, GateUp, Weight, tensor


@dataclass(frozen=True)
class Llama4Config(MoEConfig):
    rope_layers: tuple[bool, ...] = ()  # per layer: rotary (True) or NoPE
    chunked_layers: tuple[bool, ...] = ()  # per layer: local chunks of attention_chunk_size
    attention_chunk_size: int | None = None
    use_qk_norm: bool = False  # weightless RMSNorm of the rotated q and k on rotary layers
    temperature_tuning: bool = False  # query scaling on NoPE layers
    floor_scale: float = 8192.0
    attn_scale: float = 0.1
    hf_prefix: str = "model"  # "language_model.model" in a whole Llama 4 checkpoint
    hf_head: str = "lm_head"  # "language_model.lm_head" there

    def layer_rope(self, layer: int) -> Rope | None:
        return self.rope if self.rope_layers[layer] else None

    def attention_spec(self, layer: int) -> AttentionSpec:
        return AttentionSpec(scale=self.head_dim ** -0.5,
                             chunk=self.attention_chunk_size if self.chunked_layers[layer] else None)

    @property
    def routing(self) -> Routing:
        return Routing(self.num_experts, self.num_experts_per_tok, scoring="sigmoid", scale_inputs=True)


class Llama4(CausalLM):
    name = "llama4"
    hf_model_types = ("llama4_text", "llama4")
    hf_architectures = ("Llama4ForCausalLM", "Llama4ForConditionalGeneration")
    config_class = Llama4Config
    gguf_architectures = ("llama4",)
    gguf_config_tensors = ("rope_freqs.weight",)  # Llama 3 rope scaling, read into the config

    @classmethod
    def ignores_tensor(cls, name: str, config) -> bool:
        return super().ignores_tensor(name, config) or name.startswith(("vision_model.", "multi_modal_projector."))

    @classmethod
    def config_from_hf(cls, cfg: dict, where: str):
        prefix, head = "model", "lm_head"
        if "text_config" in cfg:  # a whole vision-language checkpoint: its text model
            text = cfg["text_config"]
            cfg = {**text, "tie_word_embeddings": cfg.get("tie_word_embeddings", text.get("tie_word_embeddings")),
                   "eos_token_id": cfg.get("eos_token_id", text.get("eos_token_id")),
                   "_name_or_path": cfg.get("_name_or_path", "")}
            prefix, head = "language_model.model", "language_model.lm_head"
        check_activation(cfg, where, ("silu", "swish"))
        # Llama4TextConfig's defaults where config.json leaves a key out
        cfg = {"rope_theta": 500000.0, "rms_norm_eps": 1e-5, **cfg}
        fields = hf_fields(cfg, where, cls.name)
        n = fields["num_layers"]
        # as Llama4TextConfig derives them
        interval = int(cfg.get("no_rope_layer_interval", 4) or 4)
        rope_layers = cfg.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(n)]
        chunk = cfg.get("attention_chunk_size", 8192)
        types = cfg.get("layer_types") or ["chunked_attention" if r and chunk is not None else "full_attention"
                                           for r in rope_layers]
        moe = cfg.get("moe_layers")
        if moe is None:
            step = int(cfg.get("interleave_moe_layer_step", 1) or 1)
            moe = range(step - 1, n, step)
        moe = set(moe)
        experts_width = int(cfg.get("intermediate_size") or 8192)
        bias = bool(cfg.get("attention_bias", False))
        fields["intermediate_size"] = int(cfg.get("intermediate_size_mlp") or 16384)  # the dense layers' MLP
        return Llama4Config(
            **fields, qkv_bias=bias, o_bias=bias, num_experts=int(cfg.get("num_local_experts", 16)),
            num_experts_per_tok=int(cfg.get("num_experts_per_tok", 1)), moe_intermediate_size=experts_width,
            shared_intermediate_size=experts_width, moe_layers=tuple(i in moe for i in range(n)),
            rope_layers=tuple(bool(r) for r in rope_layers[:n]),
            chunked_layers=tuple(t == "chunked_attention" and chunk is not None for t in types[:n]),
            attention_chunk_size=int(chunk) if chunk is not None else None,
            use_qk_norm=bool(cfg.get("use_qk_norm", True)),
            temperature_tuning=bool(cfg.get("attn_temperature_tuning", True)),
            floor_scale=float(cfg.get("floor_scale", 8192)), attn_scale=float(cfg.get("attn_scale", 0.1)),
            hf_prefix=prefix, hf_head=head)

    @classmethod
    def config_from_gguf(cls, meta: GGUFMeta, where: str):
        fields = gguf_fields(meta, cls.name)
        n, experts = fields["num_layers"], int(meta.key("expert_count", 0) or 0)
        chunked = meta.key("attention.sliding_window") != 0  # 0: MobileLLM's, no chunks, rotary everywhere
        rope_layers = tuple(not chunked or (i + 1) % 4 != 0 for i in range(n))
        shared = meta.tensors.get(next((f"blk.{i}.ffn_gate_shexp.weight" for i in range(n)
                                        if meta.has(f"blk.{i}.ffn_gate_shexp.weight")), ""), (0,))[0]
        return Llama4Config(
            **fields, qkv_bias=meta.has_any("attn_q.bias"), o_bias=meta.has_any("attn_output.bias"),
            num_experts=experts, num_experts_per_tok=int(meta.key("expert_used_count", 1) or 1),
            moe_intermediate_size=int(meta.key("expert_feed_forward_length", 0) or 0), shared_intermediate_size=shared,
            moe_layers=tuple(meta.has(f"blk.{i}.ffn_gate_inp.weight") for i in range(n)), rope_layers=rope_layers,
            chunked_layers=tuple(chunked and r for r in rope_layers), attention_chunk_size=8192 if chunked else None,
            use_qk_norm=experts != 128, temperature_tuning=chunked, floor_scale=8192.0, attn_scale=0.1)

    @classmethod
    def global_weights(cls, c: Llama4Config):
        v, d = c.vocab_size, c.hidden_size
        out = super().global_weights(c)
        out["embed"] = dataclasses.replace(out["embed"], hf=tensor(f"{c.hf_prefix}.embed_tokens.weight", (v, d),
                                                                   matrix=False))
        out["final_norm"] = norm(d, f"{c.hf_prefix}.norm.weight", "output_norm.weight")
        if "lm_head" in out:
            out["lm_head"] = dataclasses.replace(out["lm_head"], hf=tensor(f"{c.hf_head}.weight", (v, d)))
        return out

    @classmethod
    def layer_weights(cls, c: Llama4Config, i: int):
        hf, gg, d = f"{c.hf_prefix}.layers.{i}", f"blk.{i}", c.hidden_size
        ff = f"{hf}.feed_forward"
        out = {
            "attn_norm": norm(d, f"{hf}.input_layernorm.weight", f"{gg}.attn_norm.weight"),
            # rotary layers rotate adjacent pairs (both formats): rotate-half order at load (NoPE layers as stored)
            **attention_weights(c, hf=f"{hf}.self_attn", gguf=gg,
                                interleaved_rotary=c.head_dim if c.rope_layers[i] else 0),
            "mlp_norm": norm(d, f"{hf}.post_attention_layernorm.weight", f"{gg}.ffn_norm.weight"),
        }
        if not c.is_moe(i):
            return {**out, **mlp_weights(d, c.intermediate_size, hf=ff, gguf=gg)}
        e, f = c.num_experts, c.moe_intermediate_size
        gate_up = (f"{ff}.experts.gate_up_proj", (e, d, 2 * f))
        shared = mlp_weights(d, c.shared_intermediate_size, hf=f"{ff}.shared_expert", gguf=gg, gguf_suffix="_shexp")
        return {
            **out,
            **router_weights(c, f"{ff}.router", f"{gg}.ffn_gate_inp"),
            "experts_gate_up": Weight((e, d, 2 * f), expert_axes(c, "gate_up"),
                                      GateUp(Columns(*gate_up, (0, f)), Columns(*gate_up, (f, 2 * f))),
                                      GateUp(tensor(f"{gg}.ffn_gate_exps.weight", (e, f, d)),
                                             tensor(f"{gg}.ffn_up_exps.weight", (e, f, d))), indexed=True),
            "experts_down": Weight((e, f, d), expert_axes(c, "down"),
                                   tensor(f"{ff}.experts.down_proj", (e, f, d), matrix=False),
                                   tensor(f"{gg}.ffn_down_exps.weight", (e, d, f)), indexed=True),
            "shared_gate_up": shared["w_gate_up"], "shared_down": shared["w_down"],
        }

    def layer(self, i, x, w, cache, ctx):
        c = self.config
        scale = None
        if c.temperature_tuning and not c.rope_layers[i]:
            steps = jnp.floor((ctx.positions.astype(jnp.float32) + 1.0) / c.floor_scale)
            scale = jnp.log1p(steps) * c.attn_scale + 1.0
        h, cache = attention(c, i, rms_norm(x, w["attn_norm"], c.rms_norm_eps), w, cache, ctx, query_scale=scale,
                             rotated_qk_norm=c.use_qk_norm and c.rope_layers[i])
        x = x + h
        h = rms_norm(x, w["mlp_norm"], c.rms_norm_eps)
        return x + (routed_and_shared(self, h, w) if c.is_moe(i) else mlp(h, w)), cache
