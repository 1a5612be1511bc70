"""The request side of OpenAI/Anthropic HTTP conformance (docs/api_conformance.md, "Requests"), on the
real `vsurge serve` (the suite's shared default server; a tiny model whose tokenizer has
fill-in-the-middle tokens for `suffix`): explicit nulls mean unset, unsupported fields are 400s naming
them (never 5xx, which OpenAI's SDKs retry), values that mean the default pass, lone UTF-16 surrogates
and non-finite numbers are 400s naming the field, error `code` is a string or null, completions
`suffix` and `max_tokens: 0` with `echo`."""

from __future__ import annotations

import asyncio
import json
import types

import httpx
import openai
import pytest

from server_process import DEFAULT_NAME, client_for
from tiny_models import add_special_tokens, write_tiny_model
from vsurge.sampling.params import wire_fields

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
PROMPT = "The capital of France is"
FIM = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"]
FIM_NAME = "tiny-fim"
VOCAB_FIM = (49152, 49153, 49154)  # the FIM tokens' ids in the tiny tokenizer (tiny_models.VOCAB onwards)
# fields whose null means a default that changes the output (sampling, length): only 200 is checked
CHANGES_OUTPUT = {"temperature", "max_tokens", "max_completion_tokens", "max_output_tokens"}


def post_raw(server, path: str, body) -> httpx.Response:
    """`body` as JSON text that keeps lone surrogates as \\uXXXX escapes and NaN/Infinity as Python writes them."""
    text = body if isinstance(body, str) else json.dumps(body, ensure_ascii=True, allow_nan=True)
    return server.post(path, content=text.encode("ascii"), headers={"content-type": "application/json"})


def openai_error(r: httpx.Response, status: int = 400) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["code"] is None or isinstance(error["code"], str), error
    assert error["type"] == ("invalid_request_error" if 400 <= status < 500 else "server_error"), error
    return error


def anthropic_error(r: httpx.Response, status: int = 400) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
    return body["error"]


@pytest.fixture(scope="module")
def server(default_server):
    return default_server


# ---------------------------------------------------------------- explicit null = unset
CHAT_NULLABLE = sorted(set(wire_fields()) | {
    "model", "logprobs", "top_logprobs", "stream", "stream_options", "user", "max_completion_tokens",
    "add_generation_prompt", "chat_template_kwargs", "response_format", "tools", "tool_choice",
    "parallel_tool_calls", "guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs",
    "functions", "function_call", "suffix", "prediction", "audio", "modalities", "best_of", "metadata", "store",
    "service_tier", "reasoning_effort"})
COMPLETION_NULLABLE = sorted(set(wire_fields()) | {
    "model", "echo", "logprobs", "stream", "stream_options", "user", "suffix", "best_of", "response_format",
    "guided_json", "structured_outputs", "tools"})
RESPONSES_NULLABLE = sorted(set(wire_fields()) | {
    "model", "instructions", "max_output_tokens", "tools", "tool_choice", "parallel_tool_calls", "text", "reasoning",
    "stream", "previous_response_id", "store", "metadata", "truncation", "user", "chat_template_kwargs",
    "structured_outputs", "background", "conversation", "prompt", "max_tool_calls", "include", "service_tier"})
EMBEDDING_NULLABLE = ["model", "encoding_format", "dimensions", "normalize", "user"]


def _all_null(post, base: dict, names, answer) -> None:
    """Every field of `names` null in one request (a field that refused null would be the 400's param):
    the answer is the one without them; each field whose default changes the output, null alone, is a 200
    (greedy: a null length runs to the end of the answer, not of the context)."""
    expected = answer(post(base))
    r = post({**base, **{name: None for name in names if name not in CHANGES_OUTPUT}})
    assert r.status_code == 200, r.text
    assert answer(r) == expected
    for name in CHANGES_OUTPUT & set(names):
        r = post({**base, name: None})
        assert r.status_code == 200, (name, r.text)


def test_null_means_unset_in_chat(server):
    base = {"messages": FRANCE, "temperature": 0, "max_tokens": 2}
    _all_null(lambda b: server.post("/v1/chat/completions", json=b), base, CHAT_NULLABLE,
              lambda r: r.json()["choices"][0]["message"]["content"])
    # stream null is a whole JSON answer; nested nullables: stream_options.include_usage, content, name
    r = server.post("/v1/chat/completions", json={**base, "stream": None})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json"), r.text
    r = server.post("/v1/chat/completions", json={"messages": [{"role": "system", "content": None, "name": None},
                                                               *FRANCE], "stream": True, "max_tokens": 2,
                                                  "stream_options": {"include_usage": None}})
    assert r.status_code == 200 and '"usage"' not in r.text, r.text


def test_null_means_unset_in_completions(server):
    base = {"prompt": PROMPT, "temperature": 0, "max_tokens": 2}
    _all_null(lambda b: server.post("/v1/completions", json=b), base, COMPLETION_NULLABLE,
              lambda r: r.json()["choices"][0]["text"])
    # a null prompt is OpenAI's default, <|endoftext|> (the default model's token 0): the same answer as that
    # token given by id (issue 60); no prompt at all is a missing required field
    null = server.post("/v1/completions", json={"prompt": None, "max_tokens": 3, "temperature": 0})
    assert null.status_code == 200, null.text
    assert null.json()["usage"]["prompt_tokens"] == 1
    eot = server.post("/tokenize", json={"prompt": "<|endoftext|>", "add_special_tokens": False}).json()
    assert eot["tokens"] == [0]
    by_id = server.post("/v1/completions", json={"prompt": [0], "max_tokens": 3, "temperature": 0}).json()
    assert null.json()["choices"][0]["text"] == by_id["choices"][0]["text"]
    error = openai_error(server.post("/v1/completions", json={"max_tokens": 3}))
    assert error["param"] == "prompt" and error["code"] == "missing_required_parameter"


def test_null_means_unset_in_responses_and_embeddings(server):
    base = {"input": "What is the capital of France?", "temperature": 0, "max_output_tokens": 2}
    _all_null(lambda b: server.post("/v1/responses", json=b), base, RESPONSES_NULLABLE,
              lambda r: r.json()["output"][0]["content"][0]["text"])
    stored = server.post("/v1/responses", json={**base, "store": None}).json()
    assert stored["store"] is True and server.get(f"/v1/responses/{stored['id']}").status_code == 200
    _all_null(lambda b: server.post("/v1/embeddings", json=b), {"input": "hello"}, EMBEDDING_NULLABLE,
              lambda r: r.json()["data"][0]["embedding"][:4])


def test_null_means_unset_in_messages_and_token_routes(server):
    r = server.post("/v1/messages", json={"messages": FRANCE, "max_tokens": 2, "stream": None, "system": None,
                                          "temperature": None, "stop_sequences": None, "tools": None,
                                          "tool_choice": None, "thinking": None, "metadata": None})
    assert r.status_code == 200 and r.json()["type"] == "message", r.text
    r = server.post("/tokenize", json={"prompt": PROMPT, "add_special_tokens": None, "model": None})
    assert r.status_code == 200 and r.json()["count"] > 0, r.text


# ---------------------------------------------------------------- unsupported fields: 400 naming them
UNSUPPORTED = [
    ("/v1/chat/completions", {"messages": FRANCE}, "functions", [{"name": "f", "parameters": {"type": "object"}}]),
    ("/v1/chat/completions", {"messages": FRANCE}, "function_call", {"name": "f"}),
    ("/v1/chat/completions", {"messages": FRANCE}, "suffix", "x"),
    ("/v1/chat/completions", {"messages": FRANCE}, "prediction", {"type": "content", "content": "x"}),
    ("/v1/chat/completions", {"messages": FRANCE}, "audio", {"voice": "alloy", "format": "wav"}),
    ("/v1/chat/completions", {"messages": FRANCE}, "modalities", ["text", "audio"]),
    ("/v1/chat/completions", {"messages": FRANCE}, "best_of", 2),
    ("/v1/completions", {"prompt": PROMPT}, "best_of", 3),
    ("/v1/completions", {"prompt": PROMPT}, "suffix", "the end"),  # the default model has no FIM tokens
    ("/v1/responses", {"input": "hi"}, "background", True),
    ("/v1/responses", {"input": "hi"}, "conversation", "conv_123"),
    ("/v1/responses", {"input": "hi"}, "prompt", {"id": "pmpt_123"}),
    ("/v1/responses", {"input": "hi"}, "max_tool_calls", 3),
]


@pytest.mark.parametrize("path, base, name, value", UNSUPPORTED, ids=[f"{p}:{n}" for p, _, n, _ in UNSUPPORTED])
def test_unsupported_fields_are_400_naming_them(server, path, base, name, value):
    error = openai_error(server.post(path, json={**base, name: value}))
    assert error["param"] == name and error["code"] == "unsupported_parameter" and name in error["message"]


def test_the_sdk_raises_bad_request_without_retrying(server):
    sent = []
    http = httpx.Client(event_hooks={"request": [sent.append]})
    client = openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=3, http_client=http)
    calls = [lambda: client.chat.completions.create(model=DEFAULT_NAME, messages=FRANCE,
                                                    extra_body={"functions": [{"name": "f"}]}),
             lambda: client.completions.create(model=DEFAULT_NAME, prompt=PROMPT, best_of=2),
             lambda: client.completions.create(model=DEFAULT_NAME, prompt=PROMPT, suffix="x"),
             lambda: client.responses.create(model=DEFAULT_NAME, input="hi", background=True)]
    for call in calls:
        sent.clear()
        with pytest.raises(openai.BadRequestError) as info:
            call()
        assert len(sent) == 1 and info.value.code == "unsupported_parameter"


DEFAULT_MEANING = [
    ("/v1/chat/completions", {"messages": FRANCE, "best_of": 1}),
    ("/v1/chat/completions", {"messages": FRANCE, "modalities": ["text"]}),
    ("/v1/chat/completions", {"messages": FRANCE, "n": 1.0, "max_tokens": 2.0, "top_logprobs": 2.0, "logprobs": True}),
    ("/v1/chat/completions", {"messages": FRANCE, "function_call": "none"}),
    ("/v1/chat/completions", {"messages": FRANCE, "function_call": "auto", "functions": []}),
    ("/v1/completions", {"prompt": PROMPT, "best_of": 1, "n": 1.0, "max_tokens": 3.0, "logprobs": 1.0}),
    ("/v1/completions", {"prompt": [1.0, 2.0, 3.0]}),
    ("/v1/completions", {"prompt": PROMPT, "suffix": ""}),  # no suffix text: an ordinary completion
    ("/v1/responses", {"input": "hi", "background": False, "max_output_tokens": 2.0, "n": 1.0}),
    ("/v1/embeddings", {"input": "hi", "dimensions": 8.0}),
    ("/v1/messages", {"messages": FRANCE, "max_tokens": 2.0}),
    ("/detokenize", {"tokens": [1.0, 2.0]}),
]


@pytest.mark.parametrize("path, body", DEFAULT_MEANING)
def test_values_that_mean_the_default_are_accepted(server, path, body):
    if path in ("/v1/chat/completions", "/v1/completions"):
        body = {"max_tokens": 2, **body}
    r = server.post(path, json=body)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("path, body, param", [
    ("/v1/chat/completions", {"messages": FRANCE, "n": 1.5}, "n"),
    ("/v1/chat/completions", {"messages": FRANCE, "max_tokens": 2.5}, "max_tokens"),
    ("/v1/completions", {"prompt": [1, 2.5]}, "prompt"),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 3.5}, "max_output_tokens"),
    ("/v1/embeddings", {"input": "hi", "dimensions": 1.5}, "dimensions"),
])
def test_fractional_integers_are_400_naming_the_field(server, path, body, param):
    error = openai_error(server.post(path, json=body))
    assert error["param"] == param and "integer" in error["message"], error


# ---------------------------------------------------------------- lone surrogates and non-finite numbers
BAD = "ok \udcff"
TOOL_CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": "\udcff"}'}}
SURROGATES = [
    ("/v1/completions", {"prompt": "\udcff"}, "prompt"),
    ("/v1/completions", {"prompt": ["fine", BAD]}, "prompt[1]"),
    ("/v1/completions", {"prompt": PROMPT, "suffix": BAD}, "suffix"),
    ("/v1/completions", {"prompt": PROMPT, "stop": [BAD]}, "stop[0]"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": BAD}]}, "messages[0].content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": BAD}]}]},
     "messages[0].content[0].text"),
    ("/v1/chat/completions", {"messages": [*FRANCE, {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]}]},
     "messages[1].tool_calls[0].function.arguments"),
    ("/v1/chat/completions", {"messages": FRANCE, "stop": BAD}, "stop"),
    ("/v1/chat/completions", {"messages": FRANCE, "metadata": {BAD: "x"}}, "metadata"),
    ("/v1/responses", {"input": BAD}, "input"),
    ("/v1/responses", {"input": [{"role": "user", "content": [{"type": "input_text", "text": BAD}]}]},
     "input[0].content[0].text"),
    ("/v1/responses", {"input": "hi", "instructions": BAD}, "instructions"),
    ("/v1/embeddings", {"input": BAD}, "input"),
    ("/v1/embeddings", {"input": ["fine", BAD]}, "input[1]"),
    ("/tokenize", {"prompt": BAD}, "prompt"),
    ("/tokenize", {"messages": [{"role": "user", "content": BAD}]}, "messages[0].content"),
    ("/v1/count_tokens", {"text": BAD}, "text"),
]


@pytest.mark.parametrize("path, body, param", SURROGATES, ids=[f"{p}:{w}" for p, _, w in SURROGATES])
def test_lone_surrogates_are_400_naming_the_field(server, path, body, param):
    error = openai_error(post_raw(server, path, body))
    assert error["param"] == param and "lone UTF-16 surrogate" in error["message"] and param in error["message"]


@pytest.mark.parametrize("body, param", [
    ({"messages": [{"role": "user", "content": BAD}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": BAD}]}]}, "messages[0].content[0].text"),
    ({"messages": FRANCE, "system": BAD}, "system"),
    ({"messages": FRANCE, "system": [{"type": "text", "text": BAD}]}, "system[0].text"),
])
def test_lone_surrogates_in_anthropic_messages(server, body, param):
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        error = anthropic_error(post_raw(server, path, {"max_tokens": 4, **body}))
        assert param in error["message"] and "lone UTF-16 surrogate" in error["message"]


NON_FINITE = [
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "temperature": 1e309}', "temperature"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "top_p": NaN}', "top_p"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": Infinity}',
     "max_tokens"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"5": -Infinity}}',
     "logit_bias.5"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", '
     '"function": {"name": "f", "parameters": {"type": "number", "maximum": 1e999}}}]}',
     "tools[0].function.parameters.maximum"),
    ("/v1/completions", '{"prompt": "hi", "n": 1e309}', "n"),
    ("/v1/completions", '{"prompt": [1, 2, NaN]}', "prompt[2]"),
    ("/v1/responses", '{"input": "hi", "temperature": Infinity}', "temperature"),
    ("/v1/responses", '{"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", '
     '"schema": {"type": "number", "minimum": NaN}}}}', "text.format.schema.minimum"),
    ("/v1/embeddings", '{"input": "hi", "dimensions": 1e400}', "dimensions"),
    ("/tokenize", '{"prompt": "hi", "x": -1e309}', "x"),
]


@pytest.mark.parametrize("path, text, param", NON_FINITE)
def test_non_finite_numbers_are_400_naming_the_field(server, path, text, param):
    error = openai_error(post_raw(server, path, text))
    assert error["param"] == param and "finite" in error["message"], error


def test_non_finite_numbers_in_anthropic_messages(server):
    text = '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": NaN}'
    assert "temperature" in anthropic_error(post_raw(server, "/v1/messages", text))["message"]


# ---------------------------------------------------------------- clear messages
CLEAR = [
    ("/v1/completions", {"prompt": []}, "prompt must not be empty", "prompt"),
    ("/v1/completions", {"prompt": [[1, 2], []]}, "prompt[1] must not be empty", "prompt"),
    ("/v1/completions", {"prompt": [5, -1]}, "token ids must be >= 0", "prompt"),
    ("/v1/completions", {"prompt": [[5], [-3]]}, "token ids must be >= 0", "prompt"),
    ("/v1/embeddings", {"input": [-1]}, "token ids must be >= 0", "input"),
    ("/v1/embeddings", {"input": []}, "input must not be empty", "input"),
    ("/detokenize", {"tokens": [1, -2]}, "token ids must be >= 0", "tokens[1]"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]},
     "image inputs are not supported by this model", "messages[0].content[1].image_url.url"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]},
     "audio inputs are not supported by this model", "messages[0].content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "file", "file": {"file_id": "f"}}]}]},
     "file inputs are not supported by this model", "messages[0].content"),
    ("/v1/responses", {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "image inputs are not supported by this model", "input[0].content[0].image_url"),
    ("/v1/responses", {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "x"}]}]},
     "file inputs are not supported by this model", "input[0].content[0].type"),
    ("/v1/chat/completions", {"messages": FRANCE, "max_tokens": 0}, "max_tokens must be at least 1", "max_tokens"),
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 0}, "max_tokens must be at least 1", "max_tokens"),
]


@pytest.mark.parametrize("path, body, message, param", CLEAR)
def test_messages_say_what_is_wrong(server, path, body, message, param):
    error = openai_error(server.post(path, json=body))
    assert message in error["message"] and error["param"] == param, error


@pytest.mark.parametrize("block, kind", [
    ({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}, "image"),
    ({"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}, "file"),
])
def test_anthropic_media_blocks_are_refused_clearly(server, block, kind):
    body = {"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, block]}]}
    error = anthropic_error(server.post("/v1/messages", json=body))
    assert f"{kind} inputs are not supported by this model" in error["message"]


# ---------------------------------------------------------------- error.code: a string or null
def test_error_codes_are_strings_or_null(server):
    cases = [
        (server.post("/v1/chat/completions", json={"model": "nope", "messages": FRANCE}), 404, "model_not_found"),
        (server.post("/v1/chat/completions", json={"messages": FRANCE, "max_tokens": 500}), 400,
         "context_length_exceeded"),
        (server.post("/v1/chat/completions", json={"messages": FRANCE, "temperature": -1}), 400, "invalid_value"),
        (server.post("/v1/chat/completions", json={}), 400, "missing_required_parameter"),
        (server.post("/v1/chat/completions", json={"messages": FRANCE, "audio": {"voice": "x"}}), 400,
         "unsupported_parameter"),
        (post_raw(server, "/v1/chat/completions", "{not json"), 400, None),
        (server.get("/v1/nothing-here"), 404, None),
        (server.get("/v1/responses/resp_missing"), 404, None),
        (server.post("/v1/embeddings", json={"input": "word " * 600}), 400, "context_length_exceeded"),
    ]
    for r, status, code in cases:
        assert openai_error(r, status)["code"] == code, r.text
    with pytest.raises(openai.NotFoundError) as info:
        client_for(server).chat.completions.create(model="nope", messages=FRANCE)
    assert info.value.code == "model_not_found"


def test_error_bodies_of_other_statuses():
    from vsurge.server.errors import error_body

    assert error_body(401, "no key")["error"] == {"message": "no key", "type": "authentication_error", "param": None,
                                                  "code": "invalid_api_key"}
    assert error_body(500, "boom")["error"]["type"] == "server_error" and error_body(500, "boom")["error"]["code"] is None
    assert error_body(503, "busy")["error"]["type"] == "server_error"


# ---------------------------------------------------------------- max_tokens 0 with echo: prompt scoring
def test_max_tokens_zero_with_echo_scores_the_prompt(server):
    client = client_for(server)
    scored = client.completions.create(model=DEFAULT_NAME, prompt=PROMPT, max_tokens=0, echo=True, logprobs=1)
    choice = scored.choices[0]
    assert choice.text == PROMPT and choice.finish_reason == "length"
    assert scored.usage.completion_tokens == 0 and scored.usage.prompt_tokens == len(choice.logprobs.tokens)
    assert "".join(choice.logprobs.tokens) == PROMPT and choice.logprobs.token_logprobs[0] is None
    assert all(lp <= 0 for lp in choice.logprobs.token_logprobs[1:])
    # the same scores as echo with generation (its first tokens are the prompt's)
    generated = client.completions.create(model=DEFAULT_NAME, prompt=PROMPT, max_tokens=1, echo=True, logprobs=1,
                                          temperature=0)
    n = len(choice.logprobs.tokens)
    assert generated.choices[0].logprobs.tokens[:n] == choice.logprobs.tokens
    assert all(abs(a - b) < 1e-4 for a, b in zip(generated.choices[0].logprobs.token_logprobs[1:n],
                                                  choice.logprobs.token_logprobs[1:]))
    plain = client.completions.create(model=DEFAULT_NAME, prompt=[PROMPT, "Hello"], max_tokens=0, echo=True)
    assert [c.text for c in plain.choices] == [PROMPT, "Hello"] and plain.choices[0].logprobs is None
    chunks = list(client.completions.create(model=DEFAULT_NAME, prompt=PROMPT, max_tokens=0, echo=True, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == PROMPT
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].usage.completion_tokens == 0
    error = openai_error(server.post("/v1/completions", json={"prompt": [10**8], "max_tokens": 0, "echo": True}))
    assert "out of range" in error["message"]


# ---------------------------------------------------------------- suffix: fill-in-the-middle
@pytest.fixture(scope="module")
def fim_server(tmp_path_factory, default_processor_dir):
    """A tiny model whose tokenizer has Qwen2.5-Coder's FIM tokens (the default model's has none), served
    by the real app in this process (a client of its routes): a server process of its own, for a model
    nothing else serves, cost ~20 s to start; its programs compile on first use here."""
    from fastapi.testclient import TestClient

    import vsurge
    from vsurge import EngineConfig, vSurge
    from vsurge.server import vSurgeApiServer

    folder = tmp_path_factory.mktemp("tiny_fim")
    write_tiny_model("llama", folder, default_processor_dir, vocab_size=VOCAB_FIM[-1] + 1)
    assert add_special_tokens(folder, FIM) == list(VOCAB_FIM)
    model, processor = vsurge.load(folder, dtype="float32", progress=False)
    surge = vSurge.create_odriver(model, processor, vsurge_name=FIM_NAME, config=EngineConfig(
        max_slots=2, max_length=128, prefill_tokens=64, chunk_lengths=(64,), row_buckets=(2,)))
    surge.start()
    try:
        with TestClient(vSurgeApiServer({FIM_NAME: surge}).app) as client:
            yield client
    finally:
        surge.stop(5)


def test_suffix_is_fill_in_the_middle_with_fim_tokens(fim_server):
    prefix, suffix = "def add(a, b):\n    return", "\n\nprint(add(1, 2))\n"
    fim = fim_server.post("/v1/completions", json={"prompt": prefix, "suffix": suffix, "max_tokens": 5,
                                                   "temperature": 0})
    assert fim.status_code == 200, fim.text
    # the same ids, written out: <|fim_prefix|> prefix <|fim_suffix|> suffix <|fim_middle|>
    text = f"{FIM[0]}{prefix}{FIM[1]}{suffix}{FIM[2]}"
    ids = fim_server.post("/tokenize", json={"prompt": text}).json()["tokens"]
    assert ids[0] == VOCAB_FIM[0] and ids[-1] == VOCAB_FIM[2] and VOCAB_FIM[1] in ids
    by_ids = fim_server.post("/v1/completions", json={"prompt": ids, "max_tokens": 5, "temperature": 0}).json()
    assert fim.json()["usage"]["prompt_tokens"] == len(ids)
    assert fim.json()["choices"][0]["text"] == by_ids["choices"][0]["text"]
    # token-id prompts take a suffix too; echo with a suffix is refused
    prefix_ids = fim_server.post("/tokenize", json={"prompt": prefix}).json()["tokens"]
    again = fim_server.post("/v1/completions", json={"prompt": prefix_ids, "suffix": suffix, "max_tokens": 5,
                                                     "temperature": 0}).json()
    assert again["choices"][0]["text"] == by_ids["choices"][0]["text"]
    error = openai_error(fim_server.post("/v1/completions", json={"prompt": prefix, "suffix": suffix, "echo": True}))
    assert error["param"] == "echo"



def test_fim_prompt_order_for_starcoder_tokens(default_processor_dir, tmp_path):
    """StarCoder-style <fim_prefix> tokens too; a tokenizer without FIM tokens refuses a suffix."""
    import shutil

    from vsurge.server.adapters.completions import fim_token_ids, prompt_token_lists
    from vsurge.server.errors import APIError
    from vsurge.tokenizer.processor import Processor

    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_processor_dir / f, tmp_path / f)
    plain = Processor.from_dir(tmp_path)
    assert fim_token_ids(plain) is None
    with pytest.raises(APIError) as info:
        asyncio.run(prompt_token_lists(types.SimpleNamespace(processor=plain), "a", "b"))
    assert info.value.status == 400 and info.value.param == "suffix"
    ids = add_special_tokens(tmp_path, ["<fim_prefix>", "<fim_suffix>", "<fim_middle>"])
    processor = Processor.from_dir(tmp_path)
    assert fim_token_ids(processor) == tuple(ids)
    surge = types.SimpleNamespace(processor=processor)
    (prompt,) = asyncio.run(prompt_token_lists(surge, "x = ", " + 1"))
    assert prompt == [ids[0], *processor.encode("x = ", add_special_tokens=False), ids[1],
                      *processor.encode(" + 1", add_special_tokens=False), ids[2]]


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": [{"role": "tool", "content": [{"type": {}, "text": ""}]}]}),
    ("/tokenize", {"messages": [{"role": "user", "content": [{"type": [], "text": ""}]}]}),
    ("/v1/count_tokens", {"messages": [{"role": "user", "content": [{"type": {}, "text": ""}]}]}),
    ("/v1/responses", {"input": [{"role": "user", "content": [{"type": {}, "text": "x"}]}]}),
    ("/v1/messages", {"max_tokens": 2, "messages": [{"role": "user", "content": [{"type": {}, "text": "x"}]}]}),
    ("/v1/messages", {"max_tokens": 2, "system": [{"type": ["x"], "text": "x"}], "messages": FRANCE}),
])
def test_a_part_type_of_any_json_is_a_400(server, path, body):
    """A content part's `type` that is an object or a list (schemathesis found these 500s)."""
    assert server.post(path, json=body).status_code == 400
