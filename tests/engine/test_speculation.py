"""Prompt-lookup speculative decoding: the pure pieces, then identical greedy output on the real model."""

from __future__ import annotations

import asyncio

from vsurge import SamplingParams
from vsurge.engine.speculation import accepted, propose


def test_propose_copies_what_followed_the_latest_earlier_ngram():
    tokens = [1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3]
    assert propose(tokens, 2) == [7, 8]  # the most recent earlier "1 2 3" was followed by 7 8
    assert propose(tokens, 10) == [7, 8, 1, 2, 3]
    assert propose([5, 6, 7, 5], 3) == [6, 7, 5]  # falls back to a 1-gram
    assert propose([1, 2, 3], 4) == [] and propose([4], 4) == [] and propose(tokens, 0) == []


def test_accepted_keeps_sampled_tokens_while_the_drafts_agree():
    assert accepted([7, 8, 5], [7, 8]) == [7, 8, 5]  # both drafts right: 3 tokens from one step
    assert accepted([7, 4, 5], [7, 8]) == [7, 4]  # the second draft was wrong: its own token replaces it
    assert accepted([6, 4, 5], [7, 8]) == [6]


def test_greedy_output_is_identical_and_takes_fewer_steps(dense_surge, default_model):
    processor = default_model[1]
    text = ("The quick brown fox jumps over the lazy dog while the small red hen bakes fresh bread for the "
            "hungry farmers who work in the golden fields near the old river.")
    prompt = processor.apply_chat_template([{"role": "user", "content": f"Copy this text exactly: {text}"}],
                                           tokenize=False, add_generation_prompt=True)

    def run(k):
        before = dense_surge.metrics.value("vsurge:stage_latency_seconds_count", stage="decode")
        (out,) = asyncio.run(dense_surge.generate(prompt, SamplingParams(max_tokens=32, temperature=0.0,
                                                                         ignore_eos=True, speculative_tokens=k)))
        return out.token_ids, dense_surge.metrics.value("vsurge:stage_latency_seconds_count", stage="decode") - before

    plain, plain_steps = run(0)
    fast, fast_steps = run(6)
    assert fast == plain and len(plain) == 32
    assert fast_steps < plain_steps, (fast_steps, plain_steps)
