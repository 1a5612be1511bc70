"""The Mamba-2 mixer the Mamba-2 hybrids share (Granite 4.0-H, Nemotron-H, Falcon-H1): its weights,
its state shapes and its forward pass on the recurrent-state contract (kv/recurrent.py).

    in_proj (I + Cv + H, D) = z | xBC | dt [+ bias: mamba_proj_bias]   conv1d (Cv, 1, K) [+ bias]
    dt_bias, A_log, D (H,)   norm (I,) gated RMSNorm in G groups   out_proj (D, I) [+ bias]
Cv = I + 2*G*N (x | B | C). dt is clamped to `time_step_limit` on prompts only (the references'
decode step does not clamp). State per sequence: the conv window (K-1, Cv) and the SSM state (H, P, N).
A family's config derives from Mamba2Config; `mamba2_fields` reads the mixer's keys as Granite 4.0-H's
and Falcon-H1's config.json spell them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dataclasses import dataclass

from ...config import ModelConfig, StateLayer
from ...errors import UnsupportedModelError
from ...kv.recurrent import by_length
from ...ops.linear import linear
from ...ops.ssd import grouped_gated_rms_norm, ssd_scan, ssd_step
from .blocks import short_conv_op
from .config_io import json_float
from .spec import Mapped, Weight, paired, tensor


@dataclass(frozen=True)
class Mamba2Config(ModelConfig):
    """The mixer's fields and the widths and state layout derived from them (a base of the family's
    config; its layer_kind says which layers run the mixer)."""

    mamba_heads: int = 0  # H
    mamba_head_dim: int = 0  # P
    mamba_groups: int = 1  # G
    mamba_state: int = 0  # N
    mamba_conv_kernel: int = 4  # K
    mamba_conv_bias: bool = True
    mamba_proj_bias: bool = False  # in_proj's bias
    mamba_out_bias: bool | None = None  # out_proj's bias; None: as mamba_proj_bias
    mamba_rms_norm: bool = True  # False: y * silu(z), no norm weight (Falcon-H1's option)
    mamba_norm_before_gate: bool = False
    time_step_limit: tuple[float, float] = (0.0, float("inf"))
    ssm_in_multiplier: float = 1.0  # scales the mixer's input (Falcon-H1's muP)
    ssm_multipliers: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0, 1.0)  # scale in_proj's z | x | B | C | dt

    @property
    def mamba_width(self) -> int:  # I
        return self.mamba_heads * self.mamba_head_dim

    @property
    def conv_width(self) -> int:  # Cv: x | B | C
        return self.mamba_width + 2 * self.mamba_groups * self.mamba_state

    @property
    def state_layout(self) -> tuple[StateLayer, ...]:
        layer = StateLayer((("conv", (self.mamba_conv_kernel - 1, self.conv_width)),
                            ("ssm", (self.mamba_heads, self.mamba_head_dim, self.mamba_state))))
        return (layer,) * len(self.recurrent_layers)


def mamba2_fields(cfg: dict, where: str, hidden_size: int) -> dict:
    """Mamba2Config's fields from config.json keys mamba_n_heads, mamba_d_head ("auto": the width over
    the heads), mamba_d_ssm or mamba_expand (the width), mamba_n_groups, mamba_d_state, mamba_d_conv,
    mamba_conv_bias, mamba_proj_bias and time_step_limit."""
    width = cfg.get("mamba_d_ssm") or int(cfg.get("mamba_expand", 2)) * hidden_size
    heads = int(cfg.get("mamba_n_heads", 128))
    head_dim = cfg.get("mamba_d_head", "auto")
    head_dim = width // heads if head_dim in (None, "auto") else int(head_dim)
    if heads * head_dim != width:
        raise UnsupportedModelError(f"{where}: mamba_n_heads x mamba_d_head must equal the mixer width {width}")
    limit = cfg.get("time_step_limit") or (0.0, float("inf"))
    return dict(mamba_heads=heads, mamba_head_dim=head_dim, mamba_groups=int(cfg.get("mamba_n_groups", 1)),
                mamba_state=int(cfg.get("mamba_d_state", 256)), mamba_conv_kernel=int(cfg.get("mamba_d_conv", 4)),
                mamba_conv_bias=bool(cfg.get("mamba_conv_bias", True)),
                mamba_proj_bias=bool(cfg.get("mamba_proj_bias", False)),
                time_step_limit=(json_float(limit[0]), json_float(limit[1])))


def mamba2_gguf_fields(meta) -> dict:
    """Mamba2Config's fields from a GGUF file (llama.cpp's converter): the ssm.* keys (inner_size the
    mixer's width, time_step_rank its heads) and which of the mixer's optional tensors it holds."""
    width, heads = int(meta.key("ssm.inner_size", required=True)), int(meta.key("ssm.time_step_rank", required=True))
    return dict(mamba_heads=heads, mamba_head_dim=width // heads, mamba_groups=int(meta.key("ssm.group_count", 1)),
                mamba_state=int(meta.key("ssm.state_size", required=True)),
                mamba_conv_kernel=int(meta.key("ssm.conv_kernel", 4)), mamba_conv_bias=meta.has_any("ssm_conv1d.bias"),
                mamba_proj_bias=meta.has_any("ssm_in.bias"), mamba_out_bias=meta.has_any("ssm_out.bias"))


def mamba2_weights(c, hf: str, gg: str | None = None) -> dict[str, Weight]:
    """The mixer's weights under `hf` (e.g. "model.layers.3.mamba") and, where the family has a GGUF
    form, `gg` ("blk.3"): llama.cpp's converter (Mamba2Model) names them ssm_*, stores the
    convolution squeezed to (Cv, K), A as -exp(A_log) and D as (H, 1), and the norm as (G, I/G)."""
    d, h, width, cv, k = c.hidden_size, c.mamba_heads, c.mamba_width, c.conv_width, c.mamba_conv_kernel
    in_shape = (width + cv + h, d)
    spans = {"z": (0, width), "xbc": (width, width + cv), "dt": (width + cv, width + cv + h)}
    both = lambda name, gguf_name, shape, **kw: paired(  # noqa: E731
        f"{hf}.{name}", gg and f"{gg}.{gguf_name}", shape, **kw)
    stored = lambda name, shape, model_shape, fn=lambda w: w: gg and Mapped(  # noqa: E731
        tensor(f"{gg}.{name}", shape, matrix=False), model_shape, fn)
    out = {}
    for part, (a, b) in spans.items():
        out[f"w_{part}"] = Weight((d, b - a), ("embed", None), *both("in_proj.weight", "ssm_in.weight", in_shape,
                                                                     rows=(a, b)), quantize=part != "dt")
        if c.mamba_proj_bias:
            out[f"b_{part}"] = Weight((b - a,), (None,), *both("in_proj.bias", "ssm_in.bias", (in_shape[0],),
                                                               rows=(a, b)), init="zeros")
    out.update({
        "conv": Weight((cv, 1, k), (None, None, None), tensor(f"{hf}.conv1d.weight", (cv, 1, k), matrix=False),
                       stored("ssm_conv1d.weight", (cv, k), (cv, 1, k))),
        "dt_bias": Weight((h,), (None,), *both("dt_bias", "ssm_dt.bias", (h,)), init="ones"),
        "A_log": Weight((h,), (None,), tensor(f"{hf}.A_log", (h,)),
                        stored("ssm_a", (h, 1), (h,), lambda a: np.log(-a.astype(np.float32))), init="zeros"),
        "D": Weight((h,), (None,), tensor(f"{hf}.D", (h,)), stored("ssm_d", (h, 1), (h,)), init="ones"),
        "w_out": Weight((width, d), (None, "embed"), *both("out_proj.weight", "ssm_out.weight", (d, width)),
                        quantize=True),
    })
    if c.mamba_rms_norm:
        g = c.mamba_groups
        out["mamba_norm"] = Weight((width,), (None,), tensor(f"{hf}.norm.weight", (width,)),
                                   stored("ssm_norm.weight", (g, width // g), (width,)), init="ones")
    if c.mamba_conv_bias:
        out["conv_bias"] = Weight((cv,), (None,), *both("conv1d.bias", "ssm_conv1d.bias", (cv,)), init="zeros")
    if c.mamba_proj_bias if c.mamba_out_bias is None else c.mamba_out_bias:
        out["b_out"] = Weight((d,), ("embed",), *both("out_proj.bias", "ssm_out.bias", (d,)), init="zeros")
    return out


def mamba2_mixer(c, i, x, w, cache, positions):
    """Layer i's Mamba-2 mixer on normed x (B, T, D) -> (out (B, T, D), cache); `c`: a Mamba2Config."""
    b, t, _ = x.shape
    h, p, g, n, width = c.mamba_heads, c.mamba_head_dim, c.mamba_groups, c.mamba_state, c.mamba_width
    index, f32 = c.state_index(i), jnp.float32

    x_in = x * c.ssm_in_multiplier if c.ssm_in_multiplier != 1.0 else x
    mz, mx, mb, mc, mdt = c.ssm_multipliers

    def project(part, multiplier=1.0):  # (B, T, width of the part)
        y = linear(x_in, w[f"w_{part}"], w.get(f"w_{part}_scale"))
        y = y + w[f"b_{part}"].astype(y.dtype) if f"b_{part}" in w else y
        return y if isinstance(multiplier, float) and multiplier == 1.0 else (y * multiplier).astype(y.dtype)

    xbc_multiplier = (1.0 if mx == mb == mc == 1.0 else  # per channel: x (I), B (G*N), C (G*N)
                      jnp.concatenate([jnp.full((width,), mx), jnp.full((g * n,), mb), jnp.full((g * n,), mc)]))
    z, xbc, dt = project("z", mz), project("xbc", xbc_multiplier), project("dt", mdt)  # (B,T,I), (B,T,Cv), (B,T,H)
    kernel, bias = w["conv"][:, 0, :], w.get("conv_bias")  # (Cv, K), (Cv,)
    conv = short_conv_op(kernel, bias)
    xbc, cache = cache.recurrent(index, "conv", conv, (xbc,), positions, (c.mamba_conv_kernel - 1, c.conv_width))
    xbc = jax.nn.silu(xbc.astype(f32))
    xs = xbc[..., :width].reshape(b, t, h, p)  # (B, T, H, P)
    B = xbc[..., width:width + g * n].reshape(b, t, g, n)  # (B, T, G, N)
    C = xbc[..., width + g * n:].reshape(b, t, g, n)  # (B, T, G, N)
    dt = jax.nn.softplus(dt.astype(f32) + w["dt_bias"].astype(f32))  # (B, T, H)
    A = -jnp.exp(w["A_log"].astype(f32))  # (H,)
    lo, hi = c.time_step_limit
    ssd = by_length(lambda xs, state, valid: ssd_scan(xs[0], jnp.clip(xs[1], lo, hi), A, *xs[2:], state, valid),
                    lambda xs, state, valid: ssd_step(xs[0], xs[1], A, *xs[2:], state, valid))
    y, cache = cache.recurrent(index, "ssm", ssd, (xs, dt, B, C), positions, (h, p, n))  # (B, T, H, P) f32
    y = y + w["D"].astype(f32)[:, None] * xs
    y = y.reshape(b, t, width)  # (B, T, I)
    if c.mamba_rms_norm:
        y = grouped_gated_rms_norm(y, w["mamba_norm"], z, g, c.rms_norm_eps,
                                   norm_before_gate=c.mamba_norm_before_gate)
    else:
        y = y * jax.nn.silu(z.astype(f32))
    out = linear(y.astype(x.dtype), w["w_out"], w.get("w_out_scale"))
    return (out + w["b_out"].astype(out.dtype) if "b_out" in w else out), cache
