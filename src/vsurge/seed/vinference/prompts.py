"""Prompt-level API of vInference: text/messages in, text (whole or streamed) out.

`events()` is the one loop every API here builds on: it runs a batch of rows
and turns each step's updates (text already UTF-8-safe, stop strings already
cut by the engine's output streams) into (row, "text" | "final", data) events.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncGenerator, Callable, Iterator, Sequence

from ...sampling.params import SamplingParams
from ...tokenizer.compat import chat_prompt_ids, text_prompt_ids
from .inference_config import PromptOutput


def is_messages(prompt) -> bool:
    return isinstance(prompt, list) and bool(prompt) and all(isinstance(m, dict) for m in prompt)


class PromptMixin:
    """Mixed into vInference; relies on its make_rows / run_rows / resolve_params / processor / metrics."""

    # ------------------------------------------------------------ core loop
    def prompt_ids(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            return text_prompt_ids(self.processor, prompt)
        if is_messages(prompt):
            return chat_prompt_ids(self.processor, prompt)
        raise TypeError("a prompt must be a string or a list of OpenAI chat messages ({'role', 'content'} dicts)")

    def events(self, rows, slots: int | None = None) -> Iterator[tuple[int, str, Any]]:
        """Run `rows` as one batch (in `slots` device rows: more rows wait for a free one);
        yield (row, "text", delta) and (row, "final", PromptOutput)."""
        start = time.perf_counter()
        texts: dict[int, list[str]] = {}
        first_seen: set[int] = set()
        run = self.run_rows(rows, slots=slots)
        last = None
        try:
            for last, updates in run:
                for i, sample in updates:
                    if i not in first_seen and sample.token_ids:
                        first_seen.add(i)
                        self.metrics.first_token(time.perf_counter() - start)
                    if sample.text:
                        texts.setdefault(i, []).append(sample.text)
                        yield i, "text", sample.text
                    if sample.finish_reason is not None:
                        yield i, "final", self._final_output(rows[i], sample, start)
        finally:
            run.close()
        return last

    def _final_output(self, row, sample, start: float) -> PromptOutput:
        elapsed = max(time.perf_counter() - start, 1e-9)
        count = sample.num_generated_tokens
        self.metrics.request_finished(sample.finish_reason, len(row.prompt_ids), count, elapsed)
        return PromptOutput(text=sample.accumulated_text, generated_tokens=count, tokens_per_second=count / elapsed,
                            finish_reason=sample.finish_reason)

    def collect(self, rows) -> list[PromptOutput]:
        outputs: list[PromptOutput | None] = [None] * len(rows)
        for i, kind, data in self.events(rows):
            if kind == "final":
                outputs[i] = data
        return outputs

    # ------------------------------------------------------------ process_prompt
    def process_prompt(self, prompt, sampling_params: SamplingParams | dict | None = None, stream: bool = False):
        """str or chat messages -> PromptOutput (a list when n > 1), or a generator of text deltas
        whose return value is the final SampleState. list[str] -> one result per string."""
        params = self.resolve_params(sampling_params)
        if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            rows = [row for p in prompt for row in self.make_rows(self.prompt_ids(p), params)]
            if stream:
                if params.n != 1:
                    raise ValueError("stream=True yields one sequence per prompt: use n=1")
                shared = SharedEvents(self.events(rows), len(rows))  # one batch: reading in turns never blocks
                return [shared.deltas(i) for i in range(len(rows))]
            outputs = self.collect(rows)
            return outputs if params.n == 1 else [outputs[i:i + params.n] for i in range(0, len(outputs), params.n)]
        rows = self.make_rows(self.prompt_ids(prompt), params)
        if stream:
            if params.n != 1:
                raise ValueError("stream=True yields one sequence: use n=1 (vSurge streams n > 1 by index)")
            return self._text_deltas(rows)
        outputs = self.collect(rows)
        return outputs[0] if params.n == 1 else outputs

    def _text_deltas(self, rows):
        """Yield the row's text as it completes; return the final SampleState."""
        return SharedEvents(self.events(rows), 1).deltas(0)

    # ------------------------------------------------------------ concurrency
    async def process_prompts_concurrently(
        self,
        prompts: list,
        max_concurrent_requests: int,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        stream: bool = False,
        progress_callback: Callable[[int, int], None] | None = None,
    ):
        """Run prompts on up to `max_concurrent_requests` device rows at once (continuous batching).

        Non-stream: a list of PromptOutput in input order (errors as PromptOutput(error=...)).
        Stream: an async generator of (index, "text" | "error" | "final", data).
        """
        if not isinstance(prompts, (list, tuple)):
            raise ValueError("prompts must be a list")
        if isinstance(sampling_params, (list, tuple)) and len(sampling_params) != len(prompts):
            raise ValueError(f"got {len(sampling_params)} sampling_params for {len(prompts)} prompts")
        events = self._concurrent_events(list(prompts), max(1, max_concurrent_requests), sampling_params,
                                         progress_callback)
        if stream:
            return events
        results: list[PromptOutput | None] = [None] * len(prompts)
        async for index, kind, data in events:
            if kind == "final":
                results[index] = data
            elif kind == "error":
                results[index] = PromptOutput(error=data)
        return results

    def _prepare(self, prompts, sampling_params):
        """-> (rows with their prompt index, errors by prompt index)."""
        prepared, errors = [], {}
        for index, prompt in enumerate(prompts):
            try:
                params = sampling_params[index] if isinstance(sampling_params, (list, tuple)) else sampling_params
                params = self.resolve_params(params)
                if params.n != 1:
                    raise ValueError("process_prompts_concurrently generates one sequence per prompt (n must be 1)")
                (row,) = self.make_rows(self.prompt_ids(prompt), params)
                prepared.append((index, row))
            except Exception as e:  # one bad prompt never sinks the others
                self.metrics.request_failed()
                errors[index] = f"{type(e).__name__}: {e}"
        return prepared, errors

    async def _concurrent_events(self, prompts, batch_size, sampling_params, progress_callback
                                 ) -> AsyncGenerator[tuple[int, str, Any], None]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        total, completed = len(prompts), 0
        prepared, errors = await asyncio.to_thread(self._prepare, prompts, sampling_params)

        def worker():  # device work off the event loop; events come back through the queue
            try:  # continuous batching: a finished row's slot takes the next prompt
                if prepared:
                    for row, kind, data in self.events([r for _, r in prepared], slots=batch_size):
                        loop.call_soon_threadsafe(queue.put_nowait, (prepared[row][0], kind, data))
            except Exception as e:
                for index, _ in prepared:
                    self.metrics.request_failed()
                    loop.call_soon_threadsafe(queue.put_nowait, (index, "error", f"{type(e).__name__}: {e}"))
            loop.call_soon_threadsafe(queue.put_nowait, None)

        for index, message in sorted(errors.items()):
            completed += 1
            if progress_callback:
                progress_callback(completed, total)
            yield index, "error", message
        task = loop.run_in_executor(None, worker)
        finished: set[int] = set()
        while True:
            item = await queue.get()
            if item is None:
                break
            index, kind, data = item
            if index in finished:
                continue  # a batch that failed after some rows had finished
            if kind in ("final", "error"):
                finished.add(index)
                completed += 1
                if progress_callback:
                    progress_callback(completed, total)
            yield index, kind, data
        await task


class SharedEvents:
    """Per-row text generators over one batch's events: whichever generator is read pulls the
    batch forward and buffers the other rows' text, so the rows can be read in any order."""

    def __init__(self, events: Iterator, rows: int):
        self._events = events
        self._buffers: list[list[str]] = [[] for _ in range(rows)]
        self._done = [False] * rows
        self.final_state = None

    def _pull(self) -> bool:
        try:
            row, kind, data = next(self._events)
        except StopIteration as end:
            self.final_state = end.value
            self._done = [True] * len(self._done)
            return False
        if kind == "text":
            self._buffers[row].append(data)
        elif kind == "final":
            self._done[row] = True
        return True

    def deltas(self, row: int):
        """Yield row's text as it completes; return the batch's final SampleState."""
        while True:
            while self._buffers[row]:
                yield self._buffers[row].pop(0)
            if self._done[row] or not self._pull():
                if not self._buffers[row]:
                    while self.final_state is None and self._pull():
                        pass  # run the batch to its end: the return value is its last state
                    return self.final_state
