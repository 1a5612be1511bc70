"""Structured outputs through the Python APIs (vSurge, vInference) on the real default model, float32."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest

from vsurge import SamplingParams, vInference, vInferenceConfig, vSurgeRequest

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 130}},
          "required": ["name", "age"], "additionalProperties": False}


def chat_text(processor, question):
    return processor.apply_chat_template([{"role": "user", "content": question}], tokenize=False)


@pytest.fixture(scope="module")
def alone(default_model):
    model, processor = default_model
    return vInference(model, processor, generation_config=vInferenceConfig(max_new_tokens=48, streaming_chunks=8))


def test_free_rows_equal_their_output_alone_and_constrained_rows_validate(dense_surge, alone, default_model):
    processor = default_model[1]
    prompts = [chat_text(processor, f"Tell me about person number {i}.") for i in range(12)]
    constrained = SamplingParams(max_tokens=48, temperature=0.0, repetition_penalty=1.1, structured={"json": SCHEMA})
    free = SamplingParams(max_tokens=24, temperature=0.0)
    params = [constrained if i % 2 else free for i in range(12)]
    results = asyncio.run(dense_surge.generate(prompts, params))
    for i, r in enumerate(results):
        if i % 2:
            assert r.finish_reason == "stop", r.text
            jsonschema.validate(json.loads(r.text), SCHEMA)
        else:  # float32 greedy is batch-invariant: masks of neighbours change nothing
            assert r.text == alone.process_prompt(prompts[i], free).text


def test_vsurge_request_and_vinference_take_a_constraint(dense_surge, alone, default_model):
    processor = default_model[1]
    prompt = chat_text(processor, "Is the sky blue? Answer yes or no.")

    async def run():
        request = vSurgeRequest(prompt=prompt, max_tokens=8, temperature=1.0, seed=7,
                                structured={"choice": ["yes", "no", "maybe"]})
        return [s async for samples in dense_surge.complete(request) for s in samples]

    samples = asyncio.run(run())
    assert samples[-1].accumulated_text in ("yes", "no", "maybe") and samples[-1].finish_reason == "stop"
    out = alone.process_prompt(prompt, SamplingParams(max_tokens=12, temperature=0.8, seed=1,
                                                      structured={"regex": "(yes|no), [0-9]{2}%"}))
    assert out.finish_reason == "stop" and out.text.split(", ")[0] in ("yes", "no") and out.text.endswith("%")


def test_a_constraint_cut_by_max_tokens_reports_length(dense_surge, default_model):
    processor = default_model[1]
    (r,) = asyncio.run(dense_surge.generate(chat_text(processor, "Describe a person."),
                                            SamplingParams(max_tokens=3, temperature=0.0,
                                                           structured={"json": SCHEMA})))
    assert r.finish_reason == "length" and r.num_generated_tokens == 3 and r.text.startswith("{")


def test_bad_constraints_raise_clear_errors():
    with pytest.raises(ValueError, match="invalid JSON schema"):
        SamplingParams(structured={"json": {"type": "no such type"}})
    with pytest.raises(ValueError, match="one"):
        SamplingParams(structured={"regex": "a", "choice": ["a"]})
