"""Tool-call parsers: a model's text -> message content + OpenAI tool calls, whole or streamed.

Formats (`--tool-call-parser`, vLLM's names):

- hermes: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` blocks anywhere in the
  text (Hermes, Qwen 2/2.5/3, and vsurge's own prompt for templates without tools);
- llama3_json: the whole answer is `{"name": ..., "parameters": {...}}` objects separated by
  `;`, optionally after `<|python_tag|>` (Llama 3.1/3.2/3.3);
- mistral, pythonic, qwen3_coder: tool_parsers_more.py (both files build on tool_parser_base.py);
- auto: picked from the chat template's text (`parser_for_template`).

Every parser is fed text deltas (`feed`, then `finish`) and returns OpenAI
chat-completion-chunk deltas: {"content": ...} for text outside tool calls and
{"tool_calls": [piece]} for calls (see tool_calls.py). `parse(text)` (on a
fresh parser) runs the same machine over the whole text, so a streamed response assembles to the same
content and calls as the non-streamed one. Whitespace right before or after a
tool-call block is dropped. When a block turns out not to be a valid call, the
whole-text parse returns the text unchanged as content with no calls.

`NamedCallParser` and `RequiredCallsParser` read the output of tool_choice =
{"function": ...} / "required", which a grammar forced (tools.py).
"""

from __future__ import annotations

from .tool_calls import CallBuilder
from .tool_parser_base import _WS, ToolParser, _partial_suffix
from .tool_parsers_more import MistralParser, PythonicParser, Qwen3CoderParser


class HermesParser(ToolParser):
    name = "hermes"
    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def __init__(self, tools=None):
        super().__init__(tools)
        self._mode = "text"  # text | call | close
        self._after_block = False  # drop whitespace right after a block
        self._block = ""  # raw text of the open block (content again if it is no call)

    def _step(self, out, final):
        while True:
            if self._mode == "text":
                if self._after_block:
                    stripped = self._held.lstrip(_WS)
                    if stripped or final:
                        self._after_block = False
                    self._held = stripped
                start = self._held.find(self.OPEN)
                if start >= 0:
                    self._content(out, self._held[:start].rstrip(_WS))
                    self._held = self._held[start + len(self.OPEN):]
                    self.calls.append(CallBuilder(len([c for c in self.calls if c.started])))
                    self._mode, self._block = "call", ""
                    continue
                if final:
                    self._content(out, self._held)
                    self._held = ""
                    return
                keep = _partial_suffix(self._held, self.OPEN)
                head = self._held[:len(self._held) - keep]
                safe = len(head.rstrip(_WS))  # whitespace may precede a block: hold it
                self._content(out, self._held[:safe])
                self._held = self._held[safe:]
                return
            if self._mode == "call":
                text, self._held = self._held, ""
                self._block += text
                rest = self._feed_call(out, text)
                call = self.calls[-1]
                if not call.started and (call.scanner.failed or rest is not None or final):
                    self.calls.pop()  # no name, or no JSON: the block was text
                    rest = rest or ""
                    self._content(out, self.OPEN + self._block[:len(self._block) - len(rest)])
                    self._held, self._mode = rest, "text"
                    continue
                if rest is None:
                    return  # open (or broken, and then parse() keeps the text)
                self._held, self._mode = rest, "close"
                continue
            # close: optional whitespace, then </tool_call> (models sometimes omit it)
            stripped = self._held.lstrip(_WS)
            if stripped.startswith(self.CLOSE):
                self._held = stripped[len(self.CLOSE):]
            elif self.CLOSE.startswith(stripped):  # nothing yet, or part of the tag
                if not final:
                    self._held = stripped
                    return
                self._held = ""
            else:
                self._held = stripped
            self._mode, self._after_block = "text", True


class Llama3JsonParser(ToolParser):
    name = "llama3_json"
    PYTHON_TAG = "<|python_tag|>"

    def __init__(self, tools=None):
        super().__init__(tools)
        self._mode = "start"  # start | between | call | text
        self._block = ""

    def _step(self, out, final):
        while True:
            if self._mode == "text":
                self._content(out, self._held)
                self._held = ""
                return
            if self._mode == "start":
                stripped = self._held.lstrip(_WS)
                if stripped.startswith(self.PYTHON_TAG):
                    self._held, self._mode = stripped[len(self.PYTHON_TAG):], "between"
                elif stripped.startswith("{"):
                    self._held, self._mode = stripped, "between"
                elif (not stripped or self.PYTHON_TAG.startswith(stripped)) and not final:
                    return  # undecided yet
                else:
                    self._mode = "text"
                continue
            if self._mode == "between":
                stripped = self._held.lstrip(_WS + ";")
                if stripped.startswith("{"):
                    self.calls.append(CallBuilder(len([c for c in self.calls if c.started])))
                    self._held, self._mode, self._block = stripped, "call", ""
                    continue
                self._held = stripped
                if stripped:  # text after the calls
                    self._mode = "text"
                    continue
                return
            text, self._held = self._held, ""
            self._block += text
            rest = self._feed_call(out, text)
            call = self.calls[-1]
            if not call.started and (call.scanner.failed or call.extra_keys or rest is not None or final):
                self.calls.pop()  # a JSON answer (or broken JSON), not a call: it is content
                self._held, self._mode = self._block, "text"
                continue
            if rest is None:
                return  # open (or broken, and then parse() keeps the text)
            self._held, self._mode = rest, "between"


class NamedCallParser(ToolParser):
    """tool_choice = {"type": "function", "function": {"name": N}}: the output is N's arguments."""

    name = "named"

    def __init__(self, function_name: str):
        super().__init__()
        self.calls.append(CallBuilder(0))
        self.calls[0].name = function_name

    def _step(self, out, final):
        call, text = self.calls[0], self._held
        self._held = ""
        if not call.started:
            out.append({"tool_calls": [call._header()]})
        out += [{"tool_calls": [p]} for p in call._arguments(text)]

    def parse(self, text: str):
        self.feed(text)
        return None, self.tool_calls


class RequiredCallsParser(ToolParser):
    """tool_choice = "required": the output is `[{"name": ..., "arguments": {...}}, ...]`."""

    name = "required"

    def __init__(self):
        super().__init__()
        self._mode = "start"  # start | between | call | done

    def _step(self, out, final):
        while self._held and self._mode != "done":
            if self._mode == "start":
                stripped = self._held.lstrip(_WS)
                if stripped.startswith("["):
                    stripped = stripped[1:]
                    self._mode = "between"
                self._held = stripped
                if self._mode == "start":
                    return
            elif self._mode == "between":
                stripped = self._held.lstrip(_WS + ",")
                if stripped.startswith("{"):
                    self.calls.append(CallBuilder(len(self.calls)))
                    self._mode = "call"
                elif stripped.startswith("]"):
                    self._mode = "done"
                self._held = stripped
            else:
                text, self._held = self._held, ""
                rest = self._feed_call(out, text)
                if rest is None:
                    return
                self._held, self._mode = rest, "between"
        if final:
            self._held = ""

    def parse(self, text: str):
        self.feed(text)
        self.finish()
        return None, self.tool_calls



TOOL_PARSERS = {"hermes": HermesParser, "llama3_json": Llama3JsonParser, "mistral": MistralParser,
                "pythonic": PythonicParser, "qwen3_coder": Qwen3CoderParser}
PARSER_NAMES = ("auto", *TOOL_PARSERS)


def parser_for_template(chat_template: str | None) -> str:
    """The tool-call format a chat template teaches its model ("hermes" when it teaches none:
    vsurge's own tools prompt asks for that format)."""
    template = chat_template or ""
    if "<function=" in template and "<parameter=" in template:
        return "qwen3_coder"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<tool_call>" in template:
        return "hermes"
    if "<|python_tag|>" in template or ('"parameters"' in template and "ipython" in template):
        return "llama3_json"
    return "hermes"


def get_tool_parser(name: str, chat_template: str | None = None) -> type[ToolParser]:
    """name: "auto" or one of TOOL_PARSERS (vLLM's --tool-call-parser names)."""
    if name == "auto":
        name = parser_for_template(chat_template)
    if name not in TOOL_PARSERS:
        raise ValueError(f"unknown tool-call parser {name!r} (known: {', '.join(PARSER_NAMES)})")
    return TOOL_PARSERS[name]
