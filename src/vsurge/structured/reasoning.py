"""Reasoning parsers: a model's text -> (reasoning, content), whole or streamed.

Reasoning models write their thinking between `<think>` and `</think>`, then the answer.
`--reasoning-parser` (vLLM's names) says how to read that:

- deepseek_r1: everything before `</think>` is reasoning, the opening tag optional (R1's
  template puts it in the prompt); without any `</think>` the whole text is reasoning;
- qwen3: reasoning only inside `<think>...</think>` at the start of the answer (or after a
  prompt that ends with `<think>`, as Qwen3's thinking templates do); otherwise the whole
  text is content (thinking was switched off: `enable_thinking: false`).

`feed(text)` returns the (reasoning, content) pieces of a text delta, holding back a
partial tag; `finish()` flushes. `split(text)` runs the same machine over a whole text.
The whitespace between the tags and the text they wrap is dropped. Tool calls written
after the reasoning are parsed from the content (the server feeds content on to the
tool-call parser).
"""

from __future__ import annotations

_WS = " \t\r\n"


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ReasoningParser:
    name = ""
    START, END = "<think>", "</think>"
    implicit_start = False  # text before any tag is reasoning (the opening tag may be omitted)

    def __init__(self, prompt_text: str = ""):
        opened = prompt_text.rstrip(_WS).endswith(self.START)
        self._mode = "reasoning" if opened else "start"  # start | reasoning | content
        self._held = ""
        self._after_start = opened  # drop whitespace right after <think>
        self._after_end = False  # drop whitespace right after </think>

    def feed(self, text: str) -> tuple[str, str]:
        self._held += text
        return self._step(final=False)

    def finish(self) -> tuple[str, str]:
        return self._step(final=True)

    def split(self, text: str) -> tuple[str | None, str | None]:
        """Whole text -> (reasoning or None, content or None). Call on a fresh parser."""
        r1, c1 = self.feed(text)
        r2, c2 = self.finish()
        return (r1 + r2) or None, (c1 + c2) or None

    @property
    def in_reasoning(self) -> bool:
        return self._mode == "reasoning"

    def _step(self, final: bool) -> tuple[str, str]:
        reasoning, content = "", ""
        while True:
            if self._mode == "start":
                stripped = self._held.lstrip(_WS)
                if stripped.startswith(self.START):
                    self._held, self._mode, self._after_start = stripped[len(self.START):], "reasoning", True
                    continue
                if not final and self.START.startswith(stripped):
                    return reasoning, content  # nothing yet, or part of the tag
                self._mode = "reasoning" if self.implicit_start else "content"
                continue
            if self._mode == "reasoning":
                if self._after_start:
                    self._held = self._held.lstrip(_WS)
                    if not self._held and not final:
                        return reasoning, content
                    self._after_start = False
                end = self._held.find(self.END)
                if end >= 0:
                    reasoning += self._held[:end].rstrip(_WS)
                    self._held, self._mode, self._after_end = self._held[end + len(self.END):], "content", True
                    continue
                if final:
                    reasoning += self._held
                    self._held = ""
                    return reasoning, content
                keep = _partial_suffix(self._held, self.END)
                safe = len(self._held[:len(self._held) - keep].rstrip(_WS))  # whitespace may precede </think>
                reasoning += self._held[:safe]
                self._held = self._held[safe:]
                return reasoning, content
            # content
            if self._after_end:
                self._held = self._held.lstrip(_WS)
                if not self._held and not final:
                    return reasoning, content
                self._after_end = False
            content += self._held
            self._held = ""
            return reasoning, content


class DeepSeekR1Parser(ReasoningParser):
    name = "deepseek_r1"
    implicit_start = True


class Qwen3Parser(ReasoningParser):
    name = "qwen3"


REASONING_PARSERS = {"deepseek_r1": DeepSeekR1Parser, "qwen3": Qwen3Parser}


def get_reasoning_parser(name: str) -> type[ReasoningParser]:
    if name not in REASONING_PARSERS:
        raise ValueError(f"unknown reasoning parser {name!r} (known: {', '.join(REASONING_PARSERS)})")
    return REASONING_PARSERS[name]
