"""vSurge: the asyncio face of a driver. Tokenizes, validates, submits, streams results back.

One caller request becomes `n` ActiveRequests (one per sample) sharing a
ReturnChannel; closing or cancelling the consumer cancels them, which frees
their slots within one decode step.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import AsyncGenerator, Sequence

from .engine.driver import vDriver
from .engine.odriver import oDriver
from .engine.oengine import oEngine
from .engine.request import ActiveRequest, ReturnChannel, ReturnSample
from .engine.vengine import vEngine
from .sampling_params import SamplingParams
from .tokenizer.compat import chat_prompt_ids

_TOKENIZE_IN_THREAD_CHARS = 4000  # longer prompts are tokenized off the event loop


@dataclasses.dataclass
class vSurgeMetadata:  # noqa: N801
    """Free-form caller metadata carried with a request (e.g. the HTTP request id)."""

    values: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class vSurgeRequest:  # noqa: N801 (the seed's name)
    """A completion request: the seed's fields plus the rest of SamplingParams."""

    prompt: str | list[int]
    max_tokens: int
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    temperature: float = 0.7
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    metadata: vSurgeMetadata | None = None
    is_client_side_tokenization: bool = False
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    seed: int | None = None
    n: int = 1
    logit_bias: dict[int, float] | None = None
    skip_special_tokens: bool = True

    @classmethod
    def from_sampling_params(cls, prompt, sampling_params: SamplingParams) -> "vSurgeRequest":
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in dataclasses.asdict(sampling_params).items() if k in fields}
        return cls(prompt=prompt, **values)

    def to_sampling_params(self) -> SamplingParams:
        fields = {f.name for f in dataclasses.fields(SamplingParams)}
        values = {k: v for k, v in dataclasses.asdict(self).items() if k in fields}
        return SamplingParams(**values)


class vSurge:  # noqa: N801 (the seed's name)
    def __init__(self, driver, vsurge_name: str | None = None):
        self._driver = driver
        self._name = vsurge_name or getattr(driver, "driver_name", "vsurge")

    @classmethod
    def create_vdriver(cls, model, processor, max_concurrent_decodes: int | None = None,
                       prefill_lengths: list[int] | None = None, max_prefill_length: int | None = None,
                       max_length: int | None = None, seed: int = 894, vsurge_name: str | None = None,
                       max_queue: int | None = None, interleaved_mode: bool = False,
                       detokenizing_blocks: int = 8) -> "vSurge":
        """One vEngine serving both prefill and decode, driven by a vDriver."""
        engine = vEngine(model, processor, max_concurrent_decodes=max_concurrent_decodes,
                         prefill_lengths=prefill_lengths, max_prefill_length=max_prefill_length,
                         max_length=max_length, seed=seed)
        driver = vDriver(prefill_engines=engine, decode_engines=engine, interleaved_mode=interleaved_mode,
                         detokenizing_blocks=detokenizing_blocks, max_queue=max_queue)
        return cls(driver, vsurge_name=vsurge_name or (model.config.name or model.config.architecture))

    @classmethod
    def create_odriver(cls, model, processor, storage=None, manager=None, page_size: int = 128,
                       hbm_utilization: float = 0.6, max_concurrent_prefill: int | None = None,
                       max_concurrent_decodes: int | None = None, prefill_lengths: list[int] | None = None,
                       max_prefill_length: int | None = None, max_length: int | None = None, seed: int = 894,
                       vsurge_name: str | None = None, num_pages: int | None = None,
                       enable_prefix_caching: bool = True, max_queue: int | None = None,
                       detokenizing_blocks: int = 8) -> "vSurge":
        """One oEngine (paged KV cache, chunked prefill, prefix caching), driven by an oDriver.

        The page pool is `num_pages`, else `hbm_utilization` of the memory free after the weights;
        `max_prefill_length` is the prefill chunk (longer prompts take several steps)."""
        engine = oEngine(model, processor, storage=storage, manager=manager,
                         max_concurrent_decodes=max_concurrent_decodes,
                         max_concurrent_prefill=max_concurrent_prefill, prefill_lengths=prefill_lengths,
                         max_prefill_length=max_prefill_length, max_length=max_length, seed=seed,
                         page_size=page_size, hbm_utilization=hbm_utilization, num_pages=num_pages,
                         enable_prefix_caching=enable_prefix_caching)
        driver = oDriver(engine, detokenizing_blocks=detokenizing_blocks, max_queue=max_queue)
        return cls(driver, vsurge_name=vsurge_name or (model.config.name or model.config.architecture))

    # ------------------------------------------------------------ seed properties
    @property
    def driver(self):
        return self._driver

    @property
    def processor(self):
        return self._driver.processor

    @property
    def vsurge_name(self) -> str:
        return self._name

    @property
    def metrics(self):
        return self._driver.metrics

    @property
    def ready(self) -> bool:
        return self._driver.ready

    def compile(self) -> None:
        self._driver.compile()

    def start(self) -> None:
        self._driver.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._driver.stop(timeout)

    def count_tokens(self, text_or_conversation) -> int:
        if isinstance(text_or_conversation, str):
            return len(self.processor.encode(text_or_conversation))
        if isinstance(text_or_conversation, list):
            return len(chat_prompt_ids(self.processor, text_or_conversation))
        raise ValueError("count_tokens takes a string or a list of chat messages")

    # ------------------------------------------------------------ limits
    def _engine(self):
        return self._driver.primary_engine

    @property
    def max_length(self) -> int:
        return self._engine().max_length

    @property
    def max_prefill_length(self) -> int:
        return self._engine().max_prompt_length

    def validate_lengths(self, prompt_tokens: int, max_tokens: int) -> None:
        if prompt_tokens == 0:
            raise ValueError("the prompt is empty")
        if prompt_tokens > self.max_prefill_length:
            raise ValueError(f"the prompt has {prompt_tokens} tokens, more than the {self.max_prefill_length} "
                             f"this server can prefill")
        if prompt_tokens + max_tokens > self.max_length:
            raise ValueError(
                f"This model's maximum context length is {self.max_length} tokens. However, you requested "
                f"{max_tokens} output tokens and your prompt contains {prompt_tokens} input tokens, "
                f"for a total of {prompt_tokens + max_tokens} tokens.")

    # ------------------------------------------------------------ requests
    async def _prompt_ids(self, request: vSurgeRequest) -> list[int]:
        prompt = request.prompt
        if request.is_client_side_tokenization or isinstance(prompt, (list, tuple)):
            if not isinstance(prompt, (list, tuple)) or not all(isinstance(t, int) for t in prompt):
                raise TypeError("with client-side tokenization the prompt must be a list of token ids")
            return list(prompt)
        if not isinstance(prompt, str):
            raise TypeError(f"prompt must be a str or a list of token ids, got {type(prompt).__name__}")
        if len(prompt) > _TOKENIZE_IN_THREAD_CHARS:
            return await asyncio.to_thread(self.processor.encode, prompt)
        return self.processor.encode(prompt)

    def make_requests(self, prompt_ids: list[int], params: SamplingParams, channel: ReturnChannel,
                      detokenize: bool = True) -> list[ActiveRequest]:
        max_tokens = params.max_tokens if params.max_tokens is not None else self.max_length - len(prompt_ids)
        self.validate_lengths(len(prompt_ids), max_tokens)
        vocab = self._engine().model.config.vocab_size
        bad = [t for t in prompt_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"token id {bad[0]} is out of range for the vocabulary of size {vocab}")
        for token in (params.logit_bias or {}):
            if not 0 <= token < vocab:
                raise ValueError(f"logit_bias token id {token} is out of range for the vocabulary of size {vocab}")
        eos = params.eos_ids(self._engine().eos_token_ids)
        base = params.seed if params.seed is not None else self._engine().new_seed()
        return [ActiveRequest(prompt_ids, params, base + i, max_tokens, eos, channel, index=i, detokenize=detokenize)
                for i in range(params.n)]

    async def complete(self, request: vSurgeRequest) -> AsyncGenerator[list[ReturnSample], None]:
        """Stream one request: yields [ReturnSample] updates until every one of its n samples ends."""
        params = request.to_sampling_params() if isinstance(request, vSurgeRequest) else None
        if params is None:
            raise TypeError(f"complete takes a vSurgeRequest, got {type(request).__name__}")
        prompt_ids = await self._prompt_ids(request)
        async for samples in self.stream_ids(prompt_ids, params,
                                             detokenize=not request.is_client_side_tokenization):
            yield samples

    def submit(self, prompt_ids: list[int], params: SamplingParams, detokenize: bool = True) -> "Submission":
        """Submit one prompt's n sequences now (raises if the driver refuses any of them).

        Must be called from the event loop that will consume `Submission.updates()`."""
        channel = ReturnChannel(asyncio.get_running_loop())
        actives = self.make_requests(prompt_ids, params, channel, detokenize)
        submitted = []
        try:
            for active in actives:
                self._driver.submit_request(active)
                submitted.append(active)
        except BaseException:
            for active in submitted:
                active.cancel()
            raise
        return Submission(actives, channel)

    async def stream_ids(self, prompt_ids: list[int], params: SamplingParams, detokenize: bool = True
                         ) -> AsyncGenerator[list[ReturnSample], None]:
        async for samples in self.submit(prompt_ids, params, detokenize).updates():
            yield samples

    async def generate(self, prompts: str | Sequence[str], sampling_params=None, stream: bool = False):
        """Generate for one or several prompts concurrently.

        stream=True: an async generator of [ReturnSample] updates from any request (each sample's
        `request_index` in `metadata` names its prompt). stream=False: one aggregated ReturnSample
        per prompt (a list of n when n > 1).
        """
        single = isinstance(prompts, str)
        prompts = [prompts] if single else list(prompts)
        if isinstance(sampling_params, (list, tuple)):
            if len(sampling_params) != len(prompts):
                raise ValueError(f"got {len(sampling_params)} sampling_params for {len(prompts)} prompts")
            params_list = [SamplingParams.coerce(p) for p in sampling_params]
        else:
            params_list = [SamplingParams.coerce(sampling_params)] * len(prompts)
        requests = [vSurgeRequest.from_sampling_params(p, sp) for p, sp in zip(prompts, params_list)]
        if stream:
            return self._merged_stream(requests)
        results = await asyncio.gather(*(self._collect(r) for r in requests))
        return results[0] if single else results

    async def _collect(self, request: vSurgeRequest):
        finals: dict[int, ReturnSample] = {}
        texts: dict[int, list[str]] = {}
        ids: dict[int, list[int]] = {}
        async for samples in self.complete(request):
            for s in samples:
                texts.setdefault(s.index, []).append(s.text)
                ids.setdefault(s.index, []).extend(s.token_ids)
                if s.finish_reason is not None:
                    finals[s.index] = s
        merged = [dataclasses.replace(finals[i], text="".join(texts[i]), token_ids=ids[i]) for i in sorted(finals)]
        return merged[0] if len(merged) == 1 else merged

    async def _merged_stream(self, requests: list[vSurgeRequest]):
        queue: asyncio.Queue = asyncio.Queue()
        done = object()

        async def pump(index: int, request: vSurgeRequest):
            try:
                async for samples in self.complete(request):
                    for s in samples:
                        s.metadata = {"request_index": index}
                    await queue.put(samples)
            except Exception as exc:  # delivered to the consumer in order
                await queue.put(exc)
            finally:
                await queue.put(done)

        tasks = [asyncio.create_task(pump(i, r)) for i, r in enumerate(requests)]
        try:
            remaining = len(tasks)
            while remaining:
                item = await queue.get()
                if item is done:
                    remaining -= 1
                elif isinstance(item, Exception):
                    raise item
                else:
                    yield item
        finally:
            for task in tasks:
                task.cancel()


class Submission:
    """The running sequences of one submitted prompt."""

    def __init__(self, actives: list[ActiveRequest], channel: ReturnChannel):
        self.actives = actives
        self.channel = channel

    def cancel(self) -> None:
        for active in self.actives:
            active.cancel()

    async def updates(self) -> AsyncGenerator[list[ReturnSample], None]:
        """[ReturnSample] per update until every sequence ended; leaving early cancels them."""
        try:
            remaining = len(self.actives)
            while remaining:
                item = await self.channel.get_async()
                if isinstance(item, BaseException):
                    raise item
                if item.finish_reason is not None:
                    remaining -= 1
                yield [item]
        finally:  # the consumer went away or failed: free the slots
            self.cancel()
