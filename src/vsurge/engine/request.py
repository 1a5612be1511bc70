"""What travels between vSurge, the driver threads and the caller: requests, results, channels."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import queue
import threading
import time
from typing import Any

from ..sampling.params import SamplingParams


class QueueFullError(RuntimeError):
    """Too many requests are waiting for a slot; retry later."""


class DriverNotReadyError(RuntimeError):
    """The driver is stopped, stopping, or crashed."""


@dataclasses.dataclass
class ReturnSample:
    """One update of one sequence: the new text/tokens of this step and the totals so far."""

    text: str  # new text of this step ("" while a character or a stop string is held back)
    token_ids: list[int]  # new token ids of this step
    accumulated_text: str
    tokens_per_second: float
    num_generated_tokens: int
    time_spent_computing: float
    finish_reason: str | None = None  # "stop" | "length" | "abort" when the sequence ended
    index: int = 0  # which of the request's n samples
    prompt_tokens: int = 0
    stop_reason: str | int | None = None
    logprobs: list[Any] | None = None
    metadata: dict | None = None


_ids = itertools.count()


class ReturnChannel:
    """Thread-safe outputs of one request: driver threads put, the caller consumes.

    Items are ReturnSample, or an Exception (the request failed). `None` is never put:
    a ReturnSample with a finish_reason is the last item of a sequence.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None):
        self.loop = loop
        self._async_queue: asyncio.Queue | None = asyncio.Queue() if loop is not None else None
        self._sync_queue: queue.Queue = queue.Queue()

    def put(self, item) -> None:
        if self.loop is not None:
            try:
                self.loop.call_soon_threadsafe(self._async_queue.put_nowait, item)
            except RuntimeError:  # the caller's loop is closed: nobody is listening any more
                pass
        else:
            self._sync_queue.put(item)

    async def get_async(self):
        return await self._async_queue.get()

    def get(self, timeout: float | None = None):
        return self._sync_queue.get(timeout=timeout)


@dataclasses.dataclass(eq=False)
class ActiveRequest:
    """One sequence to generate, from submission until its last output."""

    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    max_new_tokens: int
    eos_token_ids: list[int]
    channel: ReturnChannel
    index: int = 0  # sample index within the caller's request (n > 1)
    detokenize: bool = True  # False: client-side tokenization, token ids only
    request_id: int = dataclasses.field(default_factory=lambda: next(_ids))
    submitted_at: float = dataclasses.field(default_factory=time.perf_counter)
    cancelled: threading.Event = dataclasses.field(default_factory=threading.Event)
    metadata: dict = dataclasses.field(default_factory=dict)
    adapter: Any = None  # a LoRA adapter (lora/adapter.py Adapter) to generate with; None: the base model
    # images (multimodal/media.py MediaItem) and the prompt as the engine computes it: their embedding
    # positions hold content-hash pseudo-tokens (negative); None: the prompt is text only
    media: tuple = ()
    cache_ids: list[int] | None = None
    # an M-RoPE model's (Qwen2.5-VL): the prompt's (3, L) int rotary positions; tokens past them are at
    # their index + rope_delta on every axis. None: every token at its index
    rope_positions: Any = None
    rope_delta: int = 0

    def cancel(self) -> None:
        """Ask the driver to stop this sequence; its slot is freed within one decode step."""
        self.cancelled.set()

    @property
    def is_cancelled(self) -> bool:
        return self.cancelled.is_set()
