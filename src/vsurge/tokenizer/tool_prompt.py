"""Tools for chat templates that do not know about tools (as vLLM and llama.cpp do for them).

A template that never mentions `tools` would drop them silently. For such a
template the tool definitions go into the system message (prepended to the
first system message, or as a new one), written in the Hermes/Qwen format that
the "hermes" tool-call parser reads back; past calls and their results become
text in that same format:

- an assistant message's `tool_calls` -> `<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`
  appended to its content;
- `tool` messages -> one user message of `<tool_response>\\n...\\n</tool_response>` blocks
  (such templates often refuse roles other than system/user/assistant).
"""

from __future__ import annotations

import json
import re

_USES_TOOLS = re.compile(r"\btools\b")

TOOLS_PROMPT = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


def template_supports_tools(template: str | None) -> bool:
    return bool(template) and _USES_TOOLS.search(template) is not None


def tools_system_prompt(tools: list[dict]) -> str:
    return TOOLS_PROMPT.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))


def inline_tools(messages: list[dict], tools: list[dict] | None) -> list[dict]:
    """Messages (already normalized) with tools, calls and results written as text."""
    out: list[dict] = []
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            blocks = [_call_block(call) for call in m["tool_calls"]]
            text = "\n".join(([m["content"].strip()] if m["content"].strip() else []) + blocks)
            out.append({k: v for k, v in m.items() if k != "tool_calls"} | {"content": text})
        elif m["role"] == "tool":
            block = f"<tool_response>\n{m['content']}\n</tool_response>"
            if out and out[-1].get("_tool_results"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool_results": True})
        else:
            out.append(m)
    out = [{k: v for k, v in m.items() if k != "_tool_results"} for m in out]
    if tools:
        prompt = tools_system_prompt(tools)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": (out[0]["content"] + "\n\n" + prompt) if out[0]["content"] else prompt}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


def _call_block(call: dict) -> str:
    function = call.get("function", call)
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    body = json.dumps({"name": function.get("name"), "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"
