"""Reasoning parsers (<think> splitting, GPT-OSS's harmony channels) and the output pipeline that feeds
content on to the tool-call parser: whole text and random streamed pieces must agree."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from vsurge.sampling.params import SamplingParams
from vsurge.server.adapters.common import GenerationRequest, output_parsers
from vsurge.structured.output_parser import OutputParser
from vsurge.structured.reasoning import DeepSeekR1Parser, GptOssParser, Qwen3Parser, get_reasoning_parser
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
    # harmony: the analysis channel is reasoning, final (and commentary) content; markers never leak
    (GptOssParser, "<|start|>assistant", "<|channel|>analysis<|message|>User wants the capital.<|end|>"
     "<|start|>assistant<|channel|>final<|message|>Paris.<|return|>", "User wants the capital.", "Paris."),
    (GptOssParser, "<|start|>assistant", "<|channel|>final<|message|>No reasoning, a < b.", None,
     "No reasoning, a < b."),
    (GptOssParser, "", "text without a header <|not a marker|>", None, "text without a header <|not a marker|>"),
    (GptOssParser, "<|start|>assistant", "<|channel|>analysis<|message|>cut off by max_tokens",
     "cut off by max_tokens", None),
    (GptOssParser, "<|start|>assistant<|channel|>analysis<|message|>", "opened by the prompt<|end|>"
     "<|start|>assistant<|channel|>final<|message|>answer", "opened by the prompt", "answer"),
    (GptOssParser, "", "<|channel|>analysis<|message|>one<|end|><|start|>assistant<|channel|>analysis<|message|>"
     "two<|end|><|start|>assistant<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant"
     "<|channel|>final<|message|>done<|return|>", "onetwo", "Checking.done"),
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


def test_a_parser_that_reads_special_tokens_makes_the_request_keep_them():
    server = SimpleNamespace(reasoning_parser="gpt_oss", tool_call_parser="auto")
    surge = SimpleNamespace(processor=SimpleNamespace(chat_template=None))
    request = GenerationRequest([[1, 2]], SamplingParams(max_tokens=4), prompt_text="<|start|>assistant")
    assert request.params.skip_special_tokens
    new_parser = output_parsers(server, request, surge)
    assert not request.params.skip_special_tokens and request.params.max_tokens == 4
    assert new_parser().parse("<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>final"
                              "<|message|>ok<|return|>")[:2] == ("hm", "ok")
    plain = GenerationRequest([[1, 2]], SamplingParams(max_tokens=4))
    output_parsers(SimpleNamespace(reasoning_parser="qwen3", tool_call_parser="auto"), plain, surge)
    assert plain.params.skip_special_tokens  # <think> tags are text: nothing changes


def test_unknown_parser_is_named():
    with pytest.raises(ValueError, match="unknown reasoning parser 'nope'.*deepseek_r1, qwen3, gpt_oss"):
        get_reasoning_parser("nope")
