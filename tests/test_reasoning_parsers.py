"""Reasoning parsers (<think> splitting) and the output pipeline that feeds content on to the tool-call
parser: whole text and random streamed pieces must agree."""

from __future__ import annotations

import random

import pytest

from vsurge.structured.output_parser import OutputParser
from vsurge.structured.reasoning import DeepSeekR1Parser, Qwen3Parser, get_reasoning_parser
from vsurge.structured.tool_parsers import HermesParser

CASES = [
    # parser, prompt tail, output, reasoning, content
    (Qwen3Parser, "", "<think>\nLet me think.\n</think>\n\nParis.", "Let me think.", "Paris."),
    (Qwen3Parser, "", "Paris, without thinking.", None, "Paris, without thinking."),
    (Qwen3Parser, "", "  <think>a < b, and </thin is not a tag</think>ok", "a < b, and </thin is not a tag", "ok"),
    (Qwen3Parser, "<|im_start|>assistant\n<think>\n", "opened by the prompt\n</think>\n\nanswer",
     "opened by the prompt", "answer"),
    (Qwen3Parser, "", "<think>cut off by max_tokens", "cut off by max_tokens", None),
    (Qwen3Parser, "<think>\n\n</think>\n\n", "thinking was switched off", None, "thinking was switched off"),
    (DeepSeekR1Parser, "", "no opening tag</think>The answer.", "no opening tag", "The answer."),
    (DeepSeekR1Parser, "", "<think>tagged</think>The answer.", "tagged", "The answer."),
    (DeepSeekR1Parser, "", "all reasoning, never closed", "all reasoning, never closed", None),
]


def streamed(parser, text: str, seed: int):
    rng, reasoning, content, i = random.Random(seed), "", "", 0
    while i < len(text):
        j = i + rng.randint(1, 5)
        r, c = parser.feed(text[i:j])
        reasoning, content, i = reasoning + r, content + c, j
    r, c = parser.finish()
    return (reasoning + r) or None, (content + c) or None


@pytest.mark.parametrize("cls, prompt, text, reasoning, content", CASES)
def test_whole_and_streamed_split_agree(cls, prompt, text, reasoning, content):
    assert cls(prompt).split(text) == (reasoning, content)
    for seed in range(20):
        assert streamed(cls(prompt), text, seed) == (reasoning, content), seed


def test_tool_calls_after_reasoning_still_parse():
    text = ('<think>The user wants the weather; call the tool.</think>\n<tool_call>\n'
            '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    reasoning, content, calls = OutputParser(Qwen3Parser(), HermesParser()).parse(text)
    assert reasoning == "The user wants the weather; call the tool." and content is None
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [("get_weather", '{"city": "Paris"}')]
    for seed in range(10):
        rng, parser, pieces, i = random.Random(seed), OutputParser(Qwen3Parser(), HermesParser()), [], 0
        while i < len(text):
            j = i + rng.randint(1, 6)
            pieces += parser.feed(text[i:j], final=j >= len(text))
            i = j
        assert "".join(p.text for p in pieces if p.kind == "reasoning") == reasoning
        assert not [p for p in pieces if p.kind == "content"]
        assert [p.call["function"]["name"] for p in pieces if p.starts_call] == ["get_weather"]
        assert "".join(p.call["function"].get("arguments", "") for p in pieces if p.kind == "call") == '{"city": "Paris"}'


def test_unknown_parser_is_named():
    with pytest.raises(ValueError, match="unknown reasoning parser 'nope'.*deepseek_r1, qwen3"):
        get_reasoning_parser("nope")
