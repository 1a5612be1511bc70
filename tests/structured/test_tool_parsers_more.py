"""The mistral, pythonic and qwen3_coder tool-call formats: whole text and random streamed pieces
must assemble to the same content and calls (as the openai client assembles them)."""

from __future__ import annotations

import json

import pytest

from test_structured_tools import calls_of, stream
from vsurge.structured.tool_parsers import get_tool_parser, parser_for_template
from vsurge.structured.tool_parsers_more import MistralParser, PythonicParser, Qwen3CoderParser
from vsurge.structured.tools import validate_tools

TOOLS = validate_tools([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
        "where": {"type": "object"}, "code": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}},
])

CASES = [
    (MistralParser, 'Let me check.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
                    '{"name": "now", "arguments": {}}]',
     "Let me check.", [("get_weather", '{"city": "Paris"}'), ("now", "{}")]),
    (MistralParser, '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 2}[TOOL_CALLS]now[ARGS]{}',
     None, [("get_weather", '{"city": "Paris", "days": 2}'), ("now", "{}")]),
    (MistralParser, "No [TOOL calls here, [1, 2] [TOOL_CALL", "No [TOOL calls here, [1, 2] [TOOL_CALL", []),
    (PythonicParser, '[get_weather(city="Paris", days=3), now()]',
     None, [("get_weather", '{"city": "Paris", "days": 3}'), ("now", "{}")]),
    (PythonicParser, '<|python_start|>[get_weather(city="Rome")]<|python_end|>', None,
     [("get_weather", '{"city": "Rome"}')]),
    (PythonicParser, "[1, 2, 3] is a list.", "[1, 2, 3] is a list.", []),
    (PythonicParser, "Plain text answer.", "Plain text answer.", []),
    (Qwen3CoderParser, "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n</parameter>\n"
                       "<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n"
                       "<parameter=where>\n{\"lat\": 1.5}\n</parameter>\n<parameter=code>\n007\n</parameter>\n"
                       "</function>\n</tool_call>\n<tool_call>\n<function=now>\n</function>\n</tool_call>",
     "Checking.", [("get_weather", '{"city": "San Francisco", "days": 3, "metric": true, "where": {"lat": 1.5}, '
                                   '"code": "007"}'), ("now", "{}")]),
    (Qwen3CoderParser, "Use <b>bold</b> here.", "Use <b>bold</b> here.", []),
]


@pytest.mark.parametrize("cls, text, content, calls", CASES)
def test_whole_and_streamed_agree(cls, text, content, calls):
    whole_content, whole_calls = cls(tools=TOOLS).parse(text)
    assert (whole_content, calls_of(whole_calls)) == (content, calls)
    for call in whole_calls:
        json.loads(call["function"]["arguments"])  # always valid JSON
    for seed in range(25):
        assembled, _ = stream(cls(tools=TOOLS), text, seed)
        assert calls_of(assembled.tool_calls) == calls, seed
        assert (assembled.content or None) == content, seed


def test_qwen3_coder_without_schemas_guesses_json_values():
    text = "<tool_call>\n<function=f>\n<parameter=n>\n42\n</parameter>\n<parameter=s>\nhello\n</parameter>\n</function>"
    _, calls = Qwen3CoderParser().parse(text)
    assert json.loads(calls[0]["function"]["arguments"]) == {"n": 42, "s": "hello"}


def test_auto_reads_the_template():
    assert parser_for_template("{{ '<function=' }}{{ '<parameter=' }}<tool_call>") == "qwen3_coder"
    assert parser_for_template("[AVAILABLE_TOOLS][TOOL_CALLS]") == "mistral"
    assert get_tool_parser("pythonic") is PythonicParser
