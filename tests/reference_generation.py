"""The reference greedy tokens (dense_generator.Generator, the foundation path) in a 128-token context.

greedy_generate's context is DEFAULT_MAX_LENGTH (2048), and its dense cache is read whole at every decode
step: on the default model (30 layers) that is ~0.2 s a token on the suite's CPU, 32 tokens 6.3 s against
0.9 s here. Rows past a sequence's length are masked, so the tokens are the same (the default model's
answers compared at both lengths).
"""

from __future__ import annotations

from typing import Sequence

from dense_generator import Generator

CONTEXT = 128


def greedy_reference(model, prompt_ids: Sequence[int], max_new_tokens: int,
                     stop_token_ids: Sequence[int] = ()) -> list[int]:
    if len(prompt_ids) + max_new_tokens > CONTEXT:  # the Generator would cut the reply short, silently
        raise ValueError(f"{len(prompt_ids)} prompt + {max_new_tokens} new tokens exceed the {CONTEXT}-token context")
    return Generator(model, max_length=CONTEXT).generate(prompt_ids, max_new_tokens, stop_token_ids=stop_token_ids)
