"""The engine paths beyond the paged server (tests/server/test_families_serving.py) on families whose layers
differ most from Llama's: the dense engine with speculation (MLA's latent cache; attention sinks
and experts), vInference (soft-capped, alternating-window layers), preemption under page pressure
(sliding windows and two rotary bases), grammar-constrained output (routed experts). Greedy
outputs equal the reference Generator's (dense KV cache, one sequence at a time)."""

from __future__ import annotations

import asyncio
import json

import jax.numpy as jnp
import pytest

import vsurge
from vsurge import EngineConfig, SamplingParams, vSurge
from dense_generator import greedy_generate

PROMPTS = ["one two three one two three one two", "The ducks of the river ran past the mill"]
CONFIG = dict(max_slots=4, max_length=64, prefill_tokens=16, chunk_lengths=(16,), row_buckets=(4,),
              window_buckets=(4,), prefill_first=True, page_size=16, decode_steps=4)


def load(tiny_checkpoints, name):
    return vsurge.load(tiny_checkpoints[name][0], dtype=jnp.float32, progress=False)


def reference(model, processor, steps):
    return [greedy_generate(model, processor.encode(p), steps) for p in PROMPTS]


def run(surge, params):
    surge.compile()
    surge.start()
    try:
        return [r.token_ids for r in asyncio.run(surge.generate(PROMPTS, params))]
    finally:
        surge.stop(5)


@pytest.mark.parametrize("name", ["deepseek_v3", "gpt_oss"])
def test_dense_engine_with_speculation_gives_the_reference_tokens(name, tiny_checkpoints):
    model, processor = load(tiny_checkpoints, name)
    surge = vSurge.create_vdriver(model, processor, config=EngineConfig(**CONFIG, num_pages=4 * 4))
    got = run(surge, SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, speculative_tokens=3))
    assert got == reference(model, processor, 10)


def test_vinference_gives_the_reference_text(tiny_checkpoints):
    from vsurge import vInference, vInferenceConfig

    model, processor = load(tiny_checkpoints, "gemma2")
    vi = vInference(model, processor, generation_config=vInferenceConfig(max_new_tokens=8, streaming_chunks=4))
    outputs = vi.process_prompt(PROMPTS, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    assert [o.text for o in outputs] == [processor.decode(ids) for ids in reference(model, processor, 8)]


def test_preemption_under_page_pressure_keeps_the_outputs(tiny_checkpoints):
    model, processor = load(tiny_checkpoints, "gemma3")
    surge = vSurge.create_odriver(model, processor, config=EngineConfig(**CONFIG, num_pages=5))  # 2 x 3 pages needed
    got = run(surge, SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True))
    assert surge.metrics.value("vsurge:num_preemptions_total") > 0
    assert got == reference(model, processor, 30)


def test_structured_output_on_routed_experts(tiny_checkpoints):
    model, processor = load(tiny_checkpoints, "qwen3_moe")
    surge = vSurge.create_odriver(model, processor, config=EngineConfig(**CONFIG, num_pages=16))
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    got = run(surge, SamplingParams(max_tokens=40, temperature=0.0, structured={"json": schema}))
    for ids in got:
        assert set(json.loads(processor.decode(ids))) == {"n"}


@pytest.mark.parametrize("name", ["gemma2", "gpt_oss", "deepseek_v2"])
def test_prompt_scoring_uses_each_layers_attention(name, tiny_checkpoints):
    """The whole-prompt pass (embeddings, prompt logprobs) runs each family's own attention: soft-caps
    and alternating windows, sinks, the latent cache's split keys; prompts packed into one call.
    Token logprobs equal transformers' log-softmax on the same weights."""
    import numpy as np
    import torch
    from test_models_vs_transformers import reference_logits

    model, processor = load(tiny_checkpoints, name)
    surge = vSurge.create_odriver(model, processor, config=EngineConfig(**CONFIG, num_pages=16))
    ids = [processor.encode(p) for p in PROMPTS]
    surge.start()
    try:
        scored = asyncio.run(surge.encode(ids, "score"))
    finally:
        surge.stop(5)
    for prompt, got in zip(ids, scored):
        logits = torch.tensor(reference_logits(tiny_checkpoints[name][1], np.array(prompt)))
        logp = torch.log_softmax(logits, -1).numpy()
        np.testing.assert_allclose(got.logprobs, [logp[t - 1, prompt[t]] for t in range(1, len(prompt))], atol=2e-4)
