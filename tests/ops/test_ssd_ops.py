"""Mamba-2 SSD op (vsurge.ops.ssd) against a float64 numpy recurrence and transformers' Granite 4.0-H mixer.

The mixer comparison rebuilds GraniteMoeHybridMambaLayer's torch path around our op (in_proj split,
a plain causal conv written here, dt processing, D skip, gated norm, out_proj) with the module's own
weights, for a whole prompt and for decode steps driven through transformers' DynamicCache."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from vsurge.ops.ssd import grouped_gated_rms_norm, ssd_scan, ssd_step

TOL = dict(rtol=1e-4, atol=1e-4)


def _inputs(seed, b=2, T=37, H=4, G=2, P=3, N=5):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((b, T, H, P)).astype(np.float32)
    dt = rng.uniform(0.05, 1.0, (b, T, H)).astype(np.float32)
    A = -rng.uniform(0.2, 2.0, H).astype(np.float32)
    B = rng.standard_normal((b, T, G, N)).astype(np.float32)
    C = rng.standard_normal((b, T, G, N)).astype(np.float32)
    state = rng.standard_normal((b, H, P, N)).astype(np.float32)
    return x, dt, A, B, C, state


def _recurrence(x, dt, A, B, C, state):
    """Token by token in float64: S <- exp(dt A) S + dt x B^T; y = S C, group g serving H/G heads."""
    b, T, H, P = x.shape
    R = H // B.shape[2]
    s = state.astype(np.float64).copy()  # (b, H, P, N)
    y = np.zeros(x.shape)
    for t in range(T):
        for h in range(H):
            g = h // R
            d = dt[:, t, h, None, None]
            s[:, h] = s[:, h] * np.exp(d * A[h]) + d * x[:, t, h, :, None] * B[:, t, g, None, :]
            y[:, t, h] = np.einsum("bpn,bn->bp", s[:, h], C[:, t, g])
    return y, s


_scan = jax.jit(ssd_scan, static_argnames="chunk_size")
_step = jax.jit(ssd_step)
_norm = jax.jit(grouped_gated_rms_norm, static_argnums=(3, 4))


@pytest.mark.parametrize("T,chunk", [(37, 16), (5, 64)])
def test_scan_matches_recurrence(T, chunk):
    args = _inputs(0, T=T)
    y, final = _scan(*args, chunk_size=chunk)
    y_ref, final_ref = _recurrence(*args)
    assert y.dtype == final.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(y), y_ref, **TOL)
    np.testing.assert_allclose(np.asarray(final), final_ref, **TOL)


# The tests below reuse the (b=2, T=37, chunk 16) and (T=5, chunk 64) shapes above, so they add
# few compilations.
def test_split_prompt_carries_state():
    x, dt, A, B, C, state = _inputs(1, T=37)
    y, final = _scan(x, dt, A, B, C, state, chunk_size=16)
    cut = 21  # not on a chunk boundary
    y1, s1 = _scan(x[:, :cut], dt[:, :cut], A, B[:, :cut], C[:, :cut], state, chunk_size=16)
    y2, s2 = _scan(x[:, cut:], dt[:, cut:], A, B[:, cut:], C[:, cut:], s1, chunk_size=16)
    np.testing.assert_allclose(np.concatenate([y1, y2], axis=1), np.asarray(y), **TOL)
    np.testing.assert_allclose(np.asarray(s2), np.asarray(final), **TOL)


def test_right_padding_and_invalid_rows():
    x, dt, A, B, C, state = _inputs(2, T=37)
    n = 21
    y_ref, s_ref = _scan(x[:, :n], dt[:, :n], A, B[:, :n], C[:, :n], state, chunk_size=16)
    # Row 0 is right-padded with NaN garbage after n tokens; row 1 is fully invalid.
    xp, dtp, Bp, Cp = (t.copy() for t in (x, dt, B, C))
    for t in (xp, dtp, Bp, Cp):
        t[0, n:] = np.nan
    valid = np.zeros((2, 37), bool)
    valid[0, :n] = True
    y, s = _scan(xp, dtp, A, Bp, Cp, state, valid, chunk_size=16)
    np.testing.assert_allclose(np.asarray(y[0, :n]), np.asarray(y_ref[0]), **TOL)
    np.testing.assert_allclose(np.asarray(s[0]), np.asarray(s_ref[0]), **TOL)
    assert np.array_equal(np.asarray(s[1]), state[1])  # exactly unchanged
    assert np.isfinite(np.asarray(y[0, :n])).all()
    # The decode step with an invalid row leaves that row's state exactly too.
    _, s_step = _step(x[:, 0], dt[:, 0], A, B[:, 0], C[:, 0], state, np.array([True, False]))
    assert np.array_equal(np.asarray(s_step[1]), state[1])


def test_steps_equal_scan():
    x, dt, A, B, C, state = _inputs(3, T=5)
    y, final = _scan(x, dt, A, B, C, state, chunk_size=64)
    s, ys = jnp.asarray(state), []
    for t in range(x.shape[1]):
        y_t, s = _step(x[:, t], dt[:, t], A, B[:, t], C[:, t], s)
        ys.append(y_t)
    np.testing.assert_allclose(np.stack(ys, axis=1), np.asarray(y), **TOL)
    np.testing.assert_allclose(np.asarray(s), np.asarray(final), **TOL)


# --- transformers' Granite 4.0-H mixer ---------------------------------------------------------

from transformers import DynamicCache, GraniteMoeHybridConfig  # noqa: E402
from transformers.models.granitemoehybrid.modeling_granitemoehybrid import (  # noqa: E402
    GraniteMoeHybridMambaLayer,
    GraniteMoeHybridRMSNormGated,
)


@pytest.fixture(scope="module")
def mixer():
    torch.manual_seed(0)
    cfg = GraniteMoeHybridConfig(
        hidden_size=16, mamba_expand=2, mamba_n_heads=8, mamba_n_groups=2, mamba_d_state=8,
        mamba_d_conv=4, mamba_chunk_size=8, num_hidden_layers=1, num_attention_heads=2,
        time_step_limit=(0.0, 1.0), layer_types=["linear_attention"],
    )
    layer = GraniteMoeHybridMambaLayer(cfg, layer_idx=0).eval()
    with torch.no_grad():  # move the parameters off their init values so each one matters
        layer.A_log.copy_(torch.rand(8) * 2 - 1)
        layer.D.copy_(torch.randn(8))
        layer.dt_bias.copy_(torch.randn(8) * 0.7)
        layer.norm.weight.copy_(1 + 0.3 * torch.randn(32))
        layer.conv1d.bias.copy_(0.3 * torch.randn(layer.conv_dim))
    w = {k: v.detach().numpy() for k, v in layer.state_dict().items()}
    return cfg, layer, w


def _jax_mixer_pieces(cfg, w, hs):
    """hs (b, T, D) -> (gate z (b, T, I), raw xBC (b, T, conv_dim), raw dt (b, T, H))."""
    proj = hs @ w["in_proj.weight"].T
    inner = cfg.mamba_expand * cfg.hidden_size
    conv_dim = inner + 2 * cfg.mamba_n_groups * cfg.mamba_d_state
    return proj[..., :inner], proj[..., inner:inner + conv_dim], proj[..., inner + conv_dim:]


def _conv_silu(w, xbc):
    """Causal depthwise conv + silu over time: xbc (b, T, C) with zero history -> (b, T, C)."""
    kernel = w["conv1d.weight"][:, 0]  # (C, K)
    K, T = kernel.shape[1], xbc.shape[1]
    padded = np.pad(xbc, ((0, 0), (K - 1, 0), (0, 0)))
    out = sum(padded[:, k:k + T] * kernel[:, k] for k in range(K)) + w["conv1d.bias"]
    return out / (1 + np.exp(-out))  # silu


def _ssm_args(cfg, w, xbc, dt_raw, clamp=True):
    """Activated xBC (..., conv_dim), raw dt (..., H) -> x (..., H, P), dt, A, B, C (..., G, N).

    clamp=False for decode: the reference's single-token path (like mamba_ssm's step) applies
    softplus(dt + dt_bias) but not time_step_limit."""
    inner, G, N = cfg.mamba_expand * cfg.hidden_size, cfg.mamba_n_groups, cfg.mamba_d_state
    x = xbc[..., :inner].reshape(*xbc.shape[:-1], cfg.mamba_n_heads, cfg.mamba_d_head)
    B = xbc[..., inner:inner + G * N].reshape(*xbc.shape[:-1], G, N)
    C = xbc[..., inner + G * N:].reshape(*xbc.shape[:-1], G, N)
    dt = np.logaddexp(0.0, dt_raw + w["dt_bias"])  # softplus
    if clamp:
        dt = np.clip(dt, *cfg.time_step_limit)
    A = -np.exp(w["A_log"])
    return x, dt, A, B, C


def _finish(cfg, w, y, x, z):
    """SSD output y (..., H, P) + D skip, gated norm with z, out_proj -> (..., D)."""
    y = np.asarray(y) + w["D"][:, None] * x
    y = y.reshape(*y.shape[:-2], -1)
    y = _norm(y, w["norm.weight"], z, cfg.mamba_n_groups, cfg.rms_norm_eps)
    return np.asarray(y) @ w["out_proj.weight"].T


def _zero_state(cfg, b):
    return jnp.zeros((b, cfg.mamba_n_heads, cfg.mamba_d_head, cfg.mamba_d_state), jnp.float32)


def test_mixer_prompt_matches_transformers(mixer):
    cfg, layer, w = mixer
    hs = np.random.default_rng(4).standard_normal((2, 21, 16)).astype(np.float32)
    with torch.no_grad():
        ref = layer(torch.from_numpy(hs))  # no cache, eval mode: the pure torch chunked path
    z, xbc, dt_raw = _jax_mixer_pieces(cfg, w, hs)
    x, dt, A, B, C = _ssm_args(cfg, w, _conv_silu(w, xbc), dt_raw)
    y, _ = _scan(x, dt, A, B, C, _zero_state(cfg, 2), chunk_size=cfg.mamba_chunk_size)
    np.testing.assert_allclose(_finish(cfg, w, y, x, z), ref.numpy(), **TOL)


def test_mixer_decode_matches_transformers_cache(mixer):
    cfg, layer, w = mixer
    rng = np.random.default_rng(5)
    prompt = rng.standard_normal((2, 21, 16)).astype(np.float32)
    tokens = rng.standard_normal((2, 3, 16)).astype(np.float32)
    cache = DynamicCache(config=cfg)
    with torch.no_grad():
        ref_prompt = layer(torch.from_numpy(prompt), cache=cache).numpy()
        ref_state = cache.get_recurrent_state(0).clone().numpy()
        ref_steps = [layer(torch.from_numpy(tokens[:, i:i + 1]), cache=cache).numpy() for i in range(3)]
    # The cache holds the raw (pre-conv) xBC of the last K tokens and the float32 SSM state.
    assert cache.get_conv_state(0).shape == (2, layer.conv_dim, cfg.mamba_d_conv)
    assert cache.get_recurrent_state(0).shape == (2, 8, cfg.mamba_d_head, cfg.mamba_d_state)

    z, xbc, dt_raw = _jax_mixer_pieces(cfg, w, prompt)
    x, dt, A, B, C = _ssm_args(cfg, w, _conv_silu(w, xbc), dt_raw)
    y, state = _scan(x, dt, A, B, C, _zero_state(cfg, 2), chunk_size=cfg.mamba_chunk_size)
    np.testing.assert_allclose(_finish(cfg, w, y, x, z), ref_prompt, **TOL)
    np.testing.assert_allclose(np.asarray(state), ref_state, **TOL)

    history = xbc  # raw xBC so far; the conv of the newest token only needs its last K entries
    for i in range(3):
        z, xbc_t, dt_raw = _jax_mixer_pieces(cfg, w, tokens[:, i])
        history = np.concatenate([history, xbc_t[:, None]], axis=1)
        act = _conv_silu(w, history[:, -cfg.mamba_d_conv:])[:, -1]
        x, dt, A, B, C = _ssm_args(cfg, w, act, dt_raw, clamp=False)
        y, state = _step(x, dt, A, B, C, state)
        np.testing.assert_allclose(_finish(cfg, w, y, x, z), ref_steps[i][:, 0], **TOL)
    np.testing.assert_allclose(np.asarray(state), cache.get_recurrent_state(0).numpy(), **TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gated_norm_matches_transformers(dtype):
    torch.manual_seed(1)
    norm = GraniteMoeHybridRMSNormGated(32, group_size=16, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(32))
    norm = norm.to(dtype)
    x, gate = torch.randn(3, 5, 32).to(dtype), torch.randn(3, 5, 32).to(dtype)
    with torch.no_grad():
        ref = norm(x, gate).float().numpy()
    jdtype = jnp.bfloat16 if dtype == torch.bfloat16 else jnp.float32
    x, weight, gate = (jnp.asarray(t.detach().float().numpy()).astype(jdtype) for t in (x, norm.weight, gate))
    out = _norm(x, weight, gate, 2, 1e-6)
    assert out.dtype == jdtype
    tol = TOL if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(np.asarray(out.astype(jnp.float32)), ref, **tol)
