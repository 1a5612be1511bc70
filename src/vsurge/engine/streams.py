"""The one "merge several streams" helper: the updates of several submitted prompts, in arrival order.

`vSurge.generate(stream=True)` and the HTTP server (one choice per prompt x sample)
both read their submissions through `merged_updates`; leaving early cancels every
submission, which frees their slots.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

_END = object()


async def merged_updates(submissions) -> AsyncIterator[tuple[int, object]]:
    """Yield (submission index, ReturnSample) from every submission until all have ended.

    An exception from one submission is raised here, in order."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, submission) -> None:
        updates = submission.updates()
        try:
            async for samples in updates:
                for sample in samples:
                    await queue.put((index, sample))
        except Exception as exc:  # noqa: BLE001: delivered to the consumer in order
            await queue.put(exc)
        finally:
            await updates.aclose()
            await queue.put(_END)

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(submissions)]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is _END:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        for submission in submissions:
            submission.cancel()
