"""Tool calling: tools / tool_choice validation, forced calls, and the output parsers
(whole text and streamed deltas must assemble to the same calls)."""

from __future__ import annotations

import json
import random
import re

import pytest

from vsurge.structured.errors import ParamError
from vsurge.structured.tool_calls import DeltaAssembler
from vsurge.structured.tool_parsers import (HermesParser, Llama3JsonParser, NamedCallParser, RequiredCallsParser,
                                            get_tool_parser, parser_for_template)
from vsurge.structured.tools import ToolCallConfig, assistant_message, finish_reason_with_calls

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}
SEARCH = {"type": "function", "function": {
    "name": "web_search", "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                                         "required": ["query"]}}}
CALL_ID = re.compile(r"^call_[A-Za-z0-9]{24}$")


def stream(parser, text: str, seed: int):
    """Feed `text` in random pieces; assemble the deltas as the openai client does."""
    rng, assembler, pieces, i = random.Random(seed), DeltaAssembler(), [], 0
    while i < len(text):
        j = i + rng.randint(1, 7)
        pieces += parser.feed(text[i:j])
        i = j
    pieces += parser.finish()
    for delta in pieces:
        assembler.add(delta)
    return assembler, pieces


def calls_of(tool_calls):
    return [(c["function"]["name"], c["function"]["arguments"]) for c in tool_calls]


HERMES_CASES = [
    ('I will look it up. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
     '</tool_call>\n<tool_call>\n{"name": "web_search", "arguments": {"query": "a \\"quoted\\" <tool_call> {x}"}}\n'
     '</tool_call>',
     "I will look it up.", [("get_weather", '{"city": "Paris", "unit": "celsius"}'),
                            ("web_search", '{"query": "a \\"quoted\\" <tool_call> {x}"}')]),
    ("Plain answer: 2 < 3, and <tool is not a tag.  ", "Plain answer: 2 < 3, and <tool is not a tag.  ", []),
    ('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\nDone.', "Done.", [("f", "{}")]),
    ('<tool_call>{"arguments": {"a": [1, {"b": 2}]}, "name": "late"}', None, [("late", '{"a": [1, {"b": 2}]}')]),
    ('<tool_call>\n{"name": "s", "arguments": "{\\"q\\": 1}"}\n</tool_call>', None, [("s", '{"q": 1}')]),
    ("<tool_call>\nnot json\n</tool_call> ok", "<tool_call>\nnot json\n</tool_call> ok", []),
]


@pytest.mark.parametrize("text, content, calls", HERMES_CASES)
def test_hermes_whole_and_streamed_agree(text, content, calls):
    whole_content, whole_calls = HermesParser().parse(text)
    assert (whole_content, calls_of(whole_calls)) == (content, calls)
    for seed in range(25):
        assembled, _ = stream(HermesParser(), text, seed)
        assert calls_of(assembled.tool_calls) == calls
        assert (assembled.content or None) == content


def test_streamed_pieces_have_the_openai_shape():
    text = HERMES_CASES[0][0]
    _, pieces = stream(HermesParser(), text, seed=1)
    calls = [d["tool_calls"][0] for d in pieces if "tool_calls" in d]
    heads = [c for c in calls if "id" in c]
    assert [h["index"] for h in heads] == [0, 1]
    for head in heads:
        assert CALL_ID.match(head["id"]) and head["type"] == "function"
        assert head["function"]["arguments"] == "" and head["function"]["name"]
    for piece in calls:
        if "id" not in piece:
            assert set(piece) == {"index", "function"} and set(piece["function"]) == {"arguments"}
    first_call = next(i for i, d in enumerate(pieces) if "tool_calls" in d)
    assert all("content" in d for d in pieces[:first_call])  # text before the call streams as content


def test_the_openai_client_assembles_the_same_call():
    """The official client's stream accumulator rebuilds what the non-streamed response has."""
    from openai.lib.streaming.chat._completions import ChatCompletionStreamState
    from openai.types.chat import ChatCompletionChunk

    def chunk(delta, finish_reason=None):
        return ChatCompletionChunk.model_validate({
            "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]})

    text = HERMES_CASES[0][0]
    state = ChatCompletionStreamState()
    _, pieces = stream(HermesParser(), text, seed=3)
    for delta in [{"role": "assistant"}] + pieces:
        state.handle_chunk(chunk(delta))
    state.handle_chunk(chunk({}, "tool_calls"))
    message = state.get_final_completion().choices[0].message
    content, calls = HermesParser().parse(text)
    assert message.content == content
    assert [(c.function.name, c.function.arguments) for c in message.tool_calls] == calls_of(calls)


LLAMA3_CASES = [
    ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "celsius"}}; '
     '{"name": "web_search", "parameters": {"query": "fjords"}}',
     None, [("get_weather", '{"city": "Oslo", "unit": "celsius"}'), ("web_search", '{"query": "fjords"}')]),
    ('  {"type": "function", "name": "f", "parameters": {"x": [1, 2]}}', None, [("f", '{"x": [1, 2]}')]),
    ('{"answer": 42}', '{"answer": 42}', []),
    ('The call would be {"name": "f"}', 'The call would be {"name": "f"}', []),
]


@pytest.mark.parametrize("text, content, calls", LLAMA3_CASES)
def test_llama3_json_whole_and_streamed_agree(text, content, calls):
    whole_content, whole_calls = Llama3JsonParser().parse(text)
    assert (whole_content, calls_of(whole_calls)) == (content, calls)
    for seed in range(25):
        assembled, _ = stream(Llama3JsonParser(), text, seed)
        assert calls_of(assembled.tool_calls) == calls and (assembled.content or None) == content


def test_forced_call_parsers():
    _, calls = NamedCallParser("get_weather").parse('{"city": "Rome", "unit": "celsius"}')
    assert calls_of(calls) == [("get_weather", '{"city": "Rome", "unit": "celsius"}')]
    text = '[{"name": "get_weather", "arguments": {"city": "Rome", "unit": "celsius"}}, ' \
           '{"name": "web_search", "arguments": {"query": "pasta"}}]'
    _, calls = RequiredCallsParser().parse(text)
    assert calls_of(calls) == [("get_weather", '{"city": "Rome", "unit": "celsius"}'),
                               ("web_search", '{"query": "pasta"}')]
    for seed in range(10):
        assert calls_of(stream(RequiredCallsParser(), text, seed)[0].tool_calls) == calls_of(calls)
        assert calls_of(stream(NamedCallParser("f"), '{"a": 1}', seed)[0].tool_calls) == [("f", '{"a": 1}')]


def test_required_tool_choice_walks_parse_into_valid_calls():
    """tool_choice="required": whatever the grammar lets through parses into calls whose
    arguments follow each tool's schema."""
    import jsonschema
    from structured_helpers import processor, walk_text

    from vsurge.structured.compiler import compiler_for

    config = ToolCallConfig.from_request([WEATHER, SEARCH], "required", parallel_tool_calls=False)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, SEARCH)}
    for seed in range(3):
        text = walk_text(compiler_for(processor()).matcher(config.constraint(), [2]), seed)
        _, calls = config.parser().parse(text)
        assert len(calls) == 1  # parallel_tool_calls=false: exactly one
        for call in calls:
            jsonschema.validate(json.loads(call["function"]["arguments"]), schemas[call["function"]["name"]])
    named = ToolCallConfig.from_request([WEATHER, SEARCH], {"type": "function", "function": {"name": "web_search"}})
    text = walk_text(compiler_for(processor()).matcher(named.constraint(), [2]), seed=0)
    (call,) = named.parser().parse(text)[1]
    assert call["function"]["name"] == "web_search" and "query" in json.loads(call["function"]["arguments"])


@pytest.mark.parametrize("tools, tool_choice, param, message", [
    ([{"type": "retrieval"}], None, "tools[0].type", "must be 'function'"),
    ([{"type": "function", "function": {"name": "has space"}}], None, "tools[0].function.name", "1-64 letters"),
    ([WEATHER, WEATHER], None, "tools[1].function.name", "given twice"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}], None,
     "tools[0].function.parameters", "not a usable JSON schema"),
    ([WEATHER], {"type": "function", "function": {"name": "get_time"}}, "tool_choice.function.name",
     "'get_time', which is not among the tools (get_weather)"),
    ([WEATHER], "sometimes", "tool_choice", "must be one of"),
    (None, "required", "tool_choice", "needs 'tools'"),
])
def test_tool_errors_name_the_param(tools, tool_choice, param, message):
    with pytest.raises(ParamError, match=re.escape(message)) as info:
        ToolCallConfig.from_request(tools, tool_choice)
    assert info.value.param == param


def test_tool_choice_modes():
    auto = ToolCallConfig.from_request([WEATHER])
    assert auto.choice.mode == "auto" and auto.constraint() is None and isinstance(auto.parser(), HermesParser)
    assert ToolCallConfig.from_request([WEATHER], "none").template_tools() is None
    assert ToolCallConfig.from_request([WEATHER], "none").parser() is None
    assert ToolCallConfig.from_request(None) is None
    named = ToolCallConfig.from_request([WEATHER], {"type": "function", "function": {"name": "get_weather"}})
    assert named.constraint().json == WEATHER["function"]["parameters"]
    parallel = ToolCallConfig.from_request([WEATHER, SEARCH], "required").constraint().json
    assert parallel["minItems"] == 1 and "maxItems" not in parallel and len(parallel["items"]["anyOf"]) == 2


def test_parser_choice_from_the_template():
    assert parser_for_template("...<tool_call>\\n{{ tool_call | tojson }}</tool_call>") == "hermes"
    assert parser_for_template('{{- "<|python_tag|>" }} {"name": ..., "parameters": ...}') == "llama3_json"
    assert parser_for_template(None) == "hermes"  # vsurge's own tools prompt asks for that format
    assert get_tool_parser("llama3_json") is Llama3JsonParser
    with pytest.raises(ValueError, match="unknown tool-call parser 'granite'"):
        get_tool_parser("granite")


def test_response_helpers():
    calls = [{"id": "call_x", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    assert finish_reason_with_calls("stop", calls) == "tool_calls"
    assert finish_reason_with_calls("length", calls) == "length"
    assert finish_reason_with_calls("stop", []) == "stop"
    assert assistant_message(None, calls) == {"role": "assistant", "content": None, "tool_calls": calls}
    assert assistant_message("hi", []) == {"role": "assistant", "content": "hi"}
