"""Reasoning parsers: a model's text -> (reasoning, content), whole or streamed.

Reasoning models write their thinking between `<think>` and `</think>`, then the answer.
`--reasoning-parser` (vLLM's names) says how to read that:

- deepseek_r1: everything before `</think>` is reasoning, the opening tag optional (R1's
  template puts it in the prompt); without any `</think>` the whole text is reasoning;
- qwen3: reasoning only inside `<think>...</think>` at the start of the answer (or after a
  prompt that ends with `<think>`, as Qwen3's thinking templates do); otherwise the whole
  text is content (thinking was switched off: `enable_thinking: false`).
- gpt_oss: GPT-OSS's harmony channels, `<|channel|>analysis<|message|>...<|end|>` is
  reasoning, the `final` (and `commentary`) channels' messages are content. The markers are
  special tokens, so this parser reads the text with them kept (`keeps_special_tokens`).

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
    keeps_special_tokens = False  # the tags are special tokens: detokenize with them kept

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


class GptOssParser(ReasoningParser):
    """Harmony: each message is `[<|start|>role]<|channel|>NAME[ header]<|message|>BODY` ended by
    <|end|>, <|return|> or <|call|> (or by the next header). BODY is reasoning in the analysis
    channel and content elsewhere; text without any header is content."""

    name = "gpt_oss"
    keeps_special_tokens = True
    START_TAG, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
    ENDS = ("<|end|>", "<|return|>", "<|call|>")

    def __init__(self, prompt_text: str = ""):
        self._held = ""
        self._channel = None  # None: reading a header; else the channel whose body is being read
        head, sep, _ = prompt_text.rpartition(self.MESSAGE)
        if sep and self.CHANNEL in head and not any(e in _ for e in self.ENDS):  # the prompt opened a body
            self._channel = self._channel_of(head[head.rfind(self.CHANNEL):])

    @property
    def in_reasoning(self) -> bool:
        return self._channel == "analysis"

    def _channel_of(self, header: str) -> str:
        rest = header.partition(self.CHANNEL)[2]
        return (rest.split("<|")[0].split() or ["final"])[0]

    def _is_header(self, text: str) -> bool:
        """A header begun (or a prefix of one), not plain text."""
        return any(text.startswith(t) or t.startswith(text) for t in (self.START_TAG, self.CHANNEL))

    def _step(self, final: bool) -> tuple[str, str]:
        out = {"reasoning": "", "content": ""}
        while True:
            if self._channel is None:
                message = self._held.find(self.MESSAGE)
                if message >= 0 and self._is_header(self._held):
                    self._channel = self._channel_of(self._held[:message])
                    self._held = self._held[message + len(self.MESSAGE):]
                    continue
                if not self._held or (not final and self._is_header(self._held)):
                    return out["reasoning"], out["content"]
                self._channel = "final"  # plain text: no harmony header
                continue
            bucket = "reasoning" if self._channel == "analysis" else "content"
            stops = [(i, t) for t in (*self.ENDS, self.START_TAG, self.CHANNEL) if (i := self._held.find(t)) >= 0]
            if stops:
                i, tag = min(stops)
                out[bucket] += self._held[:i]
                self._held = self._held[i + len(tag):] if tag in self.ENDS else self._held[i:]
                self._channel = None
                continue
            keep = 0 if final else max(_partial_suffix(self._held, t) for t in (*self.ENDS, self.START_TAG,
                                                                                  self.CHANNEL))
            out[bucket] += self._held[:len(self._held) - keep]
            self._held = self._held[len(self._held) - keep:]
            return out["reasoning"], out["content"]


REASONING_PARSERS = {"deepseek_r1": DeepSeekR1Parser, "qwen3": Qwen3Parser, "gpt_oss": GptOssParser}


def get_reasoning_parser(name: str) -> type[ReasoningParser]:
    if name not in REASONING_PARSERS:
        raise ValueError(f"unknown reasoning parser {name!r} (known: {', '.join(REASONING_PARSERS)})")
    return REASONING_PARSERS[name]
