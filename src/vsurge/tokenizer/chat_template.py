"""Render a model's Jinja chat template the way transformers does (sandboxed, trimmed blocks)."""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .tool_prompt import inline_tools, template_supports_tools

VALID_ROLES = ("system", "user", "assistant", "tool", "developer")


class ChatTemplateError(ValueError):
    """The messages or the template cannot be rendered."""


def _raise(message):
    raise ChatTemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(f"the chat template does not parse: {e}") from None


def normalize_messages(messages, parts: bool = False) -> list[dict]:
    """Check OpenAI-style messages; flatten text-part lists into one string. parts: keep every content
    as a list of parts instead, {"type": "text", "text"} and {"type": "image"} (a vision-language
    template's form: it writes its image placeholder for each image part).

    Assistant `tool_calls` are kept, their `function.arguments` turned from JSON text
    (OpenAI's form) into objects (what HF templates expect: they write `arguments | tojson`);
    a tool message keeps its `tool_call_id`."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ChatTemplateError("messages must be a non-empty list of {'role', 'content'} objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m:
            raise ChatTemplateError(f"messages[{i}] must be an object with 'role' and 'content'")
        if m["role"] not in VALID_ROLES:
            raise ChatTemplateError(f"messages[{i}].role {m['role']!r} is not one of {', '.join(VALID_ROLES)}")
        content = m.get("content")
        if content is None:
            content = ""
        if parts:
            content = _parts(content, i)
        elif isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ChatTemplateError(f"messages[{i}].content[{j}] must be a text part {{'type': 'text', 'text': ...}}")
                texts.append(part["text"])
            content = "".join(texts)
        if not isinstance(content, (list, str)):
            raise ChatTemplateError(f"messages[{i}].content must be a string or a list of text parts")
        message = {**m, "content": content}
        if m.get("tool_calls") is not None:
            message["tool_calls"] = _normalize_tool_calls(m["tool_calls"], f"messages[{i}].tool_calls")
        if m.get("tool_call_id") is not None and not isinstance(m["tool_call_id"], str):
            raise ChatTemplateError(f"messages[{i}].tool_call_id must be a string")
        out.append(message)
    return out


def _parts(content, i: int) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    out = []
    for j, part in enumerate(content if isinstance(content, list) else ()):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "image":
            out.append({"type": "image"})
        elif kind == "text" and isinstance(part.get("text"), str):
            out.append({"type": "text", "text": part["text"]})
        else:
            raise ChatTemplateError(f"messages[{i}].content[{j}] must be a text or image part")
    return out


def _normalize_tool_calls(calls, where: str) -> list[dict]:
    if not isinstance(calls, list):
        raise ChatTemplateError(f"{where} must be a list")
    out = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ChatTemplateError(f"{where}[{j}] must be {{'type': 'function', 'function': {{'name', 'arguments'}}}}")
        arguments = function.get("arguments")
        if arguments is None:
            arguments = {}
        elif isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError:
                pass  # not JSON: the template gets the text as it is
        out.append({**call, "type": call.get("type", "function"), "function": {**function, "arguments": arguments}})
    return out


def render_chat_template(template: str, messages, add_generation_prompt: bool = True, tools=None,
                         content_parts: bool = False, **variables) -> str:
    """tools: OpenAI tool objects. Passed to the template as `tools` when it uses them;
    otherwise written into the system message (tokenizer/tool_prompt.py). content_parts: messages'
    contents reach the template as lists of parts (normalize_messages)."""
    messages = normalize_messages(messages, parts=content_parts)
    if tools is not None or any(m.get("tool_calls") or m["role"] == "tool" for m in messages):
        if template_supports_tools(template):
            variables["tools"] = tools or None
        else:
            messages = inline_tools(messages, tools)
    try:
        return _compile(template).render(messages=messages, add_generation_prompt=add_generation_prompt, **variables)
    except ChatTemplateError:
        raise
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"the chat template failed to render: {e}") from None
