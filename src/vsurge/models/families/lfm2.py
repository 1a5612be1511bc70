"""Liquid LFM2: gated short convolutions on most layers (e.g. 10 of 16), grouped-query attention with
per-head q/k RMSNorm on the rest, a gated MLP (w1 gate, w3 up, w2 down) on every layer.

Short-conv layer (D hidden, K = conv_L_cache taps):
    in_proj (3D, D) = B | C | x  [+ bias]    conv (D, 1, K) depthwise causal [+ bias]    out_proj (D, D) [+ bias]
    y = out_proj(C * causal_conv(B * x)): no activation; the state per sequence and layer is the
    conv window (K-1, D) of past B*x (kv/recurrent.py).
Attention layer: q/k/v_proj, out_proj; q_layernorm / k_layernorm (head_dim) before rotary.
Every norm is RMSNorm with `norm_eps`; the final one is stored as `model.embedding_norm`.
The MLP width: with block_auto_adjust_ff_dim, int(2F/3), times block_ffn_dim_multiplier, rounded up
to block_multiple_of (as the reference computes it).

HF: Lfm2ForCausalLM ("lfm2"). GGUF: `lfm2` as llama.cpp's converter writes it (in_proj, conv and
out_proj under blk.N.shortconv, the convolution squeezed to (D, K), the final norm as
token_embd_norm; which layers convolve is read from the per-layer attention.head_count_kv, 0 there).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...config import ModelConfig, StateLayer
from ...ops.linear import linear
from ...ops.norm import rms_norm
from ..parts.base import CausalLM
from ..parts.blocks import attention, attention_weights, mlp, norm, short_conv_op
from ..parts.config_io import GGUFMeta, gguf_fields, hf_fields
from ..parts.spec import GateUp, Mapped, Weight, paired, tensor


@dataclass(frozen=True)
class Lfm2Config(ModelConfig):
    conv_layers: tuple[bool, ...] = ()  # per layer: short convolution (True) or attention
    conv_kernel: int = 3  # conv_L_cache
    conv_bias: bool = False

    def layer_kind(self, layer: int) -> str:
        return "short_conv" if self.conv_layers[layer] else "attention"

    @property
    def state_layout(self) -> tuple[StateLayer, ...]:
        layer = StateLayer((("conv", (self.conv_kernel - 1, self.hidden_size)),))
        return (layer,) * len(self.recurrent_layers)

    def layer_rope(self, layer: int):
        return None if self.conv_layers[layer] else self.rope



def ffn_width(cfg: dict) -> int:
    """The MLP width the reference builds (Lfm2MLP)."""
    f = int(cfg.get("block_ff_dim") or cfg.get("intermediate_size"))
    if cfg.get("block_auto_adjust_ff_dim", True):
        f = int(2 * f / 3)
        multiplier = cfg.get("block_ffn_dim_multiplier", 1.0)
        if multiplier is not None:
            f = int(multiplier * f)
            m = int(cfg.get("block_multiple_of", 256))
            f = m * ((f + m - 1) // m)
    return f


class Lfm2(CausalLM):
    name = "lfm2"
    hf_architectures = ("Lfm2ForCausalLM",)
    config_class = Lfm2Config
    gguf_architectures = ("lfm2",)

    @classmethod
    def config_from_hf(cls, cfg: dict, where: str):
        fields = hf_fields(cfg, where, cls.name)
        n = fields["num_layers"]
        types = cfg.get("layer_types")
        if not types:
            full = cfg.get("full_attn_idxs")
            full = range(n) if full is None else full
            types = ["full_attention" if i in full else "conv" for i in range(n)]
        tied = cfg.get("tie_embedding", cfg.get("tie_word_embeddings", True))
        return cls.config_class(
            **{**fields, "intermediate_size": ffn_width(cfg), "rms_norm_eps": float(cfg.get("norm_eps", 1e-5)),
               "tie_word_embeddings": bool(tied)},
            qk_norm=True, conv_layers=tuple(t == "conv" for t in types[:n]),
            conv_kernel=int(cfg.get("conv_L_cache", 3)), conv_bias=bool(cfg.get("conv_bias", False)))

    @classmethod
    def config_from_gguf(cls, meta: GGUFMeta, where: str):
        fields = gguf_fields(meta, cls.name)
        n = fields["num_layers"]
        meta.key("attention.head_count_kv", required=True)  # (a file without it is not LFM2's)
        kv = [int(h) for h in meta.per_layer("attention.head_count_kv", n)]  # 0 on a convolution's layers
        conv = tuple(h == 0 for h in kv)
        first_conv = conv.index(True) if any(conv) else 0
        return cls.config_class(
            **{**fields, "num_kv_heads": max(kv)}, qk_norm=True, conv_layers=conv,
            conv_kernel=int(meta.key("shortconv.l_cache", 3)),
            conv_bias=meta.has(f"blk.{first_conv}.shortconv.conv.bias"))

    @classmethod
    def global_weights(cls, config):
        out = super().global_weights(config)
        out["final_norm"] = norm(config.hidden_size, "model.embedding_norm.weight", "token_embd_norm.weight")
        return out

    # ------------------------------------------------------------ weights
    @classmethod
    def layer_weights(cls, c: Lfm2Config, i: int):
        hf, gg, d, f = f"model.layers.{i}", f"blk.{i}", c.hidden_size, c.intermediate_size
        out = {"attn_norm": norm(d, f"{hf}.operator_norm.weight", f"{gg}.attn_norm.weight"),
               "mlp_norm": norm(d, f"{hf}.ffn_norm.weight", f"{gg}.ffn_norm.weight"),
               "w_gate_up": Weight((d, 2 * f), ("embed", "mlp"),
                                   GateUp(tensor(f"{hf}.feed_forward.w1.weight", (f, d)),
                                          tensor(f"{hf}.feed_forward.w3.weight", (f, d))),
                                   GateUp(tensor(f"{gg}.ffn_gate.weight", (f, d)),
                                          tensor(f"{gg}.ffn_up.weight", (f, d))),
                                   quantize=True),
               "w_down": Weight((f, d), ("mlp", "embed"), tensor(f"{hf}.feed_forward.w2.weight", (d, f)),
                                tensor(f"{gg}.ffn_down.weight", (d, f)), quantize=True)}
        if c.conv_layers[i]:
            return {**out, **cls._conv_weights(c, f"{hf}.conv", f"{gg}.shortconv")}
        attn = attention_weights(c.replace(qk_norm=False), hf=f"{hf}.self_attn", gguf=gg)
        hd, q = c.head_dim, c.q_size
        attn["wo"] = Weight((q, d), ("heads", "embed"), tensor(f"{hf}.self_attn.out_proj.weight", (d, q)),
                            tensor(f"{gg}.attn_output.weight", (d, q)), quantize=True)
        attn["q_norm"] = Weight((hd,), ("head_dim",), tensor(f"{hf}.self_attn.q_layernorm.weight", (hd,)),
                                tensor(f"{gg}.attn_q_norm.weight", (hd,)), init="ones")
        attn["k_norm"] = Weight((hd,), ("head_dim",), tensor(f"{hf}.self_attn.k_layernorm.weight", (hd,)),
                                tensor(f"{gg}.attn_k_norm.weight", (hd,)), init="ones")
        return {**out, **attn}

    @classmethod
    def _conv_weights(cls, c: Lfm2Config, hf: str, gg: str) -> dict[str, Weight]:
        d, k = c.hidden_size, c.conv_kernel
        both = lambda name, shape, **kw: paired(f"{hf}.{name}", f"{gg}.{name}", shape, **kw)  # noqa: E731
        out = {}
        for j, part in enumerate(("b", "c", "x")):  # in_proj rows: B | C | x
            rows = (j * d, (j + 1) * d)
            out[f"w_{part}"] = Weight((d, d), ("embed", None), *both("in_proj.weight", (3 * d, d), rows=rows),
                                      quantize=True)
            if c.conv_bias:
                out[f"b_{part}"] = Weight((d,), (None,), *both("in_proj.bias", (3 * d,), rows=rows), init="zeros")
        squeezed = tensor(f"{gg}.conv.weight", (d, k), matrix=False)  # the converter's (D, K)
        out["conv"] = Weight((d, 1, k), (None, None, None), tensor(f"{hf}.conv.weight", (d, 1, k), matrix=False),
                             Mapped(squeezed, (d, 1, k), lambda w: w))
        out["w_out"] = Weight((d, d), (None, "embed"), *both("out_proj.weight", (d, d)), quantize=True)
        if c.conv_bias:
            out["conv_bias"] = Weight((d,), (None,), *both("conv.bias", (d,)), init="zeros")
            out["b_out"] = Weight((d,), ("embed",), *both("out_proj.bias", (d,)), init="zeros")
        return out

    # ------------------------------------------------------------ forward
    def layer(self, i, x, w, cache, ctx):
        c = self.config
        h = rms_norm(x, w["attn_norm"], c.rms_norm_eps)
        if c.conv_layers[i]:
            h, cache = self._short_conv(i, h, w, cache, ctx.positions)
        else:
            h, cache = attention(c, i, h, w, cache, ctx)
        x = x + h
        return x + mlp(rms_norm(x, w["mlp_norm"], c.rms_norm_eps), w), cache

    def _short_conv(self, i, x, w, cache, positions):
        c = self.config

        def project(part, h):  # (B, T, D)
            y = linear(h, w[f"w_{part}"], w.get(f"w_{part}_scale"))
            return y + w[f"b_{part}"].astype(y.dtype) if f"b_{part}" in w else y

        bx = project("b", x) * project("x", x)  # (B, T, D)
        kernel, bias = w["conv"][:, 0, :], w.get("conv_bias")  # (D, K), (D,)
        conv = short_conv_op(kernel, bias)
        y, cache = cache.recurrent(c.state_index(i), "conv", conv, (bx,), positions,
                                   (c.conv_kernel - 1, c.hidden_size))  # (B, T, D)
        return project("out", project("c", x) * y), cache
