"""Surge (users' `vsurge.vSurge`): the asyncio face of a driver. Tokenizes, validates, submits, streams results back.

One caller request becomes `n` ActiveRequests (one per sample) sharing a
ReturnChannel; closing or cancelling the consumer cancels them, which frees
their slots within one step.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import AsyncGenerator, Sequence

from .engine.engine_config import EngineConfig
from .engine.request import ActiveRequest, ReturnChannel, ReturnSample
from .engine.validation import prepare_requests
from .lora.api import AdapterAPI
from .sampling.params import FIELD_NAMES, FIELDS, SamplingParams
from .engine.streams import merged_updates
from .tokenizer.compat import chat_prompt_ids

_TOKENIZE_IN_THREAD_CHARS = 4000  # longer prompts are tokenized off the event loop


@dataclasses.dataclass
class vSurgeMetadata:  # noqa: N801
    """Free-form caller metadata carried with a request (e.g. the HTTP request id)."""

    values: dict = dataclasses.field(default_factory=dict)


# The seed's vSurgeRequest fields, in its order (positional arguments keep working); its temperature
# default is 0.7. Every other SamplingParams field follows with SamplingParams' own default.
_SEED_FIELDS = ("prompt", "max_tokens", "top_p", "top_k", "min_p", "temperature", "presence_penalty",
                "frequency_penalty", "repetition_penalty", "metadata", "is_client_side_tokenization")
_SEED_DEFAULTS = {"temperature": 0.7}


def _request_fields() -> list[tuple]:
    by_name = {f.name: f for f in FIELDS}

    def spec(name):
        if name == "prompt":
            return (name, "str | list[int]")
        if name == "max_tokens":
            return (name, "int")
        if name == "metadata":
            return (name, "vSurgeMetadata | None", dataclasses.field(default=None))
        if name == "is_client_side_tokenization":
            return (name, "bool", dataclasses.field(default=False))
        f = by_name[name]
        if name in _SEED_DEFAULTS:
            return (name, f.type, dataclasses.field(default=_SEED_DEFAULTS[name]))
        if f.default_factory is not dataclasses.MISSING:
            return (name, f.type, dataclasses.field(default_factory=f.default_factory))
        return (name, f.type, dataclasses.field(default=f.default))

    rest = [f.name for f in FIELDS if f.name not in _SEED_FIELDS]
    return [spec(name) for name in (*_SEED_FIELDS, *rest)]


def _from_sampling_params(cls, prompt, sampling_params: SamplingParams | None = None, *,
                          params: SamplingParams | None = None) -> "vSurgeRequest":
    """The seed's `from_sampling_params(prompt, sampling_params)`; `params=` is the older name."""
    if sampling_params is not None and params is not None:
        raise TypeError("give sampling_params or params, not both")
    chosen = sampling_params if sampling_params is not None else params
    if chosen is None:
        raise TypeError("from_sampling_params needs sampling_params")
    chosen = SamplingParams.coerce(chosen)
    return cls(prompt=prompt, **{name: getattr(chosen, name) for name in FIELD_NAMES})


def _to_sampling_params(self) -> SamplingParams:
    values = {name: getattr(self, name) for name in FIELD_NAMES}
    values["extra"] = values["extra"] or {}
    return SamplingParams(**values)


# A completion request: the seed's fields plus every SamplingParams field (stop, seed, n, logit_bias,
# structured, logprobs, priority, ...). `metadata` travels with every ActiveRequest of it
# (`ActiveRequest.metadata`).
vSurgeRequest = dataclasses.make_dataclass(  # noqa: N816 (the seed's name)
    "vSurgeRequest", _request_fields(),
    namespace={"from_sampling_params": classmethod(_from_sampling_params),
               "to_sampling_params": _to_sampling_params, "__module__": __name__,
               "__doc__": "A completion request: the seed's fields plus every SamplingParams field."})


class Surge(AdapterAPI):
    """vsurge's own Python API over engines and their driver: what the CLI, the server and Ray replicas build.
    Users get it as `vsurge.vSurge`, the seed's name (seed/vsurge_api.py adds the seed's constructors)."""

    def __init__(self, driver, vsurge_name: str | None = None):
        self._driver = driver
        self._name = vsurge_name or getattr(driver, "driver_name", "vsurge")
        if _several_processes():  # process 0 leads, the others follow (scale/multihost.py, scale/remote.py)
            if getattr(driver, "multihost_disaggregated", False):
                from .scale.remote import attach
            else:
                from .scale.multihost import attach
            attach(self)

    @classmethod
    def from_config(cls, model, processor, config: EngineConfig, *, paged: bool = True,
                    vsurge_name: str | None = None, max_queue: int | None = None, interleaved_mode: bool = False,
                    tensor_parallel_size: int | None = None, data_parallel_size: int | None = None, mesh=None,
                    prefill_devices=None, decode_devices=None, prefill_tensor_parallel_size: int | None = None,
                    transfer_backlog: int = 4, make_engine=None, make_driver=None) -> "Surge":
        """A vSurge over engines built from `config`: paged (pages on demand, prefix caching,
        preemption; the pool is `num_pages`, else `hbm_utilization` of the memory free after the
        weights) or dense (a fixed run of KV pages per slot).

        tensor_parallel_size / data_parallel_size (or a (data, model) `mesh`): one engine per
        data-parallel replica, each tensor-parallel over its own device group (scale/replicas.py);
        by default the engine runs where the model's weights are. prefill_devices / decode_devices
        (device indices: "0-2", [3, 4, 5]): disaggregated serving, prefill engines on the first group
        and decode engines on the second (engine/disaggregated.py); each group is one engine
        tensor-parallel over all its devices, or engines of prefill_tensor_parallel_size (prefill) /
        tensor_parallel_size (decode) devices each; interleaved_mode=True makes them all replicas.

        make_engine(model, config) / make_driver(engines, decode_engines or None): what builds the
        engines and the driver (by default an EngineCore on its pool and a Driver; the seed's
        create_vdriver / create_odriver pass its classes)."""
        if make_engine is None:
            from .engine.core import EngineCore
            from .engine.pools import make_pool

            def make_engine(m, c):
                return EngineCore(m, processor, c, make_pool(m, c, paged))
        if make_driver is None:
            from .engine.driver import Driver

            def make_driver(engines, decode):
                return Driver(engines, max_queue, decode_engines=decode, transfer_backlog=transfer_backlog)
        name = vsurge_name or (model.config.name or model.config.architecture)
        if _across_processes(prefill_devices):
            return cls._across_processes(model, processor, make_engine, config, make_driver, name, prefill_devices,
                                         decode_devices, prefill_tensor_parallel_size, tensor_parallel_size)
        models, decode_models = _engine_models(model, tensor_parallel_size, data_parallel_size, mesh,
                                               prefill_devices, decode_devices, prefill_tensor_parallel_size)
        if paged:
            from .scale.replicas import agreed_num_pages

            config = agreed_num_pages(models[0], config)
        engines = [make_engine(m, config) for m in models]
        decode = [make_engine(m, agreed_num_pages(m, config) if paged else config) for m in decode_models]
        if interleaved_mode and decode:
            engines, decode = engines + decode, []
        return cls(make_driver(engines, decode or None), vsurge_name=name)

    @classmethod
    def _across_processes(cls, model, processor, make_engine, config, make_driver, name, prefill_devices,
                          decode_devices, prefill_tensor_parallel_size, tensor_parallel_size) -> "Surge":
        """Disaggregated serving in a multi-process job: process 0 gets the prefill engines and a view
        of every decode engine; the others the decode engines on their devices (scale/remote.py)."""
        from .scale.remote import disaggregated_engines, store_name

        prefill, decode = disaggregated_engines(model, processor, make_engine, config, prefill_devices,
                                                decode_devices, prefill_tensor_parallel_size, tensor_parallel_size,
                                                store_name(name))
        if prefill:
            driver = make_driver(prefill, decode)
        else:  # a process that only runs decode engines: this driver never starts (remote.follow runs them)
            driver = make_driver(decode, None)
        driver.multihost_disaggregated = True
        return cls(driver, vsurge_name=name)

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
    @property
    def engine(self):
        return self._driver.primary_engine

    @property
    def max_length(self) -> int:
        return self.engine.max_length

    @property
    def max_prefill_length(self) -> int:
        return self.engine.max_prompt_length

    # ------------------------------------------------------------ requests
    async def _prompt_ids(self, request: vSurgeRequest) -> list[int]:
        # The seed's is_client_side_tokenization is about the OUTPUT: samples carry token ids only and
        # the client detokenizes them. The prompt is a str (tokenized here) or already token ids.
        prompt = request.prompt
        if isinstance(prompt, (list, tuple)):
            if not all(isinstance(t, int) for t in prompt):
                raise TypeError("a tokenized prompt must be a list of token ids")
            return list(prompt)
        if not isinstance(prompt, str):
            raise TypeError(f"prompt must be a str or a list of token ids, got {type(prompt).__name__}")
        if len(prompt) > _TOKENIZE_IN_THREAD_CHARS:
            return await asyncio.to_thread(self.processor.encode, prompt)
        return self.processor.encode(prompt)

    def submit(self, prompt_ids: list[int], params: SamplingParams, detokenize: bool = True,
               metadata: dict | None = None, adapter: str | None = None) -> "Submission":
        """Submit one prompt's n sequences now (raises if the driver refuses any of them). adapter: the
        name of a LoRA adapter to generate with (`load_adapter`); None: the base model.

        Must be called from the event loop that will consume `Submission.updates()`."""
        channel = ReturnChannel(asyncio.get_running_loop())
        lora = None
        if adapter is not None:
            lora = self.adapter(adapter)
            if lora is None:
                raise ValueError(f"no LoRA adapter named {adapter!r} is loaded (loaded: {self.adapter_names})")
        actives = prepare_requests(self.engine, prompt_ids, params, channel, detokenize, adapter=lora)
        for active in actives:
            active.metadata.update(metadata or {})
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

    async def encode(self, prompts: Sequence[list[int]], kind: str = "embed") -> list:
        """Whole-prompt passes over token-id prompts, batched by the engine (engine/encode.py):
        kind "embed" -> per prompt {"mean": (D,), "last": (D,)} final hidden states; "score" ->
        per prompt (logprob (T-1,), top ids (T-1, 20), top logprobs (T-1, 20)) of its tokens after
        the first. Raises ValueError for a prompt the engine cannot take (nothing is submitted)."""
        from .engine.encode import EncodeRequest
        from .engine.validation import check_prompt

        prompts = [check_prompt(self.engine, p) for p in prompts]
        loop = asyncio.get_running_loop()
        requests = [EncodeRequest(p, kind, ReturnChannel(loop)) for p in prompts]
        try:
            self._driver.submit_encodes(requests)  # one entry of the queue, however many inputs
            results = [await r.channel.get_async() for r in requests]
        finally:
            for request in requests:
                request.cancel()
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return results

    async def complete(self, request: vSurgeRequest) -> AsyncGenerator[list[ReturnSample], None]:
        """Stream one request: yields [ReturnSample] updates until every one of its n samples ends."""
        if not isinstance(request, vSurgeRequest):
            raise TypeError(f"complete takes a vSurgeRequest, got {type(request).__name__}")
        params = request.to_sampling_params()
        prompt_ids = await self._prompt_ids(request)
        metadata = dict(request.metadata.values) if request.metadata else None
        async for samples in self.submit(prompt_ids, params, not request.is_client_side_tokenization,
                                         metadata).updates():
            yield samples

    async def stream_ids(self, prompt_ids: list[int], params: SamplingParams, detokenize: bool = True
                         ) -> AsyncGenerator[list[ReturnSample], None]:
        async for samples in self.submit(prompt_ids, params, detokenize).updates():
            yield samples

    async def generate(self, prompts: str | Sequence[str], sampling_params=None, stream: bool = False):
        """Generate for one or several prompts concurrently.

        stream=True: an async generator of [ReturnSample] updates from any request (each sample's
        `metadata["request_index"]` names its prompt). stream=False: a list with one aggregated
        ReturnSample per prompt (a list of n when n > 1), as the seed returns.
        """
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        if isinstance(sampling_params, (list, tuple)):
            if len(sampling_params) != len(prompts):
                raise ValueError(f"got {len(sampling_params)} sampling_params for {len(prompts)} prompts")
            params_list = [SamplingParams.coerce(p) for p in sampling_params]
        else:
            params_list = [SamplingParams.coerce(sampling_params)] * len(prompts)
        requests = [vSurgeRequest.from_sampling_params(p, sp) for p, sp in zip(prompts, params_list)]
        submissions: list[Submission] = []
        try:
            for r in requests:
                submissions.append(self.submit(await self._prompt_ids(r), r.to_sampling_params(),
                                               not r.is_client_side_tokenization))
        except BaseException:  # a later prompt refused (queue full, bad prompt): nobody would read the others
            for submission in submissions:
                submission.cancel()
            raise
        if stream:
            return self._tagged(submissions)
        finals: dict[int, dict[int, ReturnSample]] = {}
        pieces: dict[tuple[int, int], list[ReturnSample]] = {}
        async for index, sample in merged_updates(submissions):
            pieces.setdefault((index, sample.index), []).append(sample)
            if sample.finish_reason is not None:
                finals.setdefault(index, {})[sample.index] = sample
        results = []
        for index in range(len(requests)):
            merged = [dataclasses.replace(final, text="".join(s.text for s in pieces[(index, i)]),
                                          token_ids=[t for s in pieces[(index, i)] for t in s.token_ids])
                      for i, final in sorted(finals[index].items())]
            results.append(merged[0] if len(merged) == 1 else merged)
        return results

    async def _tagged(self, submissions):
        async for index, sample in merged_updates(submissions):
            sample.metadata = {"request_index": index}
            yield [sample]


def _engine_models(model, tensor_parallel_size, data_parallel_size, mesh, prefill_devices, decode_devices,
                   prefill_tensor_parallel_size) -> tuple[list, list]:
    """(models of the prefill engines, or of every replica; models of the decode engines, or [])."""
    from .scale.replicas import disaggregated_models, replica_models

    if prefill_devices is None and decode_devices is None:
        if prefill_tensor_parallel_size is not None:
            raise ValueError("prefill_tensor_parallel_size needs prefill_devices and decode_devices")
        return replica_models(model, tensor_parallel_size, data_parallel_size, mesh), []
    if data_parallel_size is not None or mesh is not None:
        raise ValueError("with prefill_devices and decode_devices the engines per group come from the groups' "
                         "sizes and the tensor-parallel sizes: data_parallel_size and mesh cannot be given")
    return disaggregated_models(model, prefill_devices, decode_devices, prefill_tensor_parallel_size,
                                tensor_parallel_size)


def _across_processes(prefill_devices) -> bool:
    return prefill_devices is not None and _several_processes()


def _several_processes() -> bool:
    import sys

    return "jax" in sys.modules and sys.modules["jax"].process_count() > 1


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
