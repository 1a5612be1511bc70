"""Requests each API refuses with a 4xx naming the field, that vsurge once served (200) or failed on
(5xx), on the suite's shared default server (issue 63): empty or missing message content, tool results
that answer no call, JSON schemas no output satisfies, an empty model name; and the embeddings route
taking OpenAI's 2,048 inputs as one queue entry (the server's queue holds 128)."""

from __future__ import annotations

import openai
import pytest

from server_process import DEFAULT_NAME, client_for
from test_conformance_requests import anthropic_error, openai_error

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
SELF_CONTAINING = {"$defs": {"a": {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}, "required": ["x"]}},
                   "$ref": "#/$defs/a"}
HUGE_ARRAY = {"type": "array", "minItems": 1000000000}


def json_schema(schema) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


OPENAI_CASES = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": []}]}, "messages[0].content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
    ("/v1/chat/completions", {"messages": [{"role": "system", "content": "s"}, {"role": "user"}]},
     "messages[1].content"),
    ("/v1/chat/completions", {"messages": [*FRANCE, {"role": "tool", "content": "Sunny"}]}, "messages[1].tool_call_id"),
    ("/v1/chat/completions", {"messages": FRANCE, "response_format": json_schema(SELF_CONTAINING)},
     "response_format.json_schema.schema"),
    ("/v1/chat/completions", {"messages": FRANCE, "response_format": json_schema(HUGE_ARRAY)},
     "response_format.json_schema.schema"),
    ("/v1/chat/completions", {"messages": FRANCE, "structured_outputs": {"json": SELF_CONTAINING}},
     "structured_outputs"),
    ("/v1/completions", {"prompt": "x", "response_format": json_schema(HUGE_ARRAY)},
     "response_format.json_schema.schema"),
    ("/v1/responses", {"input": [{"type": "function_call_output", "call_id": "call_nope", "output": "Sunny"}]},
     "input[0].call_id"),
    ("/v1/responses", {"input": "hi", "text": {"format": {"type": "json_schema", "name": "a",
                                                          "schema": SELF_CONTAINING}}}, "text.format.schema"),
    ("/v1/embeddings", {"model": "", "input": "hello"}, "model"),
    ("/v1/chat/completions", {"model": "", "messages": FRANCE}, "model"),
]


@pytest.mark.parametrize("path, body, param", OPENAI_CASES, ids=[f"{p}:{w}" for p, _, w in OPENAI_CASES])
def test_openai_routes_refuse_with_400_naming_the_field(default_server, path, body, param):
    error = openai_error(default_server.post(path, json=body))
    assert error["param"] is not None and error["param"].startswith(param), error
    assert param.split(".")[0].split("[")[0] in error["message"], error


ANTHROPIC_CASES = [
    ({"max_tokens": 4, "messages": [{"role": "user", "content": []}]}, "messages[0].content"),
    ({"max_tokens": 4, "messages": [*FRANCE, {"role": "assistant", "content": []}, {"role": "user", "content": "?"}]},
     "messages[1].content"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_nope", "content": "Sunny"}]}]}, "messages[0].content[0].tool_use_id"),
    ({"max_tokens": 4, "messages": FRANCE, "output_config": {"format": {"type": "json_schema", "schema": HUGE_ARRAY}}},
     "output_config"),
]


@pytest.mark.parametrize("body, field", ANTHROPIC_CASES, ids=[f for _, f in ANTHROPIC_CASES])
def test_anthropic_messages_refuse_with_400_naming_the_field(default_server, body, field):
    assert field in anthropic_error(default_server.post("/v1/messages", json=body))["message"]


def test_what_stays_accepted(default_server):
    """The edges of those rules: an assistant turn without content that calls a tool, an empty final
    assistant message (Anthropic's prefill), a recursive schema with a way out, tool results that answer
    their calls."""
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    chat = default_server.post("/v1/chat/completions", json={"max_tokens": 2, "messages": [
        *FRANCE, {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"}]})
    assert chat.status_code == 200, chat.text
    prefill = default_server.post("/v1/messages", json={"max_tokens": 2, "messages": [
        *FRANCE, {"role": "assistant", "content": []}]})
    assert prefill.status_code == 200, prefill.text
    tree = {"$defs": {"n": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/n"}}},
                            "required": ["kids"]}}, "$ref": "#/$defs/n"}
    r = default_server.post("/v1/chat/completions", json={"messages": FRANCE, "max_tokens": 8,
                                                           "response_format": json_schema(tree)})
    assert r.status_code == 200, r.text


def test_embeddings_take_2048_inputs_as_one_queue_entry(default_server):
    """OpenAI's limit per request is 2,048 inputs; the server's queue holds 128 requests (DEFAULT_SERVER_ARGS):
    the inputs are one entry of it (issue 63: 503 "the request queue is full" above 256 on an idle server)."""
    client = client_for(default_server)
    inputs = [[1 + i % 50, 2 + i % 7] for i in range(2048)]
    reply = client.embeddings.create(model=DEFAULT_NAME, input=inputs)
    assert [d.index for d in reply.data] == list(range(2048))
    assert reply.data[0].embedding == reply.data[50 * 7].embedding  # the same input, the same vector
    with pytest.raises(openai.BadRequestError, match="2048"):
        client.embeddings.create(model=DEFAULT_NAME, input=inputs + [[1]])


def test_one_model_by_name(default_server):
    client = client_for(default_server)
    model = client.models.retrieve(DEFAULT_NAME)
    assert model.id == DEFAULT_NAME and model.object == "model"
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.models.retrieve("nope")
