"""POST /v1/messages and /v1/messages/count_tokens on the real `vsurge serve` (the shared default
server), through the real anthropic SDK. Streamed events are validated against the SDK's own typed
models; errors must be Anthropic's JSON. (This SDK release takes sampling settings through extra_body.)"""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from server_process import DEFAULT_NAME

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0}
WEATHER = {"name": "get_weather", "description": "Current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
EVENTS = TypeAdapter(RawMessageStreamEvent)


def client(server, **kw):
    return anthropic.Anthropic(base_url=server.base, api_key="unused", max_retries=0, **kw)


def test_create_whole_message(default_server):
    message = client(default_server).messages.create(model=DEFAULT_NAME, max_tokens=64, messages=FRANCE,
                                                     extra_body=GREEDY)
    Message.model_validate(message.model_dump(exclude_unset=True))
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == "The capital of France is Paris." and message.stop_reason == "end_turn"
    assert message.usage.input_tokens == 37 and message.usage.output_tokens == 8  # the chat prompt's tokens


def test_stream_event_sequence_and_the_sdk_stream_helper(default_server):
    body = {"model": DEFAULT_NAME, "max_tokens": 64, "messages": FRANCE, "system": "You are terse.", "stream": True,
            **GREEDY}
    events = []
    with httpx.stream("POST", default_server.base + "/v1/messages", json=body, timeout=120) as r:
        assert r.status_code == 200
        names = []
        for line in r.iter_lines():
            if line.startswith("event: "):
                names.append(line[7:])
            elif line.startswith("data: "):
                event = json.loads(line[6:])
                if event["type"] != "ping":  # keep-alive, not in the SDK's event union
                    EVENTS.validate_python(event)
                events.append(event)
    kinds = [e["type"] for e in events]
    assert names == kinds
    assert kinds[:3] == ["message_start", "ping", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[3:-3]) == {"content_block_delta"}
    assert events[-2]["delta"]["stop_reason"] == "end_turn" and events[-2]["usage"]["output_tokens"] > 0
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    with client(default_server).messages.stream(model=DEFAULT_NAME, max_tokens=64, messages=FRANCE,
                                                system="You are terse.", extra_body=GREEDY) as stream:
        assert "".join(stream.text_stream) == text
        final = stream.get_final_message()
    assert final.content[0].text == text and final.stop_reason == "end_turn"


def test_tool_use_round_trip(default_server):
    c = client(default_server)
    message = c.messages.create(model=DEFAULT_NAME, max_tokens=64, tools=[WEATHER], tool_choice={"type": "any"},
                                messages=[{"role": "user", "content": "Weather in Paris?"}], extra_body=GREEDY)
    (use,) = message.content
    assert use.type == "tool_use" and use.name == "get_weather" and use.input == {"city": "Paris"}
    assert message.stop_reason == "tool_use"
    with c.messages.stream(model=DEFAULT_NAME, max_tokens=64, tools=[WEATHER],
                           tool_choice={"type": "tool", "name": "get_weather"},
                           messages=[{"role": "user", "content": "Weather in Paris?"}], extra_body=GREEDY) as stream:
        streamed = stream.get_final_message()
    assert streamed.content[0].type == "tool_use" and streamed.content[0].input == {"city": "Paris"}
    # the result goes back as a tool_result block; the model answers
    answer = c.messages.create(model=DEFAULT_NAME, max_tokens=32, tools=[WEATHER], extra_body=GREEDY, messages=[
        {"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": message.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 25 C"}]}])
    assert answer.content and answer.stop_reason in ("end_turn", "max_tokens", "tool_use")
    none = c.messages.create(model=DEFAULT_NAME, max_tokens=64, tools=[WEATHER], tool_choice={"type": "none"},
                             messages=FRANCE, extra_body=GREEDY)
    assert [b.type for b in none.content] == ["text"]


def test_stop_sequences_and_max_tokens(default_server):
    c = client(default_server)
    stopped = c.messages.create(model=DEFAULT_NAME, max_tokens=64, messages=FRANCE, stop_sequences=["Paris"],
                                extra_body=GREEDY)
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == "Paris"
    assert stopped.content[0].text == "The capital of France is "
    cut = c.messages.create(model=DEFAULT_NAME, max_tokens=3, messages=FRANCE, extra_body=GREEDY)
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3


def test_count_tokens_matches_the_prompt(default_server):
    c = client(default_server)
    assert c.messages.count_tokens(model=DEFAULT_NAME, messages=FRANCE).input_tokens == 37
    with_system = c.messages.count_tokens(model=DEFAULT_NAME, messages=FRANCE, system="You are terse.")
    message = c.messages.create(model=DEFAULT_NAME, max_tokens=4, messages=FRANCE, system="You are terse.",
                                extra_body=GREEDY)
    assert with_system.input_tokens == message.usage.input_tokens


BAD_BODIES = [
    ({"model": "nope", "max_tokens": 8, "messages": FRANCE}, 404, "not_found_error", "does not exist"),
    ({"messages": FRANCE}, 400, "invalid_request_error", "'max_tokens' is a required field"),
    ({"max_tokens": 0, "messages": FRANCE}, 400, "invalid_request_error", "max_tokens must be at least 1"),
    ({"max_tokens": 8, "messages": []}, 400, "invalid_request_error", "at least one message"),
    ({"max_tokens": 8, "messages": [{"role": "system", "content": "x"}]}, 400, "invalid_request_error", "role"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, 400,
     "invalid_request_error", "image inputs are not supported by this model"),
    ({"max_tokens": 8, "messages": FRANCE, "tools": [{"name": "f", "input_schema": {"type": "nonsense"}}]}, 400,
     "invalid_request_error", "input_schema"),
    ({"max_tokens": 8, "messages": FRANCE, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}},
     400, "invalid_request_error", "nope"),
    ({"max_tokens": 8, "messages": FRANCE, "tool_choice": {"type": "sometimes"}}, 400, "invalid_request_error",
     "tool_choice.type"),
    ({"max_tokens": 8, "messages": FRANCE, "stop_sequences": [""]}, 400, "invalid_request_error",
     "stop_sequences cannot contain an empty string"),
    ({"max_tokens": 8, "messages": FRANCE, "top_k": -3}, 400, "invalid_request_error", "top_k"),
    ({"max_tokens": 5000, "messages": FRANCE}, 400, "invalid_request_error", "maximum context length"),
    ({"max_tokens": 8, "messages": FRANCE, "thinking": {"type": "maybe"}}, 400, "invalid_request_error", "thinking"),
]


@pytest.mark.parametrize("body, status, kind, message", BAD_BODIES)
def test_bad_input_gets_anthropic_error_json(default_server, body, status, kind, message):
    r = default_server.post("/v1/messages", json=body)
    assert r.status_code == status, r.text
    payload = r.json()
    assert payload["type"] == "error" and payload["error"]["type"] == kind and message in payload["error"]["message"]


def test_sdk_raises_typed_errors_and_the_server_keeps_serving(default_server):
    c = client(default_server)
    with pytest.raises(anthropic.NotFoundError):
        c.messages.create(model="missing", max_tokens=8, messages=FRANCE)
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        c.messages.create(model=DEFAULT_NAME, max_tokens=0, messages=FRANCE)
    for content in (b"{not json", b'{"max_tokens": 8, "messages": "\xff"}'):
        r = default_server.post("/v1/messages", content=content, headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["type"] == "error"
    r = default_server.post("/v1/messages/count_tokens", json={"messages": [{"role": "bot", "content": "x"}]})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    ok = c.messages.create(model=DEFAULT_NAME, max_tokens=64, messages=FRANCE, extra_body=GREEDY)
    assert ok.content[0].text == "The capital of France is Paris."
