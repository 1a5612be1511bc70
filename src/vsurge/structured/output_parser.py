"""One choice's generated text -> typed pieces: reasoning, content and tool calls.

The one output pipeline of every wire format: text deltas go through the reasoning
parser (reasoning.py), and what is content goes on through the tool-call parser
(tool_parsers.py). Each wire format's adapter maps the pieces onto its own events
(chat `delta.reasoning_content` / `delta.content` / `delta.tool_calls`, Responses
reasoning / message / function_call items, Messages thinking / text / tool_use blocks).
"""

from __future__ import annotations

from dataclasses import dataclass

from .reasoning import ReasoningParser
from .tool_parsers import ToolParser


@dataclass
class Piece:
    kind: str  # "reasoning" | "content" | "call"
    text: str = ""  # reasoning or content text
    call: dict | None = None  # "call": an OpenAI tool_calls chunk piece (see tool_calls.py)

    @property
    def starts_call(self) -> bool:
        """The call's first piece: index, id, name (its arguments follow in later pieces)."""
        return self.kind == "call" and "id" in self.call


class OutputParser:
    def __init__(self, reasoning: ReasoningParser | None = None, tools: ToolParser | None = None):
        self.reasoning = reasoning
        self.tools = tools

    def feed(self, text: str, final: bool = False) -> list[Piece]:
        """A text delta (final: the model stopped) -> its pieces, in order."""
        pieces: list[Piece] = []
        if self.reasoning is not None:
            thought, text = self.reasoning.feed(text)
            if final:
                more_thought, more_text = self.reasoning.finish()
                thought, text = thought + more_thought, text + more_text
            if thought:
                pieces.append(Piece("reasoning", thought))
        if self.tools is None:
            if text:
                pieces.append(Piece("content", text))
            return pieces
        deltas = self.tools.feed(text) + (self.tools.finish() if final else [])
        for delta in deltas:
            if delta.get("content"):
                pieces.append(Piece("content", delta["content"]))
            for call in delta.get("tool_calls") or []:
                pieces.append(Piece("call", call=call))
        return pieces

    @property
    def tool_calls(self) -> list[dict]:
        return self.tools.tool_calls if self.tools is not None else []

    def parse(self, text: str) -> tuple[str | None, str | None, list[dict]]:
        """Whole text -> (reasoning or None, content or None, tool calls). Call on a fresh parser."""
        reasoning, content = self.reasoning.split(text) if self.reasoning is not None else (None, text)
        if self.tools is None:
            return reasoning, content, []
        content, calls = self.tools.parse(content or "")
        return reasoning, content, calls
