"""POST /v1/responses on the real `vsurge serve` (the shared default server), through the real openai
SDK and the openai-agents SDK. Every streamed event is validated against the SDK's own typed models
(pydantic validation, not the SDK's lenient construction)."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from server_process import DEFAULT_NAME, client_for

FRANCE = "What is the capital of France?"
WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
EVENTS = TypeAdapter(ResponseStreamEvent)


def raw_events(server, body: dict) -> list[dict]:
    """The stream's events as sent, each validated by the SDK's typed model."""
    events = []
    with httpx.stream("POST", server.base + "/v1/responses", json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                EVENTS.validate_python(event)
                events.append(event)
    return events


def test_plain_response_and_its_shape(default_server):
    client = client_for(default_server)
    response = client.responses.create(model=DEFAULT_NAME, input=FRANCE, temperature=0)
    Response.model_validate(response.model_dump(exclude_unset=True))
    assert response.output_text == "The capital of France is Paris." and response.status == "completed"
    assert response.usage.input_tokens == 37 and response.usage.output_tokens == 8  # as chat: the same prompt
    assert [item.type for item in response.output] == ["message"]


def test_streamed_events_come_in_order_and_assemble_to_the_whole(default_server):
    events = raw_events(default_server, {"model": DEFAULT_NAME, "input": FRANCE, "temperature": 0})
    kinds = [e["type"] for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == "The capital of France is Paris." == events[-1]["response"]["output"][0]["content"][0]["text"]
    # the SDK's own stream helper agrees
    with client_for(default_server).responses.stream(model=DEFAULT_NAME, input=FRANCE, temperature=0) as stream:
        for _ in stream:
            pass
        assert stream.get_final_response().output_text == text


def test_forced_function_call_whole_and_streamed(default_server):
    client = client_for(default_server)
    response = client.responses.create(model=DEFAULT_NAME, input="Weather in Paris?", tools=[WEATHER_TOOL],
                                       tool_choice="required", temperature=0)
    (call,) = response.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    assert json.loads(call.arguments) == {"city": "Paris"}
    events = raw_events(default_server, {"model": DEFAULT_NAME, "input": "Weather in Paris?", "tools": [WEATHER_TOOL],
                                         "tool_choice": {"type": "function", "name": "get_weather"},
                                         "temperature": 0})
    added = next(e for e in events if e["type"] == "response.output_item.added")
    assert added["item"]["type"] == "function_call" and added["item"]["name"] == "get_weather"
    streamed = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    assert json.loads(streamed) == json.loads(done["arguments"]) == {"city": "Paris"}
    # the call's result goes back as function_call_output and the model answers with it
    follow = client.responses.create(model=DEFAULT_NAME, temperature=0, max_output_tokens=24, tools=[WEATHER_TOOL],
                                     input=[{"role": "user", "content": "Weather in Paris?"},
                                            {"type": "function_call", "call_id": call.call_id, "name": call.name,
                                             "arguments": call.arguments},
                                            {"type": "function_call_output", "call_id": call.call_id,
                                             "output": "Sunny, 25 C"}])
    assert follow.status in ("completed", "incomplete") and follow.output


def test_text_format_json_schema(default_server):
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
              "additionalProperties": False}
    response = client_for(default_server).responses.create(
        model=DEFAULT_NAME, input="Name a city in France.", temperature=0,
        text={"format": {"type": "json_schema", "name": "city", "schema": schema, "strict": True}})
    assert set(json.loads(response.output_text)) == {"city"}


def test_previous_response_id_store_get_and_delete(default_server):
    client = client_for(default_server)
    first = client.responses.create(model=DEFAULT_NAME, input=FRANCE, temperature=0, instructions="You are terse.")
    second = client.responses.create(model=DEFAULT_NAME, input="And of Germany?", previous_response_id=first.id,
                                     temperature=0)
    assert "Berlin" in second.output_text and second.previous_response_id == first.id
    # the follow-up saw the whole conversation: more input tokens than the question alone
    alone = client.responses.create(model=DEFAULT_NAME, input="And of Germany?", temperature=0, store=False)
    assert second.usage.input_tokens > alone.usage.input_tokens + first.usage.output_tokens
    assert client.responses.retrieve(first.id).output_text == first.output_text
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(alone.id)  # store=False: kept nowhere
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError, match="Previous response"):
        client.responses.create(model=DEFAULT_NAME, input="hi", previous_response_id=first.id)


def test_max_output_tokens_makes_it_incomplete(default_server):
    response = client_for(default_server).responses.create(model=DEFAULT_NAME, input=FRANCE, temperature=0,
                                                           max_output_tokens=3)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 3


BAD_BODIES = [
    ({"input": FRANCE, "model": "nope"}, 404, "does not exist", "model"),
    ({"input": []}, 400, "must not be empty", "input"),
    ({"input": [{"role": "wizard", "content": "hi"}]}, 400, "role", "input[0].role"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, 400,
     "not supported", "input[0].content[0].image_url"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, 400, "'web_search' is not supported", "tools[0].type"),
    ({"input": "hi", "tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "name": "nope"}}, 400, "nope",
     "tool_choice.name"),
    ({"input": "hi", "text": {"format": {"type": "xml"}}}, 400, "text.format.type", "text.format.type"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nonsense"}}}},
     400, "invalid JSON schema", "text.format.schema"),
    ({"input": "hi", "max_output_tokens": 0}, 400, "max_output_tokens must be at least 1", "max_output_tokens"),
    ({"input": "hi", "temperature": -1}, 400, "temperature must be non-negative", "temperature"),
    ({"input": "hi", "max_output_tokens": 5000}, 400, "maximum context length", None),
    ({"input": "hi", "previous_response_id": "resp_missing"}, 404, "not found", "previous_response_id"),
    ({"input": "hi", "background": True}, 400, "'background' is not supported", "background"),
    ({"input": 5}, 400, "input", "input"),
]


@pytest.mark.parametrize("body, status, message, param", BAD_BODIES)
def test_bad_input_gets_openai_error_json(default_server, body, status, message, param):
    r = default_server.post("/v1/responses", json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert message in error["message"] and error["param"] == param and error["type"] == "invalid_request_error"
    assert error["code"] is None or isinstance(error["code"], str)  # OpenAI's spec: a string or null


def test_garbage_then_a_good_request(default_server):
    for content in (b"{not json", b"[1, 2]", b'{"input": "\xff"}'):
        r = default_server.post("/v1/responses", content=content, headers={"content-type": "application/json"})
        assert r.status_code == 400 and "error" in r.json()
    assert default_server.get("/v1/responses/nope").status_code == 404
    assert default_server.delete("/v1/responses/nope").status_code == 404
    ok = client_for(default_server).responses.create(model=DEFAULT_NAME, input=FRANCE, temperature=0)
    assert ok.output_text == "The capital of France is Paris."


def test_an_openai_agents_turn_runs_over_responses(default_server):
    """The openai-agents SDK's Runner, with its Responses model, against the live server: a plain turn,
    and a turn whose required tool call runs the Python tool (stop_on_first_tool: its output is final)."""
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    model = OpenAIResponsesModel(model=DEFAULT_NAME, openai_client=openai.AsyncOpenAI(
        base_url=default_server.base + "/v1", api_key="unused", max_retries=0))
    seen = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        seen.append(city)
        return f"Sunny in {city}"

    async def turns():
        plain = Agent(name="assistant", instructions="You are terse.", model=model,
                      model_settings=ModelSettings(temperature=0))
        tooled = Agent(name="weather", instructions="Use the tools.", model=model, tools=[get_weather],
                       model_settings=ModelSettings(temperature=0, tool_choice="required"),
                       tool_use_behavior="stop_on_first_tool")
        return await Runner.run(plain, FRANCE), await Runner.run(tooled, "Weather in Paris?")

    plain, tooled = asyncio.run(turns())
    assert "Paris" in plain.final_output
    assert tooled.final_output == "Sunny in Paris" and seen == ["Paris"]
