"""Structured outputs and tool calling end to end: the real server, the official openai client.

The default model (SmolLM2-135M) cannot be trusted to write valid JSON by itself:
every check here holds because the engine masks the logits with the grammar.
"""

from __future__ import annotations

import concurrent.futures
import json
import re

import jsonschema
import pydantic
import pytest

from server_process import DEFAULT_NAME, client_for

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}]
WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]


class Person(pydantic.BaseModel):
    name: str
    age: int
    hobbies: list[str]


def ask(text):
    return [{"role": "user", "content": text}]


@pytest.fixture(scope="module")
def client(default_server):
    return client_for(default_server)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_parse_with_a_pydantic_model(client, temperature):
    for i, prompt in enumerate(["Describe a person who likes chess.", "Invent a pirate.", "Who are you?"]):
        reply = client.chat.completions.parse(model=DEFAULT_NAME, messages=ask(prompt), response_format=Person,
                                              temperature=temperature, seed=i, max_tokens=200,
                                              extra_body={"repetition_penalty": 1.1})  # a 135M model loops without
        choice = reply.choices[0]
        assert choice.finish_reason == "stop", choice
        assert isinstance(choice.message.parsed, Person)


def test_json_object_regex_and_choice_outputs_validate(client):
    out = client.chat.completions.create(model=DEFAULT_NAME, messages=ask("Give me a JSON object about cats."),
                                         response_format={"type": "json_object"}, max_tokens=100, temperature=0,
                                         extra_body={"repetition_penalty": 1.1})
    assert out.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(out.choices[0].message.content), dict)
    regex = r"[A-Z][a-z]{2,9}, [0-9]{4}"
    out = client.chat.completions.create(model=DEFAULT_NAME, messages=ask("A city and a year?"), temperature=0.7,
                                         max_tokens=30, seed=3, extra_body={"guided_regex": regex})
    assert re.fullmatch(regex, out.choices[0].message.content)
    out = client.completions.create(model=DEFAULT_NAME, prompt="The sky is", max_tokens=10, temperature=1.0,
                                    extra_body={"structured_outputs": {"choice": ["blue", "green", "on fire"]}})
    assert out.choices[0].text in ("blue", "green", "on fire")


def test_constrained_and_free_rows_share_the_batch(client):
    """16 concurrent requests, every other one constrained: all constrained ones validate, the free
    ones are plain text (that free rows equal their unconstrained output is checked in float32, where
    greedy decoding is batch-invariant: tests/structured/test_structured_engine.py)."""
    schema = Person.model_json_schema()
    questions = [f"Tell me about person number {i}." for i in range(16)]

    def one(i):
        extra = {"guided_json": schema, "repetition_penalty": 1.1} if i % 2 else {}
        out = client.chat.completions.create(model=DEFAULT_NAME, messages=ask(questions[i]), max_tokens=60,
                                             temperature=0, extra_body=extra)
        return out.choices[0].message.content, out.choices[0].finish_reason

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        outputs = list(pool.map(one, range(16)))
    for i, (text, finish) in enumerate(outputs):
        if i % 2:
            assert finish == "stop", text
            jsonschema.validate(json.loads(text), schema)
        else:
            assert text and not text.lstrip().startswith("{")  # the masks never reach free rows


def test_required_tool_call_validates_and_streams_the_same(client):
    whole = client.chat.completions.create(model=DEFAULT_NAME, messages=WEATHER, tools=TOOLS, tool_choice="required",
                                           temperature=0, max_tokens=80)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), TOOLS[0]["function"]["parameters"])

    with client.chat.completions.stream(model=DEFAULT_NAME, messages=WEATHER, tools=TOOLS, tool_choice="required",
                                        temperature=0, max_tokens=80) as stream:
        streamed = stream.get_final_completion().choices[0]
    assert streamed.finish_reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in streamed.message.tool_calls] == \
        [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls]

    named = client.chat.completions.create(model=DEFAULT_NAME, messages=WEATHER, tools=TOOLS, temperature=0,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                           max_tokens=80)
    assert named.choices[0].message.tool_calls[0].function.name == "get_weather"

    # the tool's result goes back as a `tool` message and the chat continues with text
    history = WEATHER + [choice.message.model_dump(exclude_none=True),
                         {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21, "sky": "sunny"}'}]
    follow = client.chat.completions.create(model=DEFAULT_NAME, messages=history, tools=TOOLS, tool_choice="none",
                                            temperature=0, max_tokens=40)
    assert follow.choices[0].message.content and not follow.choices[0].message.tool_calls


def test_bad_constraints_are_400s_and_the_server_keeps_serving(client, default_server):
    cases = [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
         "invalid JSON schema"),
        ({"guided_regex": "[a-"}, "regex"),
        ({"guided_regex": "a{3}b{0}[^\\x00-\\U0010FFFF]"}, "cannot match"),
        ({"guided_choice": []}, "choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "fly"}}}, "fly"),
        ({"guided_json": {"type": "object"}, "guided_regex": "a"}, "not several"),
    ]
    for extra, message in cases:
        r = default_server.post("/v1/chat/completions", json={"messages": WEATHER, "max_tokens": 5, **extra})
        assert r.status_code == 400 and message in r.json()["error"]["message"], (extra, r.text)
    ok = client.chat.completions.create(model=DEFAULT_NAME, messages=ask("What is the capital of France?"),
                                        temperature=0, max_tokens=16)
    assert ok.choices[0].message.content == "The capital of France is Paris."
