"""Tool-calling conversations through chat templates: with tools support and without."""

from __future__ import annotations

import json

import pytest
from chat_templates import QWEN2_TOOLS_TEMPLATE

from vsurge.structured.tool_parsers import HermesParser
from vsurge.tokenizer.chat_template import ChatTemplateError, normalize_messages, render_chat_template
from vsurge.tokenizer.tool_prompt import template_supports_tools

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CONVERSATION = [
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"celsius": 21}'},
    {"role": "tool", "tool_call_id": "call_2", "content": '{"celsius": 25}'},
]
SMOLLM_TEMPLATE = (  # the default model's: no tools support
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

EXPECTED_QWEN2 = """<|im_start|>system
You are a helpful assistant.

# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{"type": "function", "function": {"name": "get_weather", "description": "Current weather", \
"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> \
XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
<|im_start|>user
Weather in Paris and Rome?<|im_end|>
<|im_start|>assistant
<tool_call>
{"name": "get_weather", "arguments": {"city": "Paris"}}
</tool_call>
<tool_call>
{"name": "get_weather", "arguments": {"city": "Rome"}}
</tool_call><|im_end|>
<|im_start|>user
<tool_response>
{"celsius": 21}
</tool_response>
<tool_response>
{"celsius": 25}
</tool_response><|im_end|>
<|im_start|>assistant
"""


def test_normalize_keeps_calls_and_decodes_arguments():
    messages = normalize_messages(CONVERSATION)
    calls = messages[1]["tool_calls"]
    assert [c["function"]["arguments"] for c in calls] == [{"city": "Paris"}, {"city": "Rome"}]
    assert messages[1]["content"] == "" and messages[2]["tool_call_id"] == "call_1"
    assert CONVERSATION[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'  # input untouched
    with pytest.raises(ChatTemplateError, match=r"messages\[0\].tool_calls\[0\]"):
        normalize_messages([{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}])


def test_tool_capable_template_round_trip():
    assert template_supports_tools(QWEN2_TOOLS_TEMPLATE)
    text = render_chat_template(QWEN2_TOOLS_TEMPLATE, CONVERSATION, tools=TOOLS)
    assert text == EXPECTED_QWEN2
    # what the model wrote comes back as the same calls
    answer = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    content, calls = HermesParser().parse(answer)
    assert content is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == \
           [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]


def test_template_without_tools_gets_them_in_the_system_message():
    assert not template_supports_tools(SMOLLM_TEMPLATE)
    text = render_chat_template(SMOLLM_TEMPLATE, CONVERSATION, tools=TOOLS)
    assert text.startswith("<|im_start|>system\n# Tools\n") and "named SmolLM" not in text
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in text
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            '</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n'
            '</tool_call><|im_end|>') in text
    assert "<|im_start|>user\n<tool_response>\n{\"celsius\": 21}\n</tool_response>\n<tool_response>\n" \
           "{\"celsius\": 25}\n</tool_response><|im_end|>" in text
    assert "<|im_start|>tool" not in text
    with_system = render_chat_template(SMOLLM_TEMPLATE, [{"role": "system", "content": "Be brief."}] + CONVERSATION,
                                       tools=TOOLS)
    assert with_system.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")


def test_no_tools_renders_as_before():
    messages = [{"role": "user", "content": "Hi"}]
    plain = render_chat_template(SMOLLM_TEMPLATE, messages)
    assert plain == render_chat_template(SMOLLM_TEMPLATE, messages, tools=None)
    assert "# Tools" not in render_chat_template(QWEN2_TOOLS_TEMPLATE, messages)


def test_processor_apply_chat_template_takes_tools():
    from structured_helpers import processor

    from vsurge.tokenizer.compat import chat_prompt_ids

    p = processor()
    text = p.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False)
    assert "# Tools" in text and text.endswith("<|im_start|>assistant\n")
    assert p.decode(chat_prompt_ids(p, CONVERSATION, tools=TOOLS)) == text
