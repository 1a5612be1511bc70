"""More tool-call formats (vLLM's `--tool-call-parser` names), beside hermes and llama3_json:

- mistral: `[TOOL_CALLS]` then a JSON array of `{"name", "arguments"}` objects (Mistral v0.3),
  or one or more `[TOOL_CALLS]name[ARGS]{...}` (the v11+ tokenizers, Mistral Small 3.x);
- pythonic: the answer is a Python list of calls, `[get_weather(city="Paris"), now()]`
  (Llama 3.2 / 4 in their pythonic mode), optionally inside `<|python_start|>...<|python_end|>`;
- qwen3_coder: XML blocks, `<tool_call><function=NAME><parameter=KEY>value</parameter>...
  </function></tool_call>`; each value is converted by the tool's JSON schema (a number, a
  boolean, an object ...; text otherwise).

Each follows tool_parsers.ToolParser's contract: text deltas in, OpenAI chunk deltas out,
the same calls whole or streamed. pythonic holds a bracketed answer back until it is
complete (its calls arrive whole); the others stream arguments as they are written.
"""

from __future__ import annotations

import ast
import json

from .tool_calls import CallBuilder
from .tool_parser_base import _WS, ToolParser, _partial_suffix


class _ArgumentsCall(CallBuilder):
    """A call whose name is known and whose text is just the arguments object (`name[ARGS]{...}`)."""

    def feed(self, text: str):
        _, rest = self.scanner.feed(text)  # the object's extent (is_call reads scanner.done)
        taken = text if rest is None else text[:len(text) - len(rest)]
        pieces = [] if self.started else [self._header()]
        self.saw_arguments = True
        return pieces + self._arguments(taken if self.arguments else taken.lstrip(_WS)), rest


class MistralParser(ToolParser):
    name = "mistral"
    TAG, ARGS = "[TOOL_CALLS]", "[ARGS]"

    def __init__(self, tools=None):
        super().__init__(tools)
        self._mode = "text"  # text | after_tag | array | name | args
        self._name = ""

    def _started(self) -> int:
        return len([c for c in self.calls if c.started])

    def _step(self, out, final):
        while True:
            if self._mode == "text":
                at = self._held.find(self.TAG)
                if at >= 0:
                    self._content(out, self._held[:at].rstrip(_WS))
                    self._held, self._mode = self._held[at + len(self.TAG):], "after_tag"
                    continue
                keep = 0 if final else _partial_suffix(self._held, self.TAG)
                head = self._held[:len(self._held) - keep]
                safe = len(head) if final else len(head.rstrip(_WS))
                self._content(out, self._held[:safe])
                self._held = self._held[safe:]
                return
            if self._mode == "after_tag":
                stripped = self._held.lstrip(_WS)
                if not stripped and not final:
                    self._held = ""
                    return
                self._held = stripped
                if stripped.startswith("["):
                    self._held, self._mode = stripped[1:], "array"
                else:
                    self._mode, self._name = "name", ""
                continue
            if self._mode == "array":  # [{"name": ..., "arguments": ...}, ...]
                stripped = self._held.lstrip(_WS + ",")
                self._held = stripped
                if stripped.startswith("{"):
                    self.calls.append(CallBuilder(self._started()))
                    self._mode = "array_call"
                    continue
                if stripped.startswith("]"):
                    self._held, self._mode = stripped[1:], "text"
                    continue
                if stripped or final:
                    self._mode = "text"
                    continue
                return
            if self._mode == "array_call":
                text, self._held = self._held, ""
                rest = self._feed_call(out, text)
                if rest is None:
                    return
                self._held, self._mode = rest, "array"
                continue
            if self._mode == "name":  # name[ARGS]{...}
                at = self._held.find(self.ARGS)
                if at < 0:
                    if final or "{" in self._held or len(self._held) > 200:
                        self._content(out, self.TAG + self._held)  # not a call after all
                        self._held, self._mode = "", "text"
                    return
                self._name = self._held[:at].strip()
                self._held = self._held[at + len(self.ARGS):]
                self.calls.append(_ArgumentsCall(self._started(), name=self._name))
                self._mode = "args"
                continue
            # args: the arguments object
            text, self._held = self._held, ""
            pieces, rest = self.calls[-1].feed(text)
            out += [{"tool_calls": [p]} for p in pieces]
            if rest is None:
                return
            self._held, self._mode = rest, "text"


class PythonicParser(ToolParser):
    name = "pythonic"
    START, END = "<|python_start|>", "<|python_end|>"

    def __init__(self, tools=None):
        super().__init__(tools)
        self._mode = "start"  # start | held | after | text

    def _step(self, out, final):
        if self._mode == "after":  # after the calls: drop whitespace and a closing <|python_end|>
            stripped = self._held.lstrip(_WS)
            if not final and (not stripped or (self.END.startswith(stripped) and stripped != self.END)):
                self._held = stripped
                return
            self._held, self._mode = stripped.removeprefix(self.END), "text"
        if self._mode == "text":
            self._content(out, self._held)
            self._held = ""
            return
        stripped = self._held.lstrip(_WS)
        if self._mode == "start":
            if not stripped and not final:
                return
            if not (stripped.startswith("[") or stripped.startswith(self.START)
                    or (self.START.startswith(stripped) and not final)):
                self._mode = "text"
                return self._step(out, final)
            self._mode = "held"
        body = stripped.removeprefix(self.START).strip(_WS)
        end = body.find(self.END)
        rest = body[end + len(self.END):] if end >= 0 else ""
        body = body[:end].strip(_WS) if end >= 0 else body
        calls = _python_calls(body) if body.endswith("]") else None
        if calls is None:
            if final:  # never became a list of calls: it was content
                self._mode = "text"
                return self._step(out, final)
            return
        for name, arguments in calls:
            call = CallBuilder(len(self.calls), name=name)
            self.calls.append(call)
            call.scanner.done = True
            out.append({"tool_calls": [call._header()]})
            out += [{"tool_calls": [p]} for p in call._arguments(arguments)]
        self._held, self._mode = rest, "after" if end < 0 else "text"
        if self._held or final:
            self._step(out, final)


def _python_calls(text: str) -> list[tuple[str, str]] | None:
    """`[f(a=1), g()]` -> [(name, JSON arguments)], or None when the text is not such a list."""
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    calls = []
    for node in tree.elts:
        if not isinstance(node, ast.Call) or node.args or not isinstance(node.func, (ast.Name, ast.Attribute)):
            return None
        name = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
        try:
            arguments = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None}
            calls.append((name, json.dumps(arguments, ensure_ascii=False)))
        except (ValueError, TypeError, SyntaxError):
            return None
    return calls


class Qwen3CoderParser(ToolParser):
    name = "qwen3_coder"
    WRAP_OPEN, WRAP_CLOSE = "<tool_call>", "</tool_call>"
    FUNCTION, FUNCTION_CLOSE = "<function=", "</function>"
    PARAMETER, PARAMETER_CLOSE = "<parameter=", "</parameter>"

    def __init__(self, tools=None):
        super().__init__(tools)
        self._mode = "text"  # text | function | body | after_function
        self._after_block = False
        self._params = 0  # parameters written into the open call's arguments

    def _types(self, function: str) -> dict:
        for tool in self.tools or []:
            if tool.name == function:
                return (tool.parameters or {}).get("properties") or {}
        return {}

    def _step(self, out, final):
        while True:
            if self._mode == "text":
                if self._after_block:
                    self._held = self._held.lstrip(_WS)
                    if not self._held and not final:
                        return
                    self._after_block = False
                starts = [i for i in (self._held.find(self.WRAP_OPEN), self._held.find(self.FUNCTION)) if i >= 0]
                if starts:
                    at = min(starts)
                    self._content(out, self._held[:at].rstrip(_WS))
                    self._held = self._held[at:]
                    if self._held.startswith(self.WRAP_OPEN):
                        self._held = self._held[len(self.WRAP_OPEN):].lstrip(_WS)
                        if not self._held and not final:
                            self._mode = "function"
                            return
                    self._mode = "function"
                    continue
                keep = 0 if final else max(_partial_suffix(self._held, self.WRAP_OPEN),
                                           _partial_suffix(self._held, self.FUNCTION))
                head = self._held[:len(self._held) - keep]
                safe = len(head) if final else len(head.rstrip(_WS))
                self._content(out, self._held[:safe])
                self._held = self._held[safe:]
                return
            if self._mode == "function":  # <function=NAME>
                self._held = self._held.lstrip(_WS)
                if not self._held.startswith(self.FUNCTION):
                    if not final and self.FUNCTION.startswith(self._held):
                        return
                    self._content(out, self.WRAP_OPEN + self._held)  # a bare <tool_call> that holds no call
                    self._held, self._mode = "", "text"
                    return
                end = self._held.find(">")
                if end < 0:
                    return
                name = self._held[len(self.FUNCTION):end].strip()
                self._held = self._held[end + 1:]
                call = CallBuilder(len([c for c in self.calls if c.started]), name=name)
                self.calls.append(call)
                out.append({"tool_calls": [call._header()]})
                self._mode, self._params = "body", 0
                continue
            if self._mode == "body":  # parameters until </function>
                self._held = self._held.lstrip(_WS)
                if self._held.startswith(self.PARAMETER):
                    head_end, close = self._held.find(">"), self._held.find(self.PARAMETER_CLOSE)
                    if head_end < 0 or close < 0:
                        if not final:
                            return
                        self._held += ">" * (head_end < 0) + self.PARAMETER_CLOSE  # cut off: keep what came
                        continue
                    self._parameter(out, self._held[len(self.PARAMETER):head_end].strip(),
                                    self._held[head_end + 1:close])
                    self._held = self._held[close + len(self.PARAMETER_CLOSE):]
                    continue
                if self._held.startswith(self.FUNCTION_CLOSE) or final:
                    self._held = self._held.removeprefix(self.FUNCTION_CLOSE)
                    call = self.calls[-1]
                    out += [{"tool_calls": [p]} for p in call._arguments("}" if self._params else "{}")]
                    call.scanner.done = True
                    self._mode = "after_function"
                    continue
                return  # a tag still arriving (or stray text, dropped at </function>)
            # after_function: an optional </tool_call>
            self._held = self._held.lstrip(_WS)
            partial = len(self._held) < len(self.WRAP_CLOSE) and self.WRAP_CLOSE.startswith(self._held)
            if partial and not final:
                return
            self._held = self._held.removeprefix(self.WRAP_CLOSE)
            self._mode, self._after_block = "text", True

    def _parameter(self, out, key: str, value: str) -> None:
        value = value.removeprefix("\n").removesuffix("\n")
        call = self.calls[-1]
        typed = _typed(value, self._types(call.name).get(key))
        fragment = ("{" if self._params == 0 else ", ") + json.dumps(key) + ": " + json.dumps(typed, ensure_ascii=False)
        self._params += 1
        out += [{"tool_calls": [p]} for p in call._arguments(fragment)]


def _typed(value: str, schema: dict | None):
    """A parameter's text as the JSON value its schema asks for (text when it does not parse)."""
    kind = (schema or {}).get("type")
    if kind == "string" or (schema and "enum" in schema and all(isinstance(v, str) for v in schema["enum"])):
        return value
    candidate = value.strip()
    if kind == "boolean" and candidate.lower() in ("true", "false"):
        return candidate.lower() == "true"
    try:
        parsed = json.loads(candidate)
    except json.JSONDecodeError:
        try:
            parsed = ast.literal_eval(candidate)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return value
    if kind in ("integer", "number") and not isinstance(parsed, (int, float)):
        return value
    if kind in ("object", "array") and not isinstance(parsed, (dict, list)):
        return value
    if kind is None and not isinstance(parsed, (int, float, bool, dict, list)) and parsed is not None:
        return value
    return parsed
