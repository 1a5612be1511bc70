"""NVIDIA Nemotron-H: each layer is one mixer behind one RMSNorm and a residual, the mixer either a
Mamba-2 layer (most layers), grouped-query attention without positions (a few), or an MLP alone
(no KV, no state: layer kind "mlp").

    x = x + mixer(norm(x))                 norm: RMSNorm (layer_norm_epsilon), as is the final norm_f
Mamba-2 mixer: models/parts/mamba2.py (Granite 4.0-H's too), the same tensors under `mixer.`:
    in_proj (I + Cv + H, D) = z | xBC | dt [+ bias: use_bias]   conv1d (Cv, 1, K) [+ bias: use_conv_bias]
    dt_bias, A_log, D (H,)   norm (I,) gated RMSNorm in n_groups groups   out_proj (D, I) [+ bias]
    dt clamped to (time_step_min, inf) on prompts; state per sequence and layer: the conv window
    (K-1, Cv) and the SSM state (H, P, N) (kv/recurrent.py).
Attention mixer: q/k/v/o_proj without biases, no rotary (positions come from the Mamba layers).
MLP mixer: down_proj(relu(up_proj(x))^2) [+ biases: mlp_bias], no gate.
Layer pattern: `layers_block_type` (transformers 5: linear_attention / full_attention / mlp) or
`hybrid_override_pattern` (M / * / -). Mixture-of-experts layers (moe, "E": Nemotron 3) are not
run yet. Checkpoints name the decoder `backbone.` (backbone.embeddings, backbone.layers.i.mixer.*,
backbone.norm_f).
A plain Mamba-2 checkpoint (Mamba2ForCausalLM, "mamba2": every layer a Mamba-2 mixer, no attention, no
KV cache at all) has the same tensors and runs here, its config.json read in Nemotron-H's terms.

HF: NemotronHForCausalLM ("nemotron_h"), Mamba2ForCausalLM ("mamba2"). GGUF: `nemotron_h` and `mamba2` as
llama.cpp's converter writes them: the mixer's tensors as models/parts/mamba2.py maps them, each layer's norm as
attn_norm, q/k rows interleaved for llama.cpp's rotary (which these layers do not run), the MLP as
ffn_up / ffn_down; the layer kinds from the per-layer `attention.head_count_kv` (attention where > 0) and
`feed_forward_length` (an MLP where > 0). Not yet Nemotron 3's `nemotron_h_moe`.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from ...config import AttentionSpec
from ...errors import UnsupportedModelError
from ...ops.linear import linear
from ...ops.norm import rms_norm
from ..parts.base import CausalLM
from ..parts.blocks import attention, attention_weights, norm
from ..parts.config_io import GGUFMeta, check_activation, gguf_fields, hf_fields, json_float
from ..parts.mamba2 import Mamba2Config, mamba2_gguf_fields, mamba2_mixer, mamba2_weights
from ..parts.spec import Weight, paired, tensor

# HF layer type spellings (transformers 5, transformers 4 / remote code, hybrid_override_pattern) -> kind
KINDS = {"linear_attention": "mamba2", "mamba": "mamba2", "M": "mamba2",
         "full_attention": "attention", "attention": "attention", "*": "attention",
         "mlp": "mlp", "-": "mlp"}


@dataclass(frozen=True)
class NemotronHConfig(Mamba2Config):
    kinds: tuple[str, ...] = ()  # per layer: "mamba2", "attention" or "mlp"
    mlp_bias: bool = False

    def layer_kind(self, layer: int) -> str:
        return self.kinds[layer]

    def layer_rope(self, layer: int):
        return None

    def attention_spec(self, layer: int) -> AttentionSpec:
        return AttentionSpec(scale=self.head_dim ** -0.5)



def layer_kinds(cfg: dict, where: str) -> tuple[str, ...]:
    types = cfg.get("layers_block_type") or cfg.get("layer_types") or list(cfg.get("hybrid_override_pattern") or "")
    if not types:
        raise UnsupportedModelError(f"{where}: no layers_block_type / hybrid_override_pattern")
    unknown = sorted({t for t in types if t not in KINDS})
    if unknown:
        raise UnsupportedModelError(f"{where}: Nemotron-H layer types {unknown} are not supported yet "
                                    f"(supported: Mamba-2, attention and MLP layers)")
    return tuple(KINDS[t] for t in types)


def mamba2_as_nemotron_h(cfg: dict) -> dict:
    """A Mamba2ForCausalLM config.json in Nemotron-H's keys: every layer a Mamba-2 mixer; its
    head_dim / num_heads are the mixer's (there is no attention)."""
    n, limit = int(cfg["num_hidden_layers"]), cfg.get("time_step_limit") or (0.0, float("inf"))
    return {**cfg, "layers_block_type": ["mamba"] * n, "mamba_num_heads": cfg["num_heads"],
            "mamba_head_dim": cfg["head_dim"], "ssm_state_size": cfg.get("state_size", 128),
            "mamba_hidden_act": cfg.get("hidden_act", "silu"), "mlp_hidden_act": "relu2",
            "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": None, "intermediate_size": 0,
            "time_step_limit": (json_float(limit[0]), json_float(limit[1]))}


class NemotronH(CausalLM):
    name = "nemotron_h"
    hf_model_types = ("nemotron_h", "mamba2")
    hf_architectures = ("NemotronHForCausalLM", "Mamba2ForCausalLM")
    config_class = NemotronHConfig
    gguf_architectures = ("mamba2", "nemotron_h")

    @classmethod
    def config_from_hf(cls, cfg: dict, where: str):
        if cfg.get("model_type") == "mamba2":
            cfg = mamba2_as_nemotron_h(cfg)
        check_activation(cfg, where, ("relu2",), key="mlp_hidden_act")
        check_activation(cfg, where, ("silu", "swish"), key="mamba_hidden_act")
        kinds = layer_kinds(cfg, where)
        fields = hf_fields({**cfg, "num_hidden_layers": len(kinds), "rope_theta": cfg.get("rope_theta") or 10000.0},
                           where, cls.name)  # no rotary: a placeholder theta
        get = lambda new, old, default: cfg.get(new, cfg.get(old, default))  # noqa: E731 (transformers 5 / 4 names)
        return cls.config_class(
            **{**fields, "rms_norm_eps": float(cfg.get("layer_norm_epsilon", 1e-5))},
            kinds=kinds, mlp_bias=bool(cfg.get("mlp_bias", False)),
            mamba_heads=int(cfg["mamba_num_heads"]), mamba_head_dim=int(cfg["mamba_head_dim"]),
            mamba_groups=int(get("n_groups", "mamba_n_groups", 8)), mamba_state=int(cfg.get("ssm_state_size", 128)),
            mamba_conv_kernel=int(get("conv_kernel", "mamba_d_conv", 4)),
            mamba_conv_bias=bool(get("use_conv_bias", "mamba_conv_bias", True)),
            mamba_proj_bias=bool(cfg.get("use_bias", False)),
            time_step_limit=cfg.get("time_step_limit") if cfg.get("model_type") == "mamba2"
            else (float(get("time_step_min", "mamba_dt_min", 0.001)), float("inf")))

    @classmethod
    def config_from_gguf(cls, meta: GGUFMeta, where: str):
        """`nemotron_h`: the layer kinds from the per-layer KV heads and MLP widths; a plain Mamba-2
        (`mamba2`): no attention (head_count 0); the mixer from the ssm.* keys."""
        d, plain = int(meta.key("embedding_length", required=True)), meta.arch == "mamba2"
        fields = gguf_fields(meta, cls.name, head_dim=d if plain else None)  # mamba2: a placeholder head
        n = fields["num_layers"]
        kv_heads, widths = (list(map(int, meta.per_layer(key, n))) for key in ("attention.head_count_kv",
                                                                                "feed_forward_length"))
        kinds = ("mamba2",) * n if plain else tuple(
            "attention" if kv else "mlp" if f else "mamba2" for kv, f in zip(kv_heads, widths))
        shape = (dict(num_heads=1, num_kv_heads=1, intermediate_size=0) if plain else
                 dict(num_kv_heads=max(kv_heads) or fields["num_heads"], intermediate_size=max(widths)))
        eps = meta.key("attention.layer_norm_rms_epsilon") or meta.key("attention.layer_norm_epsilon", 1e-5)
        return cls.config_class(**{**fields, **shape, "rms_norm_eps": float(eps)}, kinds=kinds,
                                mlp_bias=meta.has_any("ffn_up.bias"), **mamba2_gguf_fields(meta))

    @classmethod
    def global_weights(cls, config):
        v, d = config.vocab_size, config.hidden_size
        out = {"embed": Weight((v, d), ("vocab", "embed"), tensor("backbone.embeddings.weight", (v, d), matrix=False),
                               tensor("token_embd.weight", (v, d), matrix=False), lookup=True),
               "final_norm": norm(d, "backbone.norm_f.weight", "output_norm.weight")}
        if not config.tie_word_embeddings:
            out["lm_head"] = Weight((d, v), ("embed", "vocab"), tensor("lm_head.weight", (v, d)),
                                    tensor("output.weight", (v, d)), quantize=True)
        return out

    # ------------------------------------------------------------ weights
    @classmethod
    def layer_weights(cls, c: NemotronHConfig, i: int):
        hf, gg, d, f = f"backbone.layers.{i}", f"blk.{i}", c.hidden_size, c.intermediate_size
        out = {"norm": norm(d, f"{hf}.norm.weight", f"{gg}.attn_norm.weight")}
        kind, mixer = c.kinds[i], f"{hf}.mixer"
        if kind == "mamba2":
            return {**out, **mamba2_weights(c, mixer, gg)}
        if kind == "attention":
            return {**out, **attention_weights(c, hf=mixer, gguf=gg, permuted_qk=True)}
        out["w_up"] = Weight((d, f), ("embed", "mlp"), *paired(f"{mixer}.up_proj.weight", f"{gg}.ffn_up.weight", (f, d)),
                             quantize=True)
        out["w_down"] = Weight((f, d), ("mlp", "embed"), *paired(f"{mixer}.down_proj.weight", f"{gg}.ffn_down.weight",
                                                                 (d, f)), quantize=True)
        if c.mlp_bias:
            out["b_up"] = Weight((f,), ("mlp",), *paired(f"{mixer}.up_proj.bias", f"{gg}.ffn_up.bias", (f,)),
                                 init="zeros")
            out["b_down"] = Weight((d,), ("embed",), *paired(f"{mixer}.down_proj.bias", f"{gg}.ffn_down.bias", (d,)),
                                   init="zeros")
        return out

    # ------------------------------------------------------------ forward
    def layer(self, i, x, w, cache, ctx):
        c = self.config
        h = rms_norm(x, w["norm"], c.rms_norm_eps)
        kind = c.kinds[i]
        if kind == "mamba2":
            h, cache = mamba2_mixer(c, i, h, w, cache, ctx.positions)
        elif kind == "attention":
            h, cache = attention(c, i, h, w, cache, ctx)
        else:
            h = self._mlp(h, w)
        return x + h, cache

    @staticmethod
    def _mlp(x, w):
        """down(relu(up(x))^2): x (B, T, D) -> (B, T, D)."""
        h = linear(x, w["w_up"], w.get("w_up_scale"))  # (B, T, F)
        if "b_up" in w:
            h = h + w["b_up"].astype(h.dtype)
        h = jnp.square(jax.nn.relu(h))
        out = linear(h, w["w_down"], w.get("w_down_scale"))
        return out + w["b_down"].astype(out.dtype) if "b_down" in w else out
