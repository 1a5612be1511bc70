"""Shared pieces of the structured-output tests: the default tokenizer, and random walks
through a grammar that stand in for a model sampling under a mask."""

from __future__ import annotations

import os
from functools import lru_cache

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402

from vsurge.structured.bitmask import allocate_bitmask, allowed_tokens  # noqa: E402

STRUCTURAL_CHARS = set('"{}[],:.-0123456789 ')


@lru_cache(maxsize=1)
def processor():
    """The default model's processor (tokenizer only: no weights are read)."""
    from vsurge.loading import load_processor

    return load_processor("default")


@lru_cache(maxsize=1)
def structural_tokens() -> np.ndarray:
    """Short tokens made of JSON punctuation, digits and spaces (sorted ids)."""
    p = processor()
    ids = [i for i in range(p.vocab_size)
           if 0 < len(text := p.decode([i])) <= 3 and set(text) <= STRUCTURAL_CHARS]
    return np.asarray(sorted(ids))


def random_walk(matcher, rng: np.random.Generator, max_steps: int = 600) -> list[int]:
    """Sample allowed tokens until the matcher finishes; returns every accepted token.

    Half the steps sample uniformly among all allowed tokens; the other half uniformly
    among the allowed short punctuation/digit tokens. Uniform over 49k tokens alone
    almost never closes a string (one allowed token in thousands), so walks would not end.
    Every step also checks that the row is never empty and the matcher takes what it allowed."""
    vocab = matcher.compiled.vocab_size
    bitmask = allocate_bitmask(1, vocab)
    prefer = structural_tokens()
    tokens: list[int] = []
    for _ in range(max_steps):
        matcher.fill_bitmask(bitmask, 0)
        allowed = allowed_tokens(bitmask[0], vocab)
        assert allowed.size, "a row with no allowed token"
        preferred = np.intersect1d(allowed, prefer, assume_unique=True)
        pool = preferred if preferred.size and rng.random() < 0.5 else allowed
        token = int(rng.choice(pool))
        assert matcher.accept(token), matcher.error
        tokens.append(token)
        if matcher.is_finished:
            return tokens
    raise AssertionError(f"the walk did not finish in {max_steps} steps")


def walk_text(matcher, seed: int, max_steps: int = 600) -> str:
    """The text of a random walk, end token removed."""
    tokens = random_walk(matcher, np.random.default_rng(seed), max_steps)
    ends = set(matcher.end_token_ids)
    return processor().decode([t for t in tokens if t not in ends])


def assert_tokens_allowed(matcher, tokens) -> None:
    """Every token of a valid output is in the mask at its step (masks are complete, not
    just safe: a masked valid token would skew what the model may write)."""
    p = processor()
    bitmask = allocate_bitmask(1, matcher.compiled.vocab_size)
    for i, token in enumerate(tokens):
        matcher.fill_bitmask(bitmask, 0)
        assert (int(bitmask[0, token // 32]) >> (token % 32)) & 1, \
            f"token {i} {p.decode([token])!r} of {p.decode(tokens)!r} is masked"
        assert matcher.accept(token), matcher.error
