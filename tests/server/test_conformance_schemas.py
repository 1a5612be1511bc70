"""The server's output against the APIs' own definitions, on the real `vsurge serve` (the shared
default server): every OpenAI body and every streamed event's data validated with `jsonschema`
against OpenAI's OpenAPI spec (tests/data/openapi/openai_subset.json, cut by tests/tools/cut_openapi.py
from github.com/openai/openai-openapi), and every Anthropic body and stream event parsed by the
anthropic SDK's pydantic types with no field they do not define. Requests cover the options vsurge
serves. The only deviations let through are docs/api_conformance.md's list (openai_schemas.DEVIATIONS),
each at the one path and request it names."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys

import anthropic
import httpx
import pytest
from pydantic import TypeAdapter

from anthropic_checks import check_event, check_message, strict
from openai_schemas import (BASE64, CHUNK_FINISH, COMPLETION_CHUNK_FINISH, DEVIATIONS, ECHO_FIRST_TOKEN, ROOT,
                            check)
from server_process import DEFAULT_NAME

OLD_ANTHROPIC = ROOT / ".venv" / "anthropic-old"  # anthropic==0.49.0, installed there by `make test`'s stamp

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False}}}
CITY_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
               "required": ["city", "country"], "additionalProperties": False}


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.base + path, json=body, timeout=120)


def ok(server, path: str, body: dict) -> dict:
    r = post(server, path, body)
    assert r.status_code == 200, (body, r.text)
    assert r.headers["content-type"].startswith("application/json")
    return r.json()


def sse(server, path: str, body: dict, named: bool = False) -> list[dict]:
    """A stream's events' data (not [DONE]); named: each `event:` line must match its data's type."""
    events, name = [], None
    with httpx.stream("POST", server.base + path, json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200, (body, r.read())
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = list(r.iter_lines())
    assert lines and lines[-1] == "" or lines[-1].startswith("data:"), lines[-3:]
    done = False
    for line in lines:
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            assert not done, "data after [DONE]"
            if line == "data: [DONE]":
                done = True
                continue
            event = json.loads(line[6:])
            if named:
                assert name == event["type"], (name, event)
            events.append(event)
            name = None
        else:
            assert line == "", line
    assert done != named, "OpenAI's chat and completions streams end with [DONE]; Responses and Messages do not"
    return events


def check_error(r: httpx.Response, status: int) -> None:
    assert r.status_code == status, r.text
    check("ErrorResponse", r.json())


# ------------------------------------------------------------ chat completions
CHAT = {
    "plain": {"messages": FRANCE, "temperature": 0, "max_tokens": 16},
    "options": {"messages": [{"role": "system", "content": "You are terse."}, *FRANCE], "n": 2, "seed": 7,
                "temperature": 0.8, "top_p": 0.9, "logprobs": True, "top_logprobs": 3, "stop": [".", "\n"],
                "max_completion_tokens": 12, "presence_penalty": 0.1, "frequency_penalty": 0.1, "user": "u1",
                "logit_bias": {"42": -5}, "metadata": {"k": "v"}, "store": False, "service_tier": "auto"},
    "developer_and_history": {"messages": [
        {"role": "developer", "content": [{"type": "text", "text": "Answer in one word."}]},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"}],
        "tools": [WEATHER], "temperature": 0, "max_tokens": 12},
    "tool_required": {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER],
                      "tool_choice": "required", "temperature": 0, "max_tokens": 40, "parallel_tool_calls": False},
    "tool_named": {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER],
                   "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "temperature": 0,
                   "max_tokens": 40, "logprobs": True},
    "json_schema": {"messages": [{"role": "user", "content": "Where is the Eiffel tower? JSON."}], "temperature": 0,
                    "max_tokens": 48, "response_format": {"type": "json_schema", "json_schema": {
                        "name": "place", "strict": True, "schema": CITY_SCHEMA}}},
    "json_object": {"messages": [{"role": "user", "content": "Give me a JSON object."}], "temperature": 0,
                    "max_tokens": 16, "response_format": {"type": "json_object"}},
    "length": {"messages": FRANCE, "temperature": 0, "max_tokens": 2},
}


@pytest.mark.parametrize("case", sorted(CHAT))
def test_chat_completion_bodies(default_server, case):
    body = ok(default_server, "/v1/chat/completions", {"model": DEFAULT_NAME, **CHAT[case]})
    check("CreateChatCompletionResponse", body)
    assert len(body["choices"]) == CHAT[case].get("n", 1)


@pytest.mark.parametrize("case", sorted(CHAT))
def test_chat_completion_stream_chunks(default_server, case):
    request = {"model": DEFAULT_NAME, **CHAT[case], "stream_options": {"include_usage": True}}
    events = sse(default_server, "/v1/chat/completions", request)
    for event in events:
        check("CreateChatCompletionStreamResponse", event, skip=(CHUNK_FINISH,))
    assert events[-1]["choices"] == [] and events[-1]["usage"]["total_tokens"] > 0
    assert all(e["usage"] is None for e in events[:-1]), "usage is null on every chunk but the last"


# ------------------------------------------------------------ completions
COMPLETIONS = {
    "plain": {"prompt": "The capital of France is", "temperature": 0, "max_tokens": 8},
    "options": {"prompt": ["One, two,", "Red, green,"], "n": 2, "logprobs": 2, "echo": True, "stop": ["\n"],
                "seed": 3, "max_tokens": 6, "temperature": 0.7, "presence_penalty": 0.2, "user": "u"},
    "token_ids": {"prompt": [[504, 3575, 282], [1780, 314]], "max_tokens": 4, "temperature": 0, "logprobs": 1},
    "json": {"prompt": "A JSON object:", "max_tokens": 12, "temperature": 0,
             "response_format": {"type": "json_object"}},
}


@pytest.mark.parametrize("case", sorted(COMPLETIONS))
def test_completion_bodies(default_server, case):
    request = COMPLETIONS[case]
    body = ok(default_server, "/v1/completions", {"model": DEFAULT_NAME, **request})
    check("CreateCompletionResponse", body, skip=ECHO_FIRST_TOKEN if request.get("echo") else ())


@pytest.mark.parametrize("case", sorted(COMPLETIONS))
def test_completion_stream_chunks(default_server, case):
    request = COMPLETIONS[case]
    events = sse(default_server, "/v1/completions",
                 {"model": DEFAULT_NAME, **request, "stream_options": {"include_usage": True}})
    skip = (COMPLETION_CHUNK_FINISH, *(ECHO_FIRST_TOKEN if request.get("echo") else ()))
    for event in events:  # OpenAI streams completions as CreateCompletionResponse chunks
        check("CreateCompletionResponse", event, skip=skip)
    assert events[-1]["choices"] == [] and events[-1]["usage"]["total_tokens"] > 0


def test_completion_suffix_is_answered_or_refused_in_shape(default_server):
    r = post(default_server, "/v1/completions", {"model": DEFAULT_NAME, "prompt": "def f(", "suffix": "return 1",
                                                 "max_tokens": 4})
    if r.status_code == 200:
        check("CreateCompletionResponse", r.json())
    else:
        assert r.status_code in (400, 501)
        check("ErrorResponse", r.json())


# ------------------------------------------------------------ responses
RESPONSES_TOOL = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
                  "parameters": WEATHER["function"]["parameters"], "strict": True}
RESPONSES = {
    "plain": {"input": "What is the capital of France?", "temperature": 0, "max_output_tokens": 16},
    "options": {"instructions": "You are terse.", "input": [
        {"role": "developer", "content": "Answer briefly."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Capital of France?"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Paris."}]},
        {"role": "user", "content": "And of Spain?"}],
        "temperature": 0.5, "top_p": 0.9, "seed": 1, "max_output_tokens": 16, "metadata": {"k": "v"},
        "user": "u", "store": False, "truncation": "disabled", "parallel_tool_calls": True},
    "tools": {"input": "Weather in Paris?", "tools": [RESPONSES_TOOL], "tool_choice": "required", "temperature": 0,
              "max_output_tokens": 40},
    "tool_named": {"input": "Weather in Paris?", "tools": [RESPONSES_TOOL],
                   "tool_choice": {"type": "function", "name": "get_weather"}, "temperature": 0},
    "json_schema": {"input": "Where is the Eiffel tower? JSON.", "temperature": 0, "max_output_tokens": 48,
                    "text": {"format": {"type": "json_schema", "name": "place", "schema": CITY_SCHEMA,
                                        "strict": True}}},
    "json_object": {"input": "A JSON object please.", "temperature": 0, "max_output_tokens": 16,
                    "text": {"format": {"type": "json_object"}}},
    "top_logprobs": {"input": "What is the capital of France?", "temperature": 0, "max_output_tokens": 8,
                     "top_logprobs": 3, "include": ["message.output_text.logprobs"]},
    "incomplete": {"input": "Count to twenty.", "temperature": 0, "max_output_tokens": 16},
    "reasoning_effort": {"input": "Hi", "reasoning": {"effort": "low"}, "max_output_tokens": 16},
}


@pytest.mark.parametrize("case", sorted(RESPONSES))
def test_response_bodies(default_server, case):
    body = ok(default_server, "/v1/responses", {"model": DEFAULT_NAME, **RESPONSES[case]})
    check("Response", body)
    assert body["status"] in ("completed", "incomplete")


@pytest.mark.parametrize("case", sorted(RESPONSES))
def test_response_stream_events(default_server, case):
    events = sse(default_server, "/v1/responses", {"model": DEFAULT_NAME, **RESPONSES[case]}, named=True)
    for event in events:
        check("ResponseStreamEvent", event)
        if "response" in event:
            check("Response", event["response"])
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["type"] in ("response.completed", "response.incomplete")


def test_response_logprobs_whole_and_streamed(default_server):
    """top_logprobs with include message.output_text.logprobs: each output_text token's logprob and its
    alternatives, the same as chat's for the same prompt, and in the stream's deltas."""
    request = {"model": DEFAULT_NAME, **RESPONSES["top_logprobs"]}
    body = ok(default_server, "/v1/responses", request)
    assert body["top_logprobs"] == 3
    (part,) = body["output"][0]["content"]
    assert part["logprobs"] and "".join(lp["token"] for lp in part["logprobs"]).startswith(part["text"])
    assert all(len(lp["top_logprobs"]) == 3 and lp["bytes"] == list(lp["token"].encode()) for lp in part["logprobs"])
    chat = ok(default_server, "/v1/chat/completions", {"model": DEFAULT_NAME, "messages": FRANCE, "temperature": 0,
                                                       "max_tokens": 8, "logprobs": True, "top_logprobs": 3})
    assert [lp["token"] for lp in part["logprobs"]] == [lp["token"] for lp in chat["choices"][0]["logprobs"]["content"]]
    assert [lp["logprob"] for lp in part["logprobs"]] == pytest.approx(
        [lp["logprob"] for lp in chat["choices"][0]["logprobs"]["content"]], abs=1e-3)
    events = sse(default_server, "/v1/responses", request, named=True)
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    streamed = [lp for e in deltas for lp in e["logprobs"]]
    assert [lp["token"] for lp in streamed] == [lp["token"] for lp in part["logprobs"]]
    assert all(len(lp["top_logprobs"]) == 3 for lp in streamed)
    done = next(e for e in events if e["type"] == "response.output_text.done")
    assert [lp["token"] for lp in done["logprobs"]] == [lp["token"] for lp in streamed]
    # include alone (no top_logprobs): the chosen tokens' logprobs, no alternatives; neither: none
    alone = ok(default_server, "/v1/responses", {**request, "top_logprobs": None})
    assert all(lp["top_logprobs"] == [] for lp in alone["output"][0]["content"][0]["logprobs"])
    assert alone["output"][0]["content"][0]["logprobs"]
    plain = ok(default_server, "/v1/responses", {**request, "top_logprobs": None, "include": None})
    assert plain["output"][0]["content"][0]["logprobs"] == []
    r = post(default_server, "/v1/responses", {**request, "top_logprobs": 21})  # OpenAI's range: 0-20
    check_error(r, 400)
    assert r.json()["error"]["param"] == "top_logprobs"


def test_stored_response_retrieved_continued_and_deleted(default_server):
    first = ok(default_server, "/v1/responses", {"model": DEFAULT_NAME, **RESPONSES["tools"], "store": True})
    check("Response", first)
    call = first["output"][0]
    assert call["type"] == "function_call"
    follow = ok(default_server, "/v1/responses", {
        "model": DEFAULT_NAME, "previous_response_id": first["id"], "temperature": 0, "max_output_tokens": 16,
        "tools": [RESPONSES_TOOL],
        "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": "Sunny, 21 C"}]})
    check("Response", follow)
    assert follow["previous_response_id"] == first["id"]
    r = httpx.get(default_server.base + f"/v1/responses/{first['id']}", timeout=30)
    assert r.status_code == 200
    check("Response", r.json())
    r = httpx.delete(default_server.base + f"/v1/responses/{first['id']}", timeout=30)
    assert r.status_code == 200 and r.json() == {"id": first["id"], "object": "response", "deleted": True}
    check_error(httpx.get(default_server.base + f"/v1/responses/{first['id']}", timeout=30), 404)


# ------------------------------------------------------------ embeddings and models
@pytest.mark.parametrize("request_", [{"input": "hello"}, {"input": ["a", "b c"], "dimensions": 32},
                                      {"input": [[1, 2, 3]], "encoding_format": "float"}])
def test_embedding_bodies(default_server, request_):
    check("CreateEmbeddingResponse", ok(default_server, "/v1/embeddings", {"model": DEFAULT_NAME, **request_}))


def test_base64_embeddings_deviate_only_where_listed(default_server):
    body = ok(default_server, "/v1/embeddings", {"model": DEFAULT_NAME, "input": ["a", "b"],
                                                  "encoding_format": "base64"})
    check("CreateEmbeddingResponse", body, skip=(BASE64,))
    assert all(len(base64.b64decode(d["embedding"])) % 4 == 0 for d in body["data"])
    with pytest.raises(AssertionError, match=r"data/\*/embedding"):  # the deviation is real, and caught unskipped
        check("CreateEmbeddingResponse", body)


def test_models_list(default_server):
    r = httpx.get(default_server.base + "/v1/models", timeout=30)
    assert r.status_code == 200
    check("ListModelsResponse", r.json())


# ------------------------------------------------------------ errors
ERRORS = {
    "unknown model": ("/v1/chat/completions", {"model": "no-such-model", "messages": FRANCE}, 404),
    "bad value": ("/v1/chat/completions", {"model": DEFAULT_NAME, "messages": FRANCE, "temperature": -1}, 400),
    "wrong type": ("/v1/completions", {"model": DEFAULT_NAME, "prompt": "x", "max_tokens": "many"}, 400),
    "missing field": ("/v1/responses", {"model": DEFAULT_NAME}, 400),
    "bad tool": ("/v1/responses", {"model": DEFAULT_NAME, "input": "x", "tools": [{"type": "web_search"}]}, 400),
    "unknown previous": ("/v1/responses", {"model": DEFAULT_NAME, "input": "x", "previous_response_id": "resp_x"},
                         404),
    "bad encoding": ("/v1/embeddings", {"model": DEFAULT_NAME, "input": "x", "encoding_format": "hex"}, 400),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_error_bodies(default_server, case):
    path, body, status = ERRORS[case]
    r = post(default_server, path, body)
    check_error(r, status)
    assert isinstance(r.json()["error"]["message"], str) and r.json()["error"]["message"]


def test_checks_can_fail():
    """The validators are live: a chat body without message.refusal, or with a string as `created`, fails."""
    good = {"id": "x", "object": "chat.completion", "created": 1, "model": "m", "choices": [
        {"index": 0, "finish_reason": "stop", "logprobs": None,
         "message": {"role": "assistant", "content": "hi", "refusal": None}}]}
    check("CreateChatCompletionResponse", good)
    del good["choices"][0]["message"]["refusal"]
    with pytest.raises(AssertionError, match="refusal"):
        check("CreateChatCompletionResponse", good)
    with pytest.raises(AssertionError, match="created"):
        check("CreateChatCompletionResponse", {**good, "created": "now"})


def test_deviations_are_documented():
    text = (ROOT / "docs" / "api_conformance.md").read_text()
    section = text.split("## Responses and deliberate deviations", 1)
    assert len(section) == 2, "docs/api_conformance.md lacks its 'Responses and deliberate deviations' section"
    for name, path in DEVIATIONS:
        assert f"`{name}` `{path}`" in section[1], (name, path)


# ------------------------------------------------------------ Anthropic Messages, through the SDK's types
ANTHROPIC_WEATHER = {"name": "get_weather", "description": "Current weather in a city",
                     "input_schema": WEATHER["function"]["parameters"]}
MESSAGES = {
    "plain": {"messages": FRANCE, "max_tokens": 16, "temperature": 0},
    "options": {"system": [{"type": "text", "text": "You are terse."}], "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Capital of France?"}]},
        {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And Spain?"}],
        "max_tokens": 12, "temperature": 0.7, "top_p": 0.9, "top_k": 20, "stop_sequences": ["."],
        "metadata": {"user_id": "u"}},
    "tools": {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [ANTHROPIC_WEATHER],
              "tool_choice": {"type": "any"}, "max_tokens": 40, "temperature": 0},
    "tool_result": {"messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny"}]}],
        "tools": [ANTHROPIC_WEATHER], "max_tokens": 16, "temperature": 0},
    "output_format": {"messages": [{"role": "user", "content": "Where is the Eiffel tower? JSON."}],
                      "max_tokens": 48, "temperature": 0,
                      "output_config": {"format": {"type": "json_schema", "schema": CITY_SCHEMA}}},
    "effort_and_thinking_off": {"messages": FRANCE, "max_tokens": 8, "output_config": {"effort": "low"},
                                "thinking": {"type": "disabled"}},
    "max_tokens": {"messages": FRANCE, "max_tokens": 2, "temperature": 0},
}


@pytest.mark.parametrize("case", sorted(MESSAGES))
def test_anthropic_message_bodies(default_server, case):
    check_message(ok(default_server, "/v1/messages", {"model": DEFAULT_NAME, **MESSAGES[case]}))


@pytest.mark.parametrize("case", sorted(MESSAGES))
def test_anthropic_stream_events(default_server, case):
    events = sse(default_server, "/v1/messages", {"model": DEFAULT_NAME, **MESSAGES[case]}, named=True)
    for event in events:
        check_event(event)
    assert events[0]["type"] == "message_start" and events[-1]["type"] == "message_stop"


def test_anthropic_errors_and_count_tokens(default_server):
    r = post(default_server, "/v1/messages", {"model": DEFAULT_NAME, "messages": FRANCE})  # max_tokens is required
    assert r.status_code == 400
    error = r.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    strict(TypeAdapter(anthropic.types.ErrorResponse).validate_python(error))
    counted = ok(default_server, "/v1/messages/count_tokens", {"model": DEFAULT_NAME, "messages": FRANCE})
    strict(anthropic.types.MessageTokensCount.model_validate(counted))


def test_newest_anthropic_sdk(default_server):
    """The installed SDK's own calls (this release has no temperature argument: output_config and thinking)."""
    client = anthropic.Anthropic(base_url=default_server.base, api_key="unused", max_retries=0)
    message = client.messages.create(model=DEFAULT_NAME, max_tokens=48, messages=[
        {"role": "user", "content": "Where is the Eiffel tower? JSON."}], extra_body={"temperature": 0},
        output_config={"format": {"type": "json_schema", "schema": CITY_SCHEMA}, "effort": "low"},
        thinking={"type": "disabled"})
    assert set(json.loads(message.content[0].text)) == {"city", "country"}
    with client.messages.stream(model=DEFAULT_NAME, max_tokens=40, tools=[ANTHROPIC_WEATHER],
                                tool_choice={"type": "tool", "name": "get_weather"},
                                messages=[{"role": "user", "content": "Weather in Paris?"}]) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use" and final.content[-1].type == "tool_use"
    assert set(final.content[-1].input) == {"city"}


def test_effort_without_reasoning_controls_is_reported_ignored(default_server):
    r = post(default_server, "/v1/messages", {"model": DEFAULT_NAME, "max_tokens": 4, "messages": FRANCE,
                                              "output_config": {"effort": "high"}})
    assert r.status_code == 200 and r.headers.get("x-vsurge-ignored") == "output_config.effort"
    r = post(default_server, "/v1/messages", {"model": DEFAULT_NAME, "max_tokens": 4, "messages": FRANCE})
    assert "x-vsurge-ignored" not in r.headers


OLD_CLIENT = r"""
import json, sys
import anthropic
assert anthropic.__version__ == "0.49.0", anthropic.__version__
client = anthropic.Anthropic(base_url=sys.argv[1], api_key="unused", max_retries=0)
france = [{"role": "user", "content": "What is the capital of France?"}]
message = client.messages.create(model=sys.argv[2], max_tokens=16, messages=france, temperature=0, top_p=1, top_k=5)
with client.messages.stream(model=sys.argv[2], max_tokens=16, messages=france, temperature=0,
                            system="You are terse.") as stream:
    final = stream.get_final_message()
tool = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                                                 "required": ["city"]}}
call = client.messages.create(model=sys.argv[2], max_tokens=40, temperature=0, tools=[tool],
                              tool_choice={"type": "any"}, messages=[{"role": "user", "content": "Weather in Paris?"}])
print(json.dumps({"text": message.content[0].text, "streamed": final.content[0].text, "stop": call.stop_reason,
                  "input": call.content[-1].input}))
"""


@pytest.mark.skipif(not OLD_ANTHROPIC.is_dir(), reason=f"{OLD_ANTHROPIC} is missing: `make test` installs "
                    "anthropic==0.49.0 there (pip install --target)")
def test_older_anthropic_sdk(default_server):
    """anthropic 0.49 (temperature, top_p, top_k as arguments) against the same server, in its own process."""
    env = {**os.environ, "PYTHONPATH": str(OLD_ANTHROPIC)}
    done = subprocess.run([sys.executable, "-c", OLD_CLIENT, default_server.base, DEFAULT_NAME], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["text"] == result["streamed"] and re.search(r"Paris", result["text"])
    assert result["stop"] == "tool_use" and set(result["input"]) == {"city"}
