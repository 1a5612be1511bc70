"""The tool-call parsers' base class: the feed/finish/parse machine every format shares.

Formats subclass `ToolParser` and write `_step` (tool_parsers.py, tool_parsers_more.py); this
module is apart so both files build on it without importing each other.
"""

from __future__ import annotations

from .tool_calls import CallBuilder

_WS = " \t\r\n"


class ToolParser:
    name = ""

    def __init__(self, tools=None):
        self.tools = tools  # the request's Tools (tools.py): formats that write bare values read their schemas
        self.calls: list[CallBuilder] = []
        self._held = ""  # text read but not yet emitted or consumed

    # ------------------------------------------------------------ interface
    def feed(self, text: str) -> list[dict]:
        """Text delta -> chunk deltas ({"content": ...} / {"tool_calls": [...]})."""
        self._held += text
        out: list[dict] = []
        self._step(out, final=False)
        return out

    def finish(self) -> list[dict]:
        """The model stopped: flush what was held back."""
        out: list[dict] = []
        self._step(out, final=True)
        return out

    @property
    def tool_calls(self) -> list[dict]:
        return [c.as_openai() for c in self.calls if c.started]

    def parse(self, text: str) -> tuple[str | None, list[dict]]:
        """Whole text -> (content or None, tool_calls). Call on a fresh parser."""
        deltas = self.feed(text) + self.finish()
        calls = self.tool_calls
        if not all(c.is_call for c in self.calls):
            return text, []  # a broken call: the text stays as the model wrote it
        content = "".join(d.get("content", "") for d in deltas)
        if calls and not content.strip():
            content = None
        return content, calls

    # ------------------------------------------------------------ helpers
    def _step(self, out: list[dict], final: bool) -> None:
        raise NotImplementedError

    @staticmethod
    def _content(out: list[dict], text: str) -> None:
        if text:
            out.append({"content": text})

    def _feed_call(self, out: list[dict], text: str) -> str | None:
        """Feed the open call; returns the text after its object (None while it is open)."""
        call = self.calls[-1]
        pieces, rest = call.feed(text)
        out += [{"tool_calls": [p]} for p in pieces]
        if rest is not None:
            out += [{"tool_calls": [p]} for p in call.finish()]
        return rest


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
