"""vInference: batch generation on the shared engine, one small engine per batch bucket.

    prompts -> tokenize -> the smallest fitting (batch, prefill_length) bucket engine
            -> one step prefills every prompt (first tokens) -> decode calls of
               `streaming_chunks` steps on the device -> host: text, stop strings, SampleState

Prompt-level APIs (`process_prompt`, `process_prompts_concurrently`) live in
`prompts.PromptMixin`; persistence in `persistence.py`; the seed's step-level
methods (`execute_prefill`, `execute_decode`, `adjust_kwargs`) in steps.py.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Generator, Sequence

import numpy as np
from flax import nnx

from ...engine.request import ActiveRequest, ReturnChannel
from ...engine.sequence import Sequence as EngineSequence
from ...engine.validation import prepare_requests
from ...kv.slot_pages import SlotPages
from ...engine.metrics import EngineMetrics
from ...sampling.params import SamplingParams
from ...hardware.sharding import check_input_partition_spec, mesh_of
from ...tokenizer.compat import chat_prompt_ids, eos_token_ids, pad_token_id
from .buckets import BucketEngines
from .inference_config import vInferenceConfig, vInferencePreCompileConfig
from .prompts import PromptMixin
from .steps import StepMixin
from .state import SampleState

log = logging.getLogger(__name__)


class vInference(StepMixin, PromptMixin):  # noqa: N801 (the seed's name)
    def __init__(self, model, processor_class, generation_config: vInferenceConfig | None = None,
                 seed: int | None = None, input_partition_spec=None, max_new_tokens: int = 512,
                 inference_name: str | None = None):
        self._model = model
        self.processor = processor_class
        config = generation_config or vInferenceConfig(max_new_tokens=max_new_tokens)
        updates = {}
        if config.eos_token_id is None:
            updates["eos_token_id"] = eos_token_ids(processor_class) or list(model.config.eos_token_ids)
        if config.pad_token_id is None:
            updates["pad_token_id"] = pad_token_id(processor_class)
        if config.bos_token_id is None:
            updates["bos_token_id"] = getattr(processor_class, "bos_token_id", None)
        self.generation_config = config.model_copy(update=updates)
        # On a model whose weights live on a mesh, the rows of every step's inputs are split over
        # the mesh axes of input_partition_spec[0] (e.g. PartitionSpec("data")); ignored on one device.
        check_input_partition_spec(input_partition_spec, mesh_of(model))
        self.input_partition_spec = input_partition_spec
        self._inference_name = inference_name or (model.config.name or model.config.architecture).replace(" ", "-")
        self.uuid4 = str(uuid.uuid4())
        self.graphdef, self.graphstate, self.graphother = nnx.split(model, nnx.Param, ...)
        self._metrics = EngineMetrics(self._inference_name)
        self._buckets = BucketEngines(model, processor_class, self.generation_config.max_new_tokens,
                                      self.generation_config.streaming_chunks,
                                      seed if seed is not None else int(np.random.default_rng().integers(2**31)),
                                      on_compile=self._metrics.compiled, input_partition_spec=input_partition_spec,
                                      kv_cache_dtype=self.generation_config.kv_cache_dtype)
        self.precompiled_configs: dict[int, vInferencePreCompileConfig] = {}
        self._limits = None  # built on first use: model_prefill_length may refuse the config
        self._device_lock = threading.Lock()  # one batch on the device at a time

    # ------------------------------------------------------------ seed properties
    @property
    def model(self):
        return self._model

    @property
    def tokenizer(self):
        return self.processor

    @property
    def metrics(self) -> EngineMetrics:
        return self._metrics

    @property
    def inference_name(self) -> str:
        return self._inference_name

    @property
    def SEQUENCE_DIM_MAPPING(self) -> dict[str, int]:  # noqa: N802
        return {"input_ids": 1, "attention_mask": 1, "position_ids": 1}

    @property
    def model_prefill_length(self) -> int:
        """Longest prompt: the model's max sequence length minus max_new_tokens."""
        max_len = getattr(self._model.config, "max_position_embeddings", None)
        if not max_len:
            raise ValueError("the model config has no max_position_embeddings: cannot size the prefill")
        room = max_len - self.generation_config.max_new_tokens
        if room < 1:
            raise ValueError(f"max_new_tokens ({self.generation_config.max_new_tokens}) leaves no room for a "
                             f"prompt in the model's {max_len}-token context")
        return room

    def count_tokens(self, messages=None, oai_like: bool = False, *, text: str | None = None) -> int:
        """Tokens of chat `messages` or of a `text` (the seed's two forms: count_tokens(messages=...),
        count_tokens(text=...); a first positional argument may be either).

        oai_like=False: what this model prefills for it: the messages rendered by its chat template
        with the assistant's generation prompt, or the text encoded as a prompt (special tokens
        included). oai_like=True: counted the way OpenAI counts chat input (its cookbook's
        num_tokens_from_messages), with this model's tokenizer: each message's content tokens plus
        3 per message (and 1 for a `name`), plus 3 that prime the reply; a text is its tokens
        without special tokens. Comparable across models, independent of the template."""
        if text is not None and messages is not None:
            raise TypeError("count_tokens takes messages or text, not both")
        value = text if text is not None else messages
        if value is None:
            raise TypeError("count_tokens needs messages=[...] or text='...'")
        if isinstance(value, str):
            return len(self.processor.encode(value, add_special_tokens=not oai_like))
        if not isinstance(value, list):
            raise TypeError(f"count_tokens takes a string or a list of chat messages, got {type(value).__name__}")
        if not oai_like:
            return len(chat_prompt_ids(self.processor, value))
        from ...tokenizer.chat_template import normalize_messages

        total = 3  # every reply is primed with <|start|>assistant<|message|>
        for message in normalize_messages(value):
            total += 3 + len(self.processor.encode(message["content"], add_special_tokens=False))
            total += 1 if message.get("name") else 0
        return total

    # ------------------------------------------------------------ compilation
    def precompile(self, config: vInferencePreCompileConfig) -> bool:
        """Compile every (batch_size, prefill_length) bucket once, with a progress bar.
        Returns False (and logs why) when a bucket cannot be built, as the seed does."""
        from tqdm.auto import tqdm

        combos = config.combinations()
        for batch, length in tqdm(combos, desc=f"Compiling {self._inference_name}", unit="bucket"):
            if length > self.model_prefill_length:
                log.error("prefill_length %d exceeds model_prefill_length %d", length, self.model_prefill_length)
                return False
            self._buckets.get(batch, length)
        self.precompiled_configs[len(self.precompiled_configs)] = config
        return True

    @property
    def compiled_buckets(self) -> list[tuple[int, int]]:
        return sorted(self._buckets.buckets)

    # ------------------------------------------------------------ requests
    def resolve_params(self, sampling_params) -> SamplingParams:
        default = self.generation_config.sampling_params
        if sampling_params is None:
            return default or SamplingParams(max_tokens=self.generation_config.max_new_tokens)
        return SamplingParams.coerce(sampling_params)

    def make_rows(self, prompt_ids: list[int], params: SamplingParams) -> list[ActiveRequest]:
        """Validate one prompt and expand it into `params.n` requests (the one validator of the engines)."""
        cap = self.generation_config.max_new_tokens
        limit = self.model_prefill_length
        if len(prompt_ids) > limit:
            if not self.generation_config.truncate_prompt:
                raise ValueError(
                    f"the prompt has {len(prompt_ids)} tokens, more than the {limit} this vInference can prefill "
                    f"(context {self._model.config.max_position_embeddings} - max_new_tokens {cap}); "
                    f"set truncate_prompt=True in vInferenceConfig to keep the end of the prompt")
            prompt_ids = list(prompt_ids[-limit:])  # keep the END: the question is usually last
        if params.max_tokens is not None and params.max_tokens > cap:
            raise ValueError(f"max_tokens ({params.max_tokens}) exceeds this vInference's max_new_tokens ({cap})")
        if self._limits is None:
            self._limits = _Limits(self._model.config.vocab_size, limit + cap, limit,
                                   self.generation_config.eos_token_ids, self._buckets.seed)
        return prepare_requests(self._limits, [int(t) for t in prompt_ids], params, ReturnChannel(),
                                max_tokens_cap=cap)

    # ------------------------------------------------------------ generation
    def generate(self, input_ids, attention_mask=None, *, graphstate=None, graphother=None,
                 sampling_params: SamplingParams | None = None, **model_kwargs
                 ) -> Generator[SampleState, None, SampleState]:
        """Yield a SampleState every `streaming_chunks` tokens until every row is finished; the
        generator returns the final SampleState (the seed's annotation).

        input_ids: (B, T) ints, left-padded as HF tokenizers do when attention_mask is given.
        graphstate/graphother: other weights of the same structure (no recompilation).
        model_kwargs: accepted for the seed's signature (see adjust_kwargs).
        """
        inputs = self.adjust_kwargs(input_ids, attention_mask, **model_kwargs)
        params = self.resolve_params(sampling_params)
        rows = [r for ids in inputs["prompts"] for r in self.make_rows(ids, params)]
        state = self.start_state(rows, graphstate, graphother)
        return self._stream_states(state)

    def _stream_states(self, state: SampleState) -> Generator[SampleState, None, SampleState]:
        """Yield each SampleState; the generator's return value (StopIteration.value) is the last one."""
        state = self.execute_prefill(state)
        yield state
        while not state.is_sequence_finished.all():
            state = self.execute_decode(state)
            yield state
        return state

    def run_rows(self, rows: Sequence[ActiveRequest], graphstate=None, graphother=None, slots: int | None = None,
                 *, run=None, bucket_key: tuple[int, int] | None = None):
        """Generator over one batch: yields (SampleState, [(row, ReturnSample), ...]) after each step.
        `slots` caps the device rows (more rows wait for a free slot). Closing it early ends the
        rows that are still running. run: the steps.BatchRun that drives it (its weights are read
        at every step); bucket_key: the (batch, prefill_length) bucket to run in (default: the
        smallest that fits)."""
        longest = max(len(r.prompt_ids) for r in rows)
        batch = min(len(rows), slots or len(rows))
        bucket = self._buckets.get(*(bucket_key or self._buckets.choose(batch, longest, self.model_prefill_length)))
        if run is not None:
            run.bucket_key = (bucket.batch, bucket.prefill_length)
        engine = bucket.engine
        config = engine.config
        # Each run owns its slots and state, so two suspended runs never share a slot.
        scheduler = engine.new_scheduler(SlotPages(config.max_slots, config.max_length, config.page_size))
        seqs = [EngineSequence.of(r, self.processor, engine.vocab_size) for r in rows]
        index = {seq: i for i, seq in enumerate(seqs)}
        if run is not None:
            run.seqs = seqs
        for seq in seqs:
            scheduler.add(seq)
        want_logprobs = any(r.params.logprobs is not None for r in rows)
        # The lock guards each step, not the run: a caller may hold two suspended runs (seed step API).
        with self._device_lock:
            state = bucket.take_state()
        start = time.perf_counter()
        try:
            while scheduler.has_work:
                plan = scheduler.schedule()
                tick = time.perf_counter()
                with self._device_lock:
                    donated, state = state, None  # a failed step leaves no usable state to give back
                    weights = (run.graphstate, run.graphother) if run is not None else (graphstate, graphother)
                    state, out = engine.step(donated, plan, scheduler.masks(plan), graphstate=weights[0],
                                             graphother=weights[1])
                    updates = scheduler.postprocess(plan, out.to_host(want_logprobs))
                failed = next((sample for _, sample in updates if isinstance(sample, BaseException)), None)
                if failed is not None:  # (a row's text failed: the run's caller gets the error)
                    raise failed
                self._metrics.stage("prefill" if plan.chunks else "decode", time.perf_counter() - tick)
                yield (self._snapshot(seqs, bucket.prefill_length, start),
                       [(index[seq], sample) for seq, sample in updates])
        finally:
            for seq in seqs:
                if not seq.finished:
                    scheduler.abort(seq)
            if state is not None:
                bucket.give_back(state)

    def _snapshot(self, seqs: list[EngineSequence], padded_length: int, start: float) -> SampleState:
        return self.layout_state([s.tokens[: s.num_prompt] for s in seqs], [s.generated for s in seqs],
                                 padded_length, [s.output.finished for s in seqs], time.perf_counter() - start,
                                 [s.request.seed for s in seqs])

    # ------------------------------------------------------------ persistence
    def save_inference(self, path) -> None:
        from .persistence import save_inference

        save_inference(self, path)

    @classmethod
    def load_inference(cls, path, model, processor_class) -> "vInference":
        from .persistence import load_inference

        return load_inference(cls, path, model, processor_class)


class _Limits:
    """The engine limits `prepare_requests` checks, for a vInference (before any bucket exists)."""

    def __init__(self, vocab_size, max_length, max_prompt_length, eos, seed: int):
        self.vocab_size, self.max_length, self.max_prompt_length = vocab_size, max_length, max_prompt_length
        self.eos_token_ids = list(eos)
        self._rng = np.random.default_rng(seed)

    def new_seed(self) -> int:
        return int(self._rng.integers(0, 2**63 - 1))
