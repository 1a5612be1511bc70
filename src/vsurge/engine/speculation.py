"""Prompt-lookup (n-gram) speculative decoding: draft tokens copied from earlier in the sequence.

A decoding sequence whose last n tokens (n = 3, 2, 1) appeared before proposes
the tokens that followed them last time. The step then runs the sequence's last
token and its drafts as separate decode rows at consecutive positions: every
row writes its K/V before any row attends, so draft i sees drafts 1..i-1, and
each row is computed exactly like a plain decode row. The host keeps sampled
token i while token i-1 equalled draft i, so greedy output is identical to
plain decoding, and a step yields up to 1 + drafts tokens for the cost of a
slightly wider matmul. Only greedy rows without penalties or a grammar
speculate (their next token depends on nothing but the logits).
"""

from __future__ import annotations

from typing import Sequence as Seq

MAX_NGRAM = 3
# After a step whose drafts all failed, decode this many tokens plainly (multi-step) before drafting
# again: text that stopped repeating would otherwise cost a one-token step per rejected guess.
BACKOFF_TOKENS = 8


def propose(tokens: Seq[int], max_drafts: int, max_ngram: int = MAX_NGRAM) -> list[int]:
    """Tokens that followed the most recent earlier occurrence of the longest suffix n-gram."""
    if max_drafts <= 0:
        return []
    n_tokens = len(tokens)
    for n in range(min(max_ngram, n_tokens - 1), 0, -1):
        suffix = list(tokens[n_tokens - n:])
        for start in range(n_tokens - n - 1, -1, -1):  # most recent first, never the suffix itself
            if list(tokens[start:start + n]) == suffix:
                drafts = list(tokens[start + n:start + n + max_drafts])
                # an image's pseudo-tokens (negative: multimodal/media.py) are no tokens to propose
                return drafts[:next((i for i, t in enumerate(drafts) if t < 0), len(drafts))]
    return []


def eligible(seq) -> bool:
    p = seq.request.params
    return (len(seq.tokens) >= seq.speculate_after and p.temperature == 0.0 and p.repetition_penalty == 1.0
            and p.frequency_penalty == 0.0 and p.presence_penalty == 0.0 and seq.matcher is None)


def accepted(sampled: Seq[int], drafts: Seq[int]) -> list[int]:
    """The tokens to keep: sampled[0], then sampled[i] while sampled[i-1] == drafts[i-1]."""
    out = [sampled[0]]
    for i, draft in enumerate(drafts):
        if sampled[i] != draft:
            break
        out.append(sampled[i + 1])
    return out
