"""Whole-prompt passes on the real `vsurge serve` (the shared default server): /v1/embeddings through
the openai SDK, and completions' prompt_logprobs / echo + logprobs, against HF transformers' own GGUF
loader on the same file (float32) as the reference. The server runs bfloat16 weights, hence the
tolerances."""

from __future__ import annotations

import base64

import numpy as np
import openai
import pytest

from server_process import DEFAULT_NAME, client_for

TEXTS = ["The capital of France is Paris.", "hello world", "a", "Embeddings pack several prompts into one row.",
         "JAX compiles programs for the device."]


def encode_calls(server) -> float:
    """How many embed/score device calls the server has run (the encode stage's histogram count)."""
    for line in server.get("/metrics").text.splitlines():
        if line.startswith("vsurge:stage_latency_seconds_count{") and 'stage="encode"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.fixture(scope="module")
def reference(hf_reference):
    """text or ids -> (final hidden states (T, D), log-softmax logits (T, V)) from transformers, float32."""
    import torch

    model, tokenizer = hf_reference

    def run(ids):
        with torch.no_grad():
            out = model(torch.tensor([ids]), output_hidden_states=True)
        return out.hidden_states[-1][0].numpy(), torch.log_softmax(out.logits[0], -1).numpy()

    return run, tokenizer


def unit(v):
    v = np.asarray(v, np.float64)
    return v / np.linalg.norm(v)


def test_embeddings_match_transformers_last_token_pooling(default_server, reference):
    run, tokenizer = reference
    response = client_for(default_server).embeddings.create(model=DEFAULT_NAME, input=TEXTS)  # SDK asks base64
    assert [d.index for d in response.data] == list(range(len(TEXTS)))
    ids = [tokenizer(t)["input_ids"] for t in TEXTS]
    assert response.usage.prompt_tokens == sum(len(i) for i in ids)
    for item, prompt in zip(response.data, ids):
        got = np.asarray(item.embedding)
        assert got.shape == (576,) and abs(np.linalg.norm(got) - 1) < 1e-5
        hidden, _ = run(prompt)
        assert float(unit(hidden[-1]) @ got) > 0.995  # the server's default pooling for this model: last token


def test_dimensions_float_and_base64_encodings(default_server, reference):
    run, tokenizer = reference
    raw = default_server.post("/v1/embeddings", json={"input": TEXTS[0], "encoding_format": "float",
                                                      "dimensions": 64}).json()
    got = np.asarray(raw["data"][0]["embedding"])
    hidden, _ = run(tokenizer(TEXTS[0])["input_ids"])
    assert got.shape == (64,) and float(unit(hidden[-1][:64]) @ got) > 0.995
    as_b64 = default_server.post("/v1/embeddings", json={"input": TEXTS[0], "encoding_format": "base64",
                                                         "dimensions": 64}).json()
    decoded = np.frombuffer(base64.b64decode(as_b64["data"][0]["embedding"]), "<f4")
    np.testing.assert_allclose(decoded, got, atol=1e-6)
    raw_states = default_server.post("/v1/embeddings", json={"input": [TEXTS[0]], "normalize": False}).json()
    norm = np.linalg.norm(raw_states["data"][0]["embedding"])
    assert abs(norm / np.linalg.norm(hidden[-1]) - 1) < 0.02 and norm > 2  # vLLM's normalize: false


def test_a_batch_is_packed_into_few_calls_and_equals_each_input_alone(default_server):
    client = client_for(default_server)
    texts = [f"sentence number {i} is about topic {i * 7}" for i in range(64)]
    before = encode_calls(default_server)
    batch = client.embeddings.create(model=DEFAULT_NAME, input=texts, encoding_format="float")
    calls = encode_calls(default_server) - before
    assert 1 <= calls <= 2, calls  # 64 inputs of ~12 tokens in the 512-token budget of a call or two
    for i in (0, 17, 63):
        alone = client.embeddings.create(model=DEFAULT_NAME, input=texts[i], encoding_format="float")
        np.testing.assert_allclose(batch.data[i].embedding, alone.data[0].embedding, atol=2e-3)
    ids = default_server.post("/tokenize", json={"prompt": texts[5]}).json()["tokens"]
    by_ids = client.embeddings.create(model=DEFAULT_NAME, input=[ids], encoding_format="float")
    np.testing.assert_allclose(by_ids.data[0].embedding, batch.data[5].embedding, atol=2e-3)


def test_engine_passes_match_transformers_in_float32(dense_surge, reference):
    """vSurge.encode on the float32 engine: mean and last-token pooled states and the prompt's token
    logprobs, several prompts packed into one call, against transformers' float32 forward pass."""
    import asyncio

    run, tokenizer = reference
    ids = [tokenizer(t)["input_ids"] for t in TEXTS]
    embedded = asyncio.run(dense_surge.encode(ids, "embed"))
    scored = asyncio.run(dense_surge.encode(ids, "score"))
    for prompt, pooled, scores in zip(ids, embedded, scored):
        hidden, logp = run(prompt)
        np.testing.assert_allclose(pooled["mean"], hidden.mean(0), atol=2e-3, rtol=1e-3)
        np.testing.assert_allclose(pooled["last"], hidden[-1], atol=2e-3, rtol=1e-3)
        expected = [logp[t - 1, prompt[t]] for t in range(1, len(prompt))]
        np.testing.assert_allclose(scores.logprobs, expected, atol=2e-3)
        assert scores.top_ids[:, 0].tolist() == [int(np.argmax(logp[t])) for t in range(len(prompt) - 1)]
    with pytest.raises(ValueError, match="empty"):
        asyncio.run(dense_surge.encode([[]], "embed"))


def test_pooling_follows_a_sentence_transformers_config(tmp_path):
    from vsurge.server.adapters.embeddings import pooling_for_model

    assert pooling_for_model(tmp_path) == "last"
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
    assert pooling_for_model(tmp_path) == "mean"


def test_prompt_logprobs_and_echo_match_transformers(default_server, reference):
    run, tokenizer = reference
    prompt = "The capital of France is"
    ids = tokenizer(prompt)["input_ids"]
    _, logp = run(ids)
    expected = [float(logp[t - 1, ids[t]]) for t in range(1, len(ids))]
    client = client_for(default_server)
    echoed = client.completions.create(model=DEFAULT_NAME, prompt=prompt, max_tokens=2, temperature=0, echo=True,
                                       logprobs=2)
    lp = echoed.choices[0].logprobs
    assert echoed.choices[0].text.startswith(prompt)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    np.testing.assert_allclose(lp.token_logprobs[1:len(ids)], expected, atol=0.1)
    assert len(lp.tokens) == len(ids) + 2 and all(len(t) == 2 for t in lp.top_logprobs[1:])
    scored = client.completions.create(model=DEFAULT_NAME, prompt=prompt, max_tokens=1, temperature=0,
                                       extra_body={"prompt_logprobs": 1}).model_dump()["choices"][0]
    entries = scored["prompt_logprobs"]
    assert entries[0] is None and len(entries) == len(ids)
    for t in range(1, len(ids)):
        mine = entries[t][str(ids[t])]
        assert abs(mine["logprob"] - expected[t - 1]) < 0.1
        hf_rank = int((logp[t - 1] > logp[t - 1, ids[t]]).sum()) + 1
        assert abs(mine["rank"] - hf_rank) <= max(2, hf_rank // 10), (mine["rank"], hf_rank)
        (top,) = [int(k) for k, v in entries[t].items() if v["rank"] == 1]
        assert logp[t - 1, top] > logp[t - 1].max() - 0.1  # the likeliest token (up to bfloat16 near-ties)
    streamed = list(client.completions.create(model=DEFAULT_NAME, prompt=prompt, max_tokens=2, temperature=0,
                                              echo=True, logprobs=1, stream=True))
    tokens = [t for c in streamed if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert tokens == lp.tokens


BAD = [
    ({"input": ""}, "input[0] is empty", "input"),
    ({"input": []}, "input", "input"),
    ({"input": [[10**8]]}, "out of range", "input"),
    ({"input": "hi", "dimensions": 0}, "dimensions must be in [1, 576]", "dimensions"),
    ({"input": "hi", "encoding_format": "yaml"}, "encoding_format", "encoding_format"),
    ({"input": "word " * 600}, "more than the 511", "input"),
    ({"input": "hi", "model": "nope"}, "does not exist", "model"),
]


@pytest.mark.parametrize("body, message, param", BAD)
def test_bad_embedding_requests_get_openai_errors(default_server, body, message, param):
    r = default_server.post("/v1/embeddings", json=body)
    assert 400 <= r.status_code < 500, r.text
    error = r.json()["error"]
    assert message in error["message"] and error["param"] == param


def test_the_sdk_raises_and_the_server_keeps_serving(default_server):
    client = client_for(default_server)
    with pytest.raises(openai.BadRequestError, match="dimensions"):
        client.embeddings.create(model=DEFAULT_NAME, input="hi", dimensions=10_000)
    for content in (b"{not json", b'{"input": {"a": 1}}'):
        r = default_server.post("/v1/embeddings", content=content, headers={"content-type": "application/json"})
        assert r.status_code == 400 and "error" in r.json()
    assert len(client.embeddings.create(model=DEFAULT_NAME, input="hi").data[0].embedding) == 576
