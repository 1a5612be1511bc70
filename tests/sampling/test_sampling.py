"""Every sampling knob against a NumPy implementation of its formula, on fixed logits."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vsurge.ops.sampling import (SamplingArrays, _filter, _filter_exact, apply_penalties, inverse_cdf, sample,
                                 seed_key_data)
from vsurge.sampling.params import SamplingParams

V = 12


def arrays(**overrides) -> SamplingArrays:
    """Per-row arrays for 3 rows; overrides give per-row lists."""
    rows = 3
    base = dict(temperature=[1.0] * rows, top_p=[1.0] * rows, top_k=[0] * rows, min_p=[0.0] * rows,
                presence_penalty=[0.0] * rows, frequency_penalty=[0.0] * rows, repetition_penalty=[1.0] * rows)
    base.update(overrides)
    params = [SamplingParams(**{k: v[i] for k, v in base.items()}) for i in range(rows)]
    return SamplingArrays.from_params(params, seeds=[11, 22, 33])


def fixed_logits(rows=3):
    rng = np.random.default_rng(0)
    return rng.normal(0, 2, (rows, V)).astype(np.float32)


# ---------------------------------------------------------------- NumPy references
def np_penalties(logits, counts, prompt_mask, rep, freq, pres):
    out = logits.copy()
    seen = prompt_mask | (counts > 0)
    for b in range(logits.shape[0]):
        for v in range(logits.shape[1]):
            if seen[b, v]:  # HF RepetitionPenaltyLogitsProcessor
                out[b, v] = out[b, v] / rep[b] if out[b, v] > 0 else out[b, v] * rep[b]
            out[b, v] -= freq[b] * counts[b, v] + pres[b] * (counts[b, v] > 0)
    return out


def np_keep_mask(scaled, top_k, top_p, min_p):
    """Which tokens survive top-k, then top-p (over the top-k renormalized), then min-p."""
    keep = np.zeros_like(scaled, bool)
    for b, row in enumerate(scaled):
        order = np.argsort(-row, kind="stable")
        k = top_k[b] if top_k[b] > 0 else len(row)
        allowed = order[:k]
        probs = np.exp(row[allowed] - row[allowed].max())
        probs /= probs.sum()
        cum_before = np.cumsum(probs) - probs
        allowed = [t for t, c, p in zip(allowed, cum_before, probs) if (c < top_p[b] or t == order[0])
                   and p >= min_p[b] * probs[0]]
        keep[b, allowed] = True
    return keep


# ---------------------------------------------------------------- tests
def test_penalties_match_formula_over_whole_history():
    logits = fixed_logits()
    counts = np.zeros((3, V), np.int32)
    counts[0, [1, 2, 2]] = [1, 3, 3]
    counts[1, 5] = 2
    counts[2, [0, 7]] = 1
    prompt = np.zeros((3, V), bool)
    prompt[:, [3, 4]] = True  # prompt tokens count for repetition only
    p = arrays(repetition_penalty=[1.3, 1.0, 0.8], frequency_penalty=[0.5, -0.4, 0.0],
               presence_penalty=[0.0, 1.5, -1.0])
    got = apply_penalties(jnp.asarray(logits), jnp.asarray(counts), jnp.asarray(prompt), p)
    want = np_penalties(logits, counts, prompt, [1.3, 1.0, 0.8], [0.5, -0.4, 0.0], [0.0, 1.5, -1.0])
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("top_k,top_p,min_p", [
    ([0, 3, 1], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]),
    ([0, 0, 0], [0.5, 0.9, 0.05], [0.0, 0.0, 0.0]),
    ([0, 0, 0], [1.0, 1.0, 1.0], [0.1, 0.5, 0.9]),
    ([4, 6, 2], [0.7, 0.3, 1.0], [0.2, 0.0, 0.3]),
])
@pytest.mark.parametrize("candidates", [None, 3, 6, V])  # whole vocabulary; partial sort with and without fallback
def test_filters_keep_exactly_the_reference_set(top_k, top_p, min_p, candidates):
    scaled = fixed_logits() / 0.7
    p = arrays(top_k=top_k, top_p=top_p, min_p=min_p)
    filtered = _filter_exact(jnp.asarray(scaled), p) if candidates is None else \
        _filter(jnp.asarray(scaled), p, candidates=candidates)
    np.testing.assert_array_equal(np.isfinite(np.asarray(filtered)), np_keep_mask(scaled, top_k, top_p, min_p))


def test_exact_filter_keeps_ties_with_the_last_kept_token():
    """The whole-vocabulary filter cuts at a value: tokens tied with the last one kept stay too."""
    scaled = np.full((3, V), -4.0, np.float32)
    scaled[:, :5] = [5.0, 3.0, 3.0, 1.0, 1.0]
    p = arrays(top_k=[2, 0, 0], top_p=[1.0, 0.8, 1.0], min_p=[0.0, 0.0, np.exp(-2.0) * 0.999])
    kept = np.isfinite(np.asarray(_filter_exact(jnp.asarray(scaled), p)))
    # top-k 2 reaches the first 3; top-p 0.8 needs the first 3 (5 alone is ~0.79 of the mass);
    # min-p keeps logits >= 5 - 2
    assert [np.flatnonzero(row).tolist() for row in kept] == [[0, 1, 2], [0, 1, 2], [0, 1, 2]]


@pytest.mark.parametrize("scale", [4.0, 0.05])  # peaked: decided on the candidates; flat: the whole-vocabulary fallback
def test_partial_sort_filter_on_a_real_sized_vocabulary(scale):
    rng = np.random.default_rng(1)
    scaled = (rng.normal(0, scale, (3, 5000))).astype(np.float32)
    top_k, top_p, min_p = [0, 300, 40], [0.9, 1.0, 0.95], [0.0, 0.05, 0.0]
    p = arrays(top_k=top_k, top_p=top_p, min_p=min_p)
    got = np.isfinite(np.asarray(jax.jit(_filter)(jnp.asarray(scaled), p)))
    np.testing.assert_array_equal(got, np_keep_mask(scaled, top_k, top_p, min_p))


@pytest.mark.parametrize("seed", range(6))
def test_whole_vocabulary_filter_on_random_rows_with_masked_tokens(seed):
    """The bisection filter against the sorted reference: random knobs (top_k beyond the candidates too), peaked
    and flat rows, and tokens masked to -inf (logit bias, structured outputs)."""
    rng = np.random.default_rng(seed)
    rows, vocab = 3, 3000
    scaled = (rng.normal(0, rng.choice([0.05, 1.0, 6.0]), (rows, vocab))).astype(np.float32)
    scaled[rng.random((rows, vocab)) < 0.1] = -np.inf
    top_k = rng.choice([0, 1, 7, 300, 2999, 5000], rows).tolist()
    top_p = rng.choice([1.0, 0.95, 0.5, 0.01], rows).tolist()
    min_p = rng.choice([0.0, 0.02, 0.5], rows).tolist()
    p = arrays(top_k=top_k, top_p=top_p, min_p=min_p)
    got = np.isfinite(np.asarray(jax.jit(_filter_exact)(jnp.asarray(scaled), p)))
    want = np_keep_mask(np.where(np.isfinite(scaled), scaled, -1e30), top_k, top_p, min_p) & np.isfinite(scaled)
    np.testing.assert_array_equal(got, want)


def test_no_program_sorts_the_whole_vocabulary():
    """Sampling compiles without a sort of (B, V) (a TPU's XLA took 12 s of a step program's 33 s on it)."""
    rows, vocab = 4, 1000
    logits = jax.ShapeDtypeStruct((rows, vocab), jnp.float32)
    steps = jax.ShapeDtypeStruct((rows,), jnp.int32)
    p = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), SamplingArrays.neutral(rows))
    text = jax.jit(sample).lower(logits, jax.ShapeDtypeStruct((rows, vocab), jnp.int32),
                                 jax.ShapeDtypeStruct((rows, vocab), jnp.bool_), p, steps).as_text()
    assert "chlo.top_k" in text and "stablehlo.sort" not in text  # (the partial top-k stays)


def test_greedy_is_exact_argmax_with_penalties():
    logits = fixed_logits()
    counts = np.zeros((3, V), np.int32)
    best = logits.argmax(-1)
    counts[np.arange(3), best] = 1
    p = arrays(temperature=[0.0, 0.0, 0.0], repetition_penalty=[1.0, 3.0, 1.0], presence_penalty=[0.0, 0.0, 2.0])
    tokens = sample(jnp.asarray(logits), jnp.asarray(counts), jnp.zeros((3, V), bool), p, jnp.zeros(3, jnp.int32))
    want = np_penalties(logits, counts, np.zeros((3, V), bool), [1.0, 3.0, 1.0], [0, 0, 0], [0, 0, 2.0]).argmax(-1)
    np.testing.assert_array_equal(np.asarray(tokens), want)
    assert tokens[0] == best[0]  # no penalty: the plain argmax


def test_sampled_frequencies_follow_the_filtered_softmax():
    logits = fixed_logits(1)
    p = SamplingArrays.from_params([SamplingParams(temperature=0.8, top_k=5, top_p=0.9)], seeds=[7])
    draws = 6000
    step = jax.jit(jax.vmap(lambda s: sample(jnp.asarray(logits), jnp.zeros((1, V), jnp.int32),
                                             jnp.zeros((1, V), bool), p, s[None])[0]))
    tokens = np.asarray(step(jnp.arange(draws, dtype=jnp.int32)))
    scaled = logits / 0.8
    keep = np_keep_mask(scaled, [5], [0.9], [0.0])[0]
    probs = np.where(keep, np.exp(scaled[0] - scaled[0].max()), 0)
    probs /= probs.sum()
    freq = np.bincount(tokens, minlength=V) / draws
    assert set(np.flatnonzero(freq)) <= set(np.flatnonzero(keep))
    np.testing.assert_allclose(freq, probs, atol=0.025)  # ~4 sigma at 6000 draws


def test_inverse_cdf_across_blocks_with_empty_tokens_and_blocks():
    """The two-level draw over a vocabulary of several 256-token blocks, not a multiple of 256, with
    the mass on block edges and one whole block empty: frequencies follow the probabilities, a
    zero-probability token is never drawn, and u at 0 / just under 1 gives the first / last kept one."""
    v, rows = 900, 20000
    probs = np.zeros(v)
    probs[[0, 255, 512, 767, 899]] = [0.1, 0.25, 0.3, 0.05, 0.3]  # block 1 (256-511) empty
    logits = np.where(probs > 0, np.log(np.maximum(probs, 1e-30)), -np.inf).astype(np.float32)
    u = np.random.default_rng(0).random(rows, dtype=np.float32)
    tokens = np.asarray(jax.jit(inverse_cdf)(jnp.broadcast_to(jnp.asarray(logits), (rows, v)), jnp.asarray(u)))
    freq = np.bincount(tokens, minlength=v) / rows
    assert set(np.flatnonzero(freq)) <= set(np.flatnonzero(probs))
    np.testing.assert_allclose(freq, probs, atol=0.015)  # ~4.5 sigma at 20000 draws
    edges = np.asarray(inverse_cdf(jnp.asarray(np.stack([logits, logits])), jnp.asarray([0.0, 1.0 - 2**-24])))
    assert edges.tolist() == [0, 899]


def test_seeds_are_reproducible_and_per_row():
    params = [SamplingParams(temperature=1.0)] * 3
    p = SamplingArrays.from_params(params, seeds=[5, 5, 6])
    # uniform logits: the row's key alone decides the token
    run = jax.jit(lambda steps: sample(jnp.zeros((3, V)), jnp.zeros((3, V), jnp.int32), jnp.zeros((3, V), bool),
                                       p, steps))
    a = np.asarray([run(jnp.full((3,), s, jnp.int32)) for s in range(20)])
    b = np.asarray([run(jnp.full((3,), s, jnp.int32)) for s in range(20)])
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a[:, 0], a[:, 1])  # same seed, same stream
    assert (a[:, 0] != a[:, 2]).any()  # another seed, another stream
    assert seed_key_data([2**63 - 1]).shape == (1, 2)  # int64 seeds fit


def test_changing_parameters_does_not_recompile():
    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda name, *_, **__: compiles.append(name) if name == "/jax/core/compile/backend_compile_duration" else None)
    run = jax.jit(sample)
    logits = jnp.asarray(fixed_logits())
    zeros, mask = jnp.zeros((3, V), jnp.int32), jnp.zeros((3, V), bool)
    run(logits, zeros, mask, arrays(), jnp.zeros(3, jnp.int32)).block_until_ready()
    before = len(compiles)
    for kw in [dict(temperature=[0.0, 0.5, 2.0]), dict(top_k=[1, 2, 3], top_p=[0.5, 0.6, 0.7]),
               dict(min_p=[0.5, 0.1, 0.0], repetition_penalty=[2.0, 1.1, 0.5]),
               dict(presence_penalty=[1.0, -1.0, 2.0], frequency_penalty=[2.0, 0.3, -2.0])]:
        run(logits, zeros, mask, arrays(**kw), jnp.ones(3, jnp.int32)).block_until_ready()
    assert len(compiles) == before


@pytest.mark.parametrize("kwargs,message", [
    (dict(temperature=-0.1), "temperature must be non-negative"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
    (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
    (dict(top_k=-2), "top_k must be 0 \\(disable\\), or at least 1"),
    (dict(min_p=1.5), r"min_p must be in \[0, 1\]"),
    (dict(presence_penalty=2.5), r"presence_penalty must be in \[-2, 2\]"),
    (dict(frequency_penalty=-3), r"frequency_penalty must be in \[-2, 2\]"),
    (dict(repetition_penalty=0.0), "repetition_penalty must be in"),
    (dict(max_tokens=0), "max_tokens must be at least 1"),
    (dict(stop=["ok", ""]), "stop cannot contain an empty string"),
    (dict(seed=2**64), "seed must be an integer in"),
    (dict(n=0), "n must be at least 1"),
    (dict(logprobs=21), r"logprobs must be in \[0, 20\]"),
    (dict(temperature=float("nan")), "temperature must be non-negative"),
])
def test_invalid_values_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_top_k_minus_one_means_off_and_stop_string_is_listified():
    p = SamplingParams(top_k=-1, stop="END")
    assert p.top_k == 0 and p.stop == ["END"]


def test_greedy_tokens_is_argmax_with_ties_and_masked_rows():
    """The two-reduction argmax (ops/sampling.greedy_tokens) picks what jnp.argmax picks: the first of tied
    maxima, index 0 of an all -inf row; a row with a NaN still gets a token of the vocabulary."""
    from vsurge.ops.sampling import greedy_tokens

    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, (6, 1000)).astype(np.float32)
    logits[1, [7, 300, 999]] = 50.0  # ties: the first
    logits[2] = -np.inf  # everything masked
    logits[3, 999] = 60.0  # the last entry
    logits[4, :] = logits[4, 0]  # a flat row
    want = np.argmax(logits, axis=-1)
    np.testing.assert_array_equal(np.asarray(jax.jit(greedy_tokens)(jnp.asarray(logits))), want)
    assert want[1] == 7 and want[2] == 0 and want[3] == 999
    logits[5, 10] = np.nan
    assert 0 <= int(greedy_tokens(jnp.asarray(logits))[5]) < 1000


def test_the_one_pass_greedy_kernel_equals_the_xla_stages(monkeypatch):
    """ops/sampling.penalized_greedy on CPU (kernels/sampling.cc) gives what the XLA stages give (mask,
    penalties, then greedy_tokens), over slots in any order, a vocabulary of no whole 8-lane vector, tied
    maxima across lanes, +inf, an all-masked row, a NaN row (some token of the vocabulary either way:
    XLA's max may or may not carry the NaN), and the neutral values that leave the logits as they were."""
    from vsurge import kernels
    from vsurge.ops.sampling import greedy_tokens, penalized_greedy
    from vsurge.structured.bitmask import apply_token_bitmask

    if not kernels.available():
        pytest.skip(kernels.unavailable_reason())
    rng = np.random.default_rng(3)
    rows, slots, vocab = 8, 5, 1003
    logits = rng.normal(0, 3, (rows, vocab)).astype(np.float32)
    logits[1, [5, 13, 998]] = 40.0  # tied: lanes 5 and 5 of two vectors, and the tail
    logits[2, [6, 3]] = 45.0  # tied in different lanes, the later lane first in the row
    logits[3, 500] = np.inf
    logits[5, 77] = np.nan
    counts = rng.integers(0, 3, (slots, vocab)).astype(np.int32) * (rng.random((slots, vocab)) < 0.1)
    prompt_mask = rng.random((slots, vocab)) < 0.05
    slot_of = np.array([4, 0, 2, 2, 1, 3, 0, 4], np.int32)
    bitmask = np.full((rows, -(-vocab // 32)), -1, np.int32)
    bitmask[4] = 0  # everything masked
    bitmask[6, :4] = rng.integers(-2**31, 2**31 - 1, 4, dtype=np.int64).astype(np.int32)
    p = arrays(repetition_penalty=[1.3, 1.0, 1.0], frequency_penalty=[0.5, 0.0, 0.0],
               presence_penalty=[0.2, 0.0, 0.0])
    p = jax.tree.map(lambda a: jnp.asarray(np.concatenate([a, a, a[:2]])), p)  # 8 rows: penalized, neutral x2
    args = tuple(jnp.asarray(a) for a in (logits, counts, prompt_mask, slot_of)) + (p, jnp.asarray(bitmask))
    got = np.asarray(jax.jit(penalized_greedy)(*args))
    monkeypatch.setattr(kernels, "call_serves", lambda *a: False)
    want = np.asarray(jax.jit(lambda *a: penalized_greedy(*a))(*args))  # (a new function: traced anew)
    others = np.arange(rows) != 5
    np.testing.assert_array_equal(got[others], want[others])
    assert got[4] == 0 and got[3] == 500 and 0 <= got[5] < vocab and 0 <= want[5] < vocab
    plain = np.asarray(greedy_tokens(apply_token_bitmask(jnp.asarray(logits), jnp.asarray(bitmask))))
    assert got[1] == plain[1] == 5 and got[2] == plain[2] == 3  # neutral rows: the first of the tied maxima
