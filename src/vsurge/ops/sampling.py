"""Token sampling inside the compiled step, every knob a per-row array.

Order (as vLLM/HF): logit bias -> repetition penalty (prompt + generated,
HF semantics) -> frequency/presence penalties (generated only) -> greedy
argmax if temperature == 0, else temperature -> top-k -> top-p -> min-p ->
inverse-CDF sampling with one uniform draw from each row's own key. Changing any value never
recompiles; the filters behind top-k/top-p/min-p only run when a row needs them, and nothing sorts the
whole vocabulary (a partial top-k, then a bisection where that does not decide).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from ..sampling.params import device_columns

_NEG_INF = -jnp.inf
TOP_LOGPROBS = 20  # most alternatives a request may ask for (OpenAI's limit)
CANDIDATES = 256  # tokens the filters look at before falling back to the whole vocabulary
CDF_BLOCK = 256  # vocabulary block of the two-level inverse CDF


def _from_params(cls, params_list, seeds):
    """params_list: SamplingParams per row; seeds: int per row (64-bit ok)."""
    columns = {name: np.asarray([getattr(p, name) for p in params_list], dtype) for name, dtype, _ in _COLUMNS}
    return cls(**columns, key_data=seed_key_data(seeds))


def _neutral(cls, batch: int):
    """Greedy rows with no penalties (padding rows of a bucket)."""
    columns = {name: np.full(batch, neutral, dtype) for name, dtype, neutral in _COLUMNS}
    return cls(**columns, key_data=np.zeros((batch, 2), np.uint32))


# Per-row sampling parameters, each (B,): one column per SamplingParams field declared with
# `device=` (temperature f32 0 = greedy, top_p, top_k i32 0 = off, min_p, the penalties), plus
# key_data (B, 2) uint32, the row's base PRNG key (from its seed). Built from the schema, so a new
# per-row knob is declared once, in sampling/params.py.
_COLUMNS = device_columns()
SamplingArrays = jax.tree_util.register_dataclass(dataclasses.make_dataclass(
    "SamplingArrays", [(name, jax.Array) for name, _, _ in _COLUMNS] + [("key_data", jax.Array)],
    namespace={"from_params": classmethod(_from_params), "neutral": classmethod(_neutral),
                                   "__module__": __name__}))


def seed_key_data(seeds) -> np.ndarray:
    """64-bit seeds -> (B, 2) uint32 threefry key data (the same seed always gives the same key)."""
    seeds = [int(s) & 0xFFFFFFFFFFFFFFFF for s in seeds]
    return np.asarray([[s >> 32, s & 0xFFFFFFFF] for s in seeds], np.uint32).reshape(len(seeds), 2)


def apply_penalties(logits, counts, prompt_mask, p: SamplingArrays):
    """logits (B, V) f32; counts (B, V) i32 generated-token counts; prompt_mask (B, V) bool."""
    generated = counts > 0
    seen = prompt_mask | generated
    rep = p.repetition_penalty[:, None]
    logits = jnp.where(seen, jnp.where(logits > 0, logits / rep, logits * rep), logits)
    logits = logits - p.frequency_penalty[:, None] * counts.astype(logits.dtype)
    return logits - p.presence_penalty[:, None] * generated.astype(logits.dtype)


def _keep_from_sorted(desc, p: SamplingArrays, log_norm):
    """desc (B, K) descending candidate values -> keep mask (B, K) for top-k / top-p / min-p.

    log_norm (B,): log of the softmax normalizer over the whole (top-k limited) distribution."""
    ranks = jnp.arange(desc.shape[-1])[None, :]
    k = jnp.where(p.top_k > 0, p.top_k, desc.shape[-1])
    in_k = ranks < k[:, None]  # top-k
    probs = jnp.where(in_k, jnp.exp(desc - log_norm[:, None]), 0.0)
    before = jnp.cumsum(probs, axis=-1) - probs  # mass strictly above each token
    keep = in_k & ((before < p.top_p[:, None]) | (ranks == 0))  # top-p, always keep the best
    keep &= probs >= p.min_p[:, None] * probs[:, :1]  # min-p, relative to the top token
    return keep, probs


def _threshold(desc, keep):
    """Smallest kept value per row (B, 1)."""
    return jnp.min(jnp.where(keep, desc, jnp.inf), axis=-1, keepdims=True)


_SIGN = np.uint32(0x80000000)


def _order_key(x):
    """float32 -> uint32 in the floats' order (-inf lowest, +inf highest; NaNs outside)."""
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    return jnp.where(bits & _SIGN, ~bits, bits | _SIGN)


def _from_order_key(key):
    return jax.lax.bitcast_convert_type(jnp.where(key & _SIGN, key & ~_SIGN, ~key), jnp.float32)


def _lowest_value_where(scaled, holds):
    """Per row, the smallest float v in [-inf, the row's max] for which `holds(v)` ((B, 1) -> (B,) bool; false
    below some point, true from it on, true at the max) is true: a bisection over the floats' bit order, 32
    halvings of a (B,) interval, each one pass over (B, V). Since the conditions below only change at the
    row's values, the answer is one of them (or -inf). scaled (B, V) -> (B, 1)."""
    hi = _order_key(jnp.max(scaled, axis=-1))  # (B,): holds
    lo = jnp.full_like(hi, _order_key(jnp.float32(-jnp.inf)) - 1)  # below -inf: never evaluated

    def halve(_, bounds):
        lo, hi = bounds
        open_ = hi - lo > 1
        mid = lo + (hi - lo) // 2
        ok = holds(_from_order_key(mid)[:, None])
        return jnp.where(open_ & ~ok, mid, lo), jnp.where(open_ & ok, mid, hi)

    _, hi = jax.lax.fori_loop(0, 32, halve, (lo, hi))
    return _from_order_key(hi)[:, None]


def _filter_exact(scaled, p: SamplingArrays):
    """Exact top-k / top-p / min-p over the whole vocabulary without sorting it (a TPU's sort of a (B, V) array
    took 12 of a decode program's 33 s of XLA compile; it was the fallback of every step program): each cut is a
    value found by bisection (`_lowest_value_where`), and the tokens kept are those at or above every cut, so
    tokens tied with the last one kept stay too. scaled (B, V) -> (B, V) with the rest -inf."""
    big = jnp.iinfo(jnp.int32).max
    k = jnp.where(p.top_k > 0, p.top_k, big)[:, None]  # (B, 1)
    # top-k: the k-th largest value, the lowest v with fewer than k values above it
    cut_k = _lowest_value_where(scaled, lambda v: jnp.sum(scaled > v, axis=-1) < k[:, 0])
    in_k = scaled >= cut_k
    e = jnp.where(in_k, jnp.exp(scaled - jnp.max(scaled, axis=-1, keepdims=True)), 0.0)
    probs = e / jnp.sum(e, axis=-1, keepdims=True)  # (B, V): over the top-k tokens
    # top-p: the lowest value with less than top_p of the mass strictly above it (the best token always)
    top_p = p.top_p[:, None]
    cut_p = _lowest_value_where(scaled, lambda v: jnp.sum(jnp.where(scaled > v, probs, 0.0), axis=-1) < top_p[:, 0])
    cut_p = jnp.where(top_p < 1.0, cut_p, -jnp.inf)
    keep = in_k & (scaled >= cut_p) & (probs >= p.min_p[:, None] * jnp.max(probs, axis=-1, keepdims=True))
    return jnp.where(keep, scaled, _NEG_INF)


def _filter(scaled, p: SamplingArrays, candidates: int = CANDIDATES):
    """Mask tokens outside top-k / top-p / min-p. scaled: (B, V) temperature-scaled logits.

    Decides on the `candidates` best tokens (a cheap partial sort); a row whose cut-off
    falls beyond them (top_k > candidates, or a very flat distribution) sends the whole
    batch through the exact whole-vocabulary filter instead. Either way the kept set is exact."""
    vocab = scaled.shape[-1]
    if candidates >= vocab:
        return _filter_exact(scaled, p)
    desc, _ = jax.lax.top_k(scaled, candidates)  # (B, C)
    in_k = jnp.arange(candidates)[None, :] < jnp.where(p.top_k > 0, p.top_k, candidates)[:, None]
    log_norm = jnp.where(p.top_k > 0, jax.nn.logsumexp(jnp.where(in_k, desc, _NEG_INF), axis=-1),
                         jax.nn.logsumexp(scaled, axis=-1))
    keep, probs = _keep_from_sorted(desc, p, log_norm)
    small_k = (p.top_k > 0) & (p.top_k <= candidates)
    cut_by_p = (p.top_p < 1.0) & (jnp.sum(probs, axis=-1) >= p.top_p)
    cut_by_min_p = (p.min_p > 0) & (probs[:, -1] < p.min_p * probs[:, 0])
    unfiltered = (p.top_k == 0) & (p.top_p >= 1.0) & (p.min_p <= 0)
    exact = small_k | cut_by_p | cut_by_min_p | unfiltered | (p.temperature <= 0)
    threshold = jnp.where(unfiltered[:, None], _NEG_INF, _threshold(desc, keep))
    fast = jnp.where(scaled >= threshold, scaled, _NEG_INF)
    return jax.lax.cond(jnp.all(exact), lambda: fast, lambda: _filter_exact(scaled, p))


def penalties_active(p: SamplingArrays) -> jax.Array:
    """() bool: some row uses a repetition, frequency or presence penalty."""
    return jnp.any((p.repetition_penalty != 1.0) | (p.frequency_penalty != 0.0) | (p.presence_penalty != 0.0))


def inverse_cdf(scaled, u):
    """The token whose cumulative probability first exceeds u, per row: scaled (B, V) f32 logits
    (-inf for filtered tokens), u (B,) in [0, 1) -> (B,) i32. Two levels, blocks of CDF_BLOCK tokens
    then the tokens of one block, each a cumulative sum by a triangular matmul (XLA:CPU's cumsum over
    the vocabulary is slow). Gumbel-max drew a random number and two logs per vocabulary entry:
    `benchmarks/sampling.py`, 32 rows of a 49k vocabulary at temperature 1, 25.2 -> 5.3 ms a call."""
    b, v = scaled.shape
    nb = -(-v // CDF_BLOCK)
    e = jnp.exp(scaled - jnp.max(scaled, axis=-1, keepdims=True))
    e = jnp.pad(e, ((0, 0), (0, nb * CDF_BLOCK - v))).reshape(b, nb, CDF_BLOCK)  # (B, nb, BLOCK)
    block_sums = jnp.sum(e, axis=-1)  # (B, nb)
    cumulative = jnp.matmul(block_sums, jnp.triu(jnp.ones((nb, nb), jnp.float32)), precision="highest")  # (B, nb)
    target = u * cumulative[:, -1]  # (B,)
    # the first block whose cumulative sum exceeds the target (rounding at the very top: the last
    # block holding any probability)
    last_block = nb - 1 - jnp.argmax(block_sums[:, ::-1] > 0, axis=-1)
    block = jnp.minimum(jnp.sum(cumulative <= target[:, None], axis=-1), last_block)  # (B,)
    before = jnp.take_along_axis(cumulative - block_sums, block[:, None], axis=-1)[:, 0]
    row = jnp.take_along_axis(e, block[:, None, None], axis=1)[:, 0]  # (B, BLOCK)
    within = jnp.matmul(row, jnp.triu(jnp.ones((CDF_BLOCK, CDF_BLOCK), jnp.float32)), precision="highest")
    last = CDF_BLOCK - 1 - jnp.argmax(row[:, ::-1] > 0, axis=-1)
    index = jnp.minimum(jnp.sum(within <= (target - before)[:, None], axis=-1), last)
    return (block * CDF_BLOCK + index).astype(jnp.int32)


def greedy_tokens(logits) -> jax.Array:
    """(B, V) -> (B,) i32: each row's first index of its largest value, as jnp.argmax, from two plain
    reductions (the max, then the smallest index holding it). XLA:CPU's argmax is a reduce over
    (value, index) pairs that it vectorizes poorly: `benchmarks/sampling.py`, 32 rows of a 49k
    vocabulary, greedy 3.7 -> 0.9 ms with AVX-512 (1.1 either way held to AVX2). A row holding a NaN
    still gets a token of the vocabulary (0 where nothing equals its max)."""
    v = logits.shape[-1]
    top = jnp.max(logits, axis=-1, keepdims=True)
    first = jnp.min(jnp.where(logits == top, jnp.arange(v, dtype=jnp.int32)[None, :], v), axis=-1)
    return jnp.where(first < v, first, 0).astype(jnp.int32)


def penalized_greedy(logits, counts, prompt_mask, rows, p: SamplingArrays, bitmask) -> jax.Array:
    """Greedy tokens after the allowed-token mask and the penalties: logits (R, V) f32; counts (S, V) i32
    and prompt_mask (S, V) bool of every slot; rows (R,) i32 each row's slot; p the rows' arrays;
    bitmask (R, ceil(V/32)) i32 -> (R,) i32. On CPU one C++ pass over each row (kernels/sampling.cc),
    elsewhere the same stages in XLA."""
    from .. import kernels
    from ..structured.bitmask import apply_token_bitmask

    if kernels.call_serves(logits.dtype, (jnp.float32,)):
        call = jax.ffi.ffi_call(kernels.GREEDY_TARGET, jax.ShapeDtypeStruct(rows.shape, jnp.int32),
                                vmap_method="sequential")
        f32 = [a.astype(jnp.float32) for a in (p.repetition_penalty, p.frequency_penalty, p.presence_penalty)]
        return call(logits, counts, prompt_mask, rows.astype(jnp.int32), *f32, bitmask.astype(jnp.int32))
    def adjusted(logits):  # (gathers each row's (V,) counts and prompt mask: skipped when nothing needs them)
        return greedy_tokens(apply_penalties(apply_token_bitmask(logits, bitmask), counts[rows], prompt_mask[rows], p))

    return jax.lax.cond(jnp.any(bitmask != -1) | penalties_active(p), adjusted, greedy_tokens, logits)


def draw_tokens(logits, p: SamplingArrays, steps):
    """Pick one token per row from (already biased / penalized) logits (B, V) f32.

    steps (B,) i32: tokens generated so far, folded into the row's key. Returns (B,) i32;
    temperature 0 is exactly argmax."""
    greedy = greedy_tokens(logits)

    def draw(logits):
        scaled = logits / jnp.where(p.temperature > 0, p.temperature, 1.0)[:, None]
        needs_filter = jnp.any((p.temperature > 0) & ((p.top_k > 0) | (p.top_p < 1.0) | (p.min_p > 0)))
        scaled = jax.lax.cond(needs_filter, _filter, lambda s, _: s, scaled, p)

        def uniform(key_data, step):
            key = jax.random.fold_in(jax.random.wrap_key_data(key_data, impl="threefry2x32"), step)
            return jax.random.uniform(key, (), jnp.float32)

        return inverse_cdf(scaled, jax.vmap(uniform)(p.key_data, steps))

    # An all-greedy batch skips the filters and the noise entirely.
    sampled = jax.lax.cond(jnp.any(p.temperature > 0), draw, lambda _: greedy, logits)
    return jnp.where(p.temperature > 0, sampled, greedy)


def sample(logits, counts, prompt_mask, p: SamplingArrays, steps, bias=None):
    """Bias, penalties, then one token per row.

    logits (B, V) f32, counts (B, V) i32, prompt_mask (B, V) bool, steps (B,) i32
    (tokens generated so far; folded into the row key), bias (B, V) f32 or None.
    Returns tokens (B,) i32.
    """
    if bias is not None:
        logits = logits + bias
    logits = jax.lax.cond(penalties_active(p), lambda l: apply_penalties(l, counts, prompt_mask, p), lambda l: l,
                          logits)
    return draw_tokens(logits, p, steps)


def token_logprobs(logits, tokens, num_top: int = TOP_LOGPROBS):
    """Log-probabilities of the model's own distribution (before penalties/temperature).

    logits (B, V), tokens (B,) -> chosen (B,), top_ids (B, K), top_values (B, K)."""
    logp = jax.nn.log_softmax(logits, axis=-1)
    chosen = jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]
    top_values, top_ids = jax.lax.top_k(logp, num_top)
    return chosen, top_ids.astype(jnp.int32), top_values
