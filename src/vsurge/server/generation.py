"""Run one HTTP generation request on a vSurge: start its streams, then answer whole or as SSE.

Every (prompt, sample) pair is one choice. Streams are started ("primed")
before any byte is sent, so a full queue or a bad value still gets a proper
HTTP status instead of a broken stream.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

from ..engine.request import ReturnSample
from .formatting import SSE_DONE, Formatter, sse

_END = object()


class ChoiceStreams:
    """The merged updates of all prompts of one request; choice index = prompt * n + sample."""

    def __init__(self, surge, prompts: list[list[int]], params, echo_texts: list[str] | None = None):
        self.surge = surge
        self.prompts = prompts
        self.params = params
        self.echo_texts = echo_texts
        self.queue: asyncio.Queue = asyncio.Queue()
        self.tasks: list[asyncio.Task] = []
        self.prompt_tokens = sum(len(p) for p in prompts)

    def start(self) -> None:
        """Submit every prompt; raises (before anything is sent) if one is refused."""
        submissions = []
        try:
            for ids in self.prompts:
                submissions.append(self.surge.submit(ids, self.params))
        except BaseException:
            for sub in submissions:
                sub.cancel()
            raise
        for i, sub in enumerate(submissions):
            self.tasks.append(asyncio.create_task(self._pump(i, sub)))

    async def _pump(self, prompt_index: int, submission) -> None:
        gen = submission.updates()
        try:
            async for samples in gen:
                await self.queue.put((prompt_index, samples))
        except Exception as exc:  # noqa: BLE001: delivered to the response in order
            await self.queue.put(exc)
        finally:
            await gen.aclose()
            await self.queue.put(_END)

    async def updates(self) -> AsyncIterator[tuple[int, ReturnSample]]:
        remaining = len(self.tasks)
        try:
            while remaining:
                item = await self.queue.get()
                if item is _END:
                    remaining -= 1
                    continue
                if isinstance(item, BaseException):
                    raise item
                prompt_index, samples = item
                for s in samples:
                    yield prompt_index * self.params.n + s.index, s
        finally:
            self.close()

    def close(self) -> None:
        for task in self.tasks:
            task.cancel()


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
        if streams.echo_texts is not None:
            text = streams.echo_texts[index // streams.params.n] + text
        lp = logprobs.get(index, []) if streams.params.logprobs is not None else None
        choices.append(fmt.choice(index, text, finals[index].finish_reason, lp))
    completion = sum(s.num_generated_tokens for s in finals.values())
    return fmt.response(choices, streams.prompt_tokens, completion)


async def event_stream(streams: ChoiceStreams, fmt: Formatter, include_usage: bool) -> AsyncIterator[str]:
    """SSE body: chunks with `index` per choice, one finish_reason per choice, usage, [DONE]."""
    started: set[int] = set()
    offsets: dict[int, int] = {}
    completion = 0
    try:
        async for index, s in streams.updates():
            first = index not in started
            text = s.text
            if first:
                started.add(index)
                if streams.echo_texts is not None:
                    text = streams.echo_texts[index // streams.params.n] + text
                if fmt.kind == "chat":  # the role arrives alone in the first chunk, as OpenAI does
                    yield sse(fmt.chunk(index, "", role=True))
            if text or s.logprobs:
                yield sse(fmt.chunk(index, text, logprobs=s.logprobs, text_offset=offsets.get(index, 0)))
                offsets[index] = offsets.get(index, 0) + len(text)
            if s.finish_reason is not None:
                completion += s.num_generated_tokens
                yield sse(fmt.chunk(index, None if fmt.kind == "chat" else "", finish_reason=s.finish_reason))
        if include_usage:
            yield sse(fmt.usage_chunk(streams.prompt_tokens, completion))
    except Exception as exc:  # noqa: BLE001: the status line is gone; report in-band
        from .errors import error_body

        yield sse(error_body(500, f"generation failed: {exc}"))
    yield SSE_DONE
