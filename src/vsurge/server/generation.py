"""Run one HTTP generation request on a vSurge: start its streams, then answer whole or as SSE
(the OpenAI chat/completions output; Responses and Messages format their own, adapters/).

Every (prompt, sample) pair is one choice. Streams are started ("primed")
before any byte is sent, so a full queue or a bad value still gets a proper
HTTP status instead of a broken stream. With tools or a reasoning parser, each
chat choice's text goes through its OutputParser: `reasoning_content`, content
and `tool_calls` (whole), or `delta.reasoning_content` / `delta.content` /
`delta.tool_calls` pieces (streamed).
"""

from __future__ import annotations

from typing import AsyncIterator, Callable

from ..engine.request import DriverNotReadyError, QueueFullError, ReturnSample
from ..engine.streams import merged_updates
from ..structured.tools import finish_reason_with_calls
from .errors import APIError, error_body
from .formatting import SSE_DONE, Formatter, sse


class ChoiceStreams:
    """The merged updates of all prompts of one request; choice index = prompt * n + sample."""

    def __init__(self, surge, prompts: list[list[int]], params, echo_texts: list[str] | None = None,
                 new_parser: Callable | None = None, echo_logprobs: list[list[dict]] | None = None,
                 prompt_logprobs: list[list] | None = None):
        self.surge = surge
        self.prompts = prompts
        self.params = params
        self.echo_texts = echo_texts
        self.echo_logprobs = echo_logprobs  # per prompt: its tokens' logprob entries (echo + logprobs)
        self.prompt_logprobs = prompt_logprobs  # per prompt: vLLM's prompt_logprobs list
        self.new_parser = new_parser  # -> a fresh OutputParser per choice (reasoning, tool calls), or None
        self.submissions: list = []
        self.prompt_tokens = sum(len(p) for p in prompts)

    def start(self) -> None:
        """Submit every prompt; raises (before anything is sent) if one is refused."""
        try:
            for ids in self.prompts:
                self.submissions.append(self.surge.submit(ids, self.params))
        except BaseException:
            for sub in self.submissions:
                sub.cancel()
            raise

    def start_or_refuse(self) -> None:
        """start(), with the engine's refusals as HTTP errors: 503 (queue full, not ready), 400 (bad value)."""
        try:
            self.start()
        except (QueueFullError, DriverNotReadyError) as exc:
            raise APIError(503, str(exc), None, {"Retry-After": "1"}) from None
        except (ValueError, TypeError) as exc:
            raise APIError(400, str(exc), getattr(exc, "param", None)) from None

    async def updates(self) -> AsyncIterator[tuple[int, ReturnSample]]:
        async for prompt_index, sample in merged_updates(self.submissions):
            yield prompt_index * self.params.n + sample.index, sample

    def parser(self):
        return self.new_parser() if self.new_parser else None


async def collect(streams: ChoiceStreams, fmt: Formatter) -> dict:
    texts: dict[int, list[str]] = {}
    logprobs: dict[int, list] = {}
    finals: dict[int, ReturnSample] = {}
    async for index, s in streams.updates():
        texts.setdefault(index, []).append(s.text)
        if s.logprobs is not None:
            logprobs.setdefault(index, []).extend(s.logprobs)
        if s.finish_reason is not None:
            finals[index] = s
    choices = []
    for index in sorted(finals):
        text = "".join(texts[index])
        prompt = index // streams.params.n
        if streams.echo_texts is not None:
            text = streams.echo_texts[prompt] + text
        lp = logprobs.get(index, []) if streams.params.logprobs is not None else None
        if streams.echo_logprobs is not None:
            lp = streams.echo_logprobs[prompt] + lp
        parser = streams.parser()
        reasoning, content, calls = parser.parse(text) if parser else (None, text, [])
        reason = finish_reason_with_calls(finals[index].finish_reason, calls)
        choices.append(fmt.choice(index, content, reason, lp, calls, reasoning,
                                  streams.prompt_logprobs[prompt] if streams.prompt_logprobs else None))
    completion = sum(s.num_generated_tokens for s in finals.values())
    return fmt.response(choices, streams.prompt_tokens, completion)


async def event_stream(streams: ChoiceStreams, fmt: Formatter, include_usage: bool) -> AsyncIterator[str]:
    """SSE body: chunks with `index` per choice, one finish_reason per choice, usage, [DONE]. With
    include_usage every chat chunk before the usage chunk carries `"usage": null`, as OpenAI's do."""
    started: set[int] = set()
    offsets: dict[int, int] = {}
    parsers: dict[int, object] = {}
    completion = 0

    def chunk(*args, **kw) -> str:
        body = fmt.chunk(*args, **kw)
        if include_usage and fmt.kind == "chat":  # (the spec's completion chunk has no null usage)
            body["usage"] = None
        return sse(body)

    def pieces(index: int, text: str, final: bool):
        """(content, tool_calls, reasoning) deltas of this text: through the choice's parser when it has one."""
        parser = parsers.get(index)
        if parser is None:
            return [(text, None, None)] if text else []
        return [(p.text if p.kind == "content" else None, [p.call] if p.kind == "call" else None,
                 p.text if p.kind == "reasoning" else None) for p in parser.feed(text, final)]

    try:
        async for index, s in streams.updates():
            text, first_logprobs, prompt_logprobs = s.text, [], None
            if index not in started:
                started.add(index)
                prompt = index // streams.params.n
                if streams.echo_logprobs is not None:
                    first_logprobs = streams.echo_logprobs[prompt]
                if streams.prompt_logprobs is not None:
                    prompt_logprobs = streams.prompt_logprobs[prompt]
                if fmt.kind == "chat" and streams.new_parser:
                    parsers[index] = streams.parser()
                if streams.echo_texts is not None:
                    text = streams.echo_texts[index // streams.params.n] + text
                if fmt.kind == "chat":  # the role arrives alone in the first chunk, as OpenAI does
                    yield chunk(index, "", role=True)
            final = s.finish_reason is not None
            deltas = pieces(index, text, final)
            if (s.logprobs or first_logprobs or prompt_logprobs) and not deltas:
                deltas = [("", None, None)]
            for i, (content, calls, reasoning) in enumerate(deltas):
                lp = (first_logprobs + (s.logprobs or [])) or s.logprobs if i == 0 else None
                yield chunk(index, content, logprobs=lp, text_offset=offsets.get(index, 0), tool_calls=calls,
                            reasoning=reasoning, prompt_logprobs=prompt_logprobs if i == 0 else None)
                offsets[index] = offsets.get(index, 0) + len(content or "")
            if final:
                completion += s.num_generated_tokens
                parser = parsers.get(index)
                reason = finish_reason_with_calls(s.finish_reason, parser.tool_calls if parser else [])
                yield chunk(index, None if fmt.kind == "chat" else "", finish_reason=reason)
        if include_usage:
            yield sse(fmt.usage_chunk(streams.prompt_tokens, completion))
    except Exception as exc:  # noqa: BLE001: the status line is gone; report in-band
        yield sse(error_body(500, f"generation failed: {exc}"))
    yield SSE_DONE
