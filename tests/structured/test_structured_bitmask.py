"""The packed token bitmask: the jax.numpy apply (what the compiled step runs) against numpy."""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from vsurge.structured.bitmask import (allocate_bitmask, allow_all, allowed_tokens, apply_token_bitmask,  # noqa: E402
                                       bitmask_words, set_tokens, token_allowed, unpack_bitmask)


def reference_apply(logits: np.ndarray, bitmask: np.ndarray) -> np.ndarray:
    """Token t of row b is allowed iff bit t % 32 of word t // 32 is set (plain Python loops)."""
    out = logits.copy()
    batch, vocab = logits.shape
    for b in range(batch):
        for t in range(vocab):
            word = int(bitmask[b, t // 32]) & 0xFFFFFFFF
            if not (word >> (t % 32)) & 1:
                out[b, t] = -np.inf
    return out


@pytest.mark.parametrize("vocab", [1, 31, 32, 33, 100, 1000])
def test_apply_matches_reference(vocab):
    rng = np.random.default_rng(vocab)
    batch = 3
    logits = rng.normal(size=(batch, vocab)).astype(np.float32)
    bitmask = rng.integers(-2**31, 2**31, size=(batch, bitmask_words(vocab)), dtype=np.int64).astype(np.int32)
    bitmask[2] = -1  # a free row
    got = np.asarray(jax.jit(apply_token_bitmask)(logits, bitmask))
    np.testing.assert_array_equal(got, reference_apply(logits, bitmask))
    np.testing.assert_array_equal(got[2], logits[2])


def test_apply_at_the_default_vocabulary_and_the_top_bit():
    vocab = 49152 + 7  # not a multiple of 32: the last word has padding bits
    logits = np.zeros((2, vocab), np.float32)
    bitmask = np.zeros((2, bitmask_words(vocab)), np.int32)
    set_tokens(bitmask[0], [0, 31, 32, 63, vocab - 1], True)  # bit 31 is the int32 sign bit
    bitmask[1] = -1
    got = np.asarray(apply_token_bitmask(jnp.asarray(logits), jnp.asarray(bitmask)))
    assert list(np.flatnonzero(np.isfinite(got[0]))) == [0, 31, 32, 63, vocab - 1]
    assert np.isfinite(got[1]).all()


def test_host_helpers():
    vocab = 70
    bitmask = allocate_bitmask(2, vocab)
    assert bitmask.shape == (2, 3) and bitmask.dtype == np.int32 and (bitmask == -1).all()
    bitmask[0] = 0
    set_tokens(bitmask[0], [3, 40, 69], True)
    assert list(allowed_tokens(bitmask[0], vocab)) == [3, 40, 69]
    assert token_allowed(bitmask[0], 40) and not token_allowed(bitmask[0], 41)
    set_tokens(bitmask[0], [40], False)
    assert list(allowed_tokens(bitmask[0], vocab)) == [3, 69]
    unpacked = unpack_bitmask(bitmask, vocab)
    assert unpacked.shape == (2, vocab) and unpacked[1].all() and unpacked[0].sum() == 2
    allow_all(bitmask, [0])
    assert (bitmask == -1).all()
