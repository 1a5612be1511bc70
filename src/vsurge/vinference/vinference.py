"""vInference: batch generation with precompiled buckets and an on-device decode loop.

    prompts -> tokenize -> pad into the smallest fitting (batch, prefill_length) bucket
            -> prefill (first token) -> decode chunks of `streaming_chunks` steps on the device
            -> host: detokenize, stop strings, yield SampleState / text

Prompt-level APIs (`process_prompt`, `process_prompts_concurrently`) live in
`prompts.PromptMixin`; persistence in `persistence.py`.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from typing import Any, Generator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ..metrics import EngineMetrics
from ..ops.sampling import SamplingArrays
from ..sampling_params import SamplingParams
from ..tokenizer.compat import chat_prompt_ids, eos_token_ids, pad_token_id
from .buckets import EOS_WIDTH, BucketCompiler, pad_rows
from .config import vInferenceConfig, vInferencePreCompileConfig
from .prompts import PromptMixin
from .state import SampleState


@dataclasses.dataclass
class RowRequest:
    """One sequence to generate: its prompt, sampling and limits."""

    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    max_new: int
    eos: list[int]


class vInference(PromptMixin):  # noqa: N801 (the seed's name)
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
        self.input_partition_spec = input_partition_spec
        self._inference_name = inference_name or (model.config.name or model.config.architecture).replace(" ", "-")
        self._rng = np.random.default_rng(seed)
        self.uuid4 = str(uuid.uuid4())
        self.graphdef, self.graphstate, self.graphother = nnx.split(model, nnx.Param, ...)
        self._metrics = EngineMetrics(self._inference_name)
        self._buckets = BucketCompiler(self.graphdef, self.graphstate, self.graphother, model.config.vocab_size,
                                       self.generation_config.max_new_tokens,
                                       self.generation_config.streaming_chunks, on_compile=self._metrics.compiled)
        self.precompiled_configs: dict[int, vInferencePreCompileConfig] = {}
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

    def count_tokens(self, text_or_messages, oai_like: bool = False) -> int:
        """Tokens of a text, or of chat messages rendered with the chat template (oai_like ignored: same)."""
        if isinstance(text_or_messages, str):
            return len(self.processor.encode(text_or_messages))
        if isinstance(text_or_messages, list):
            return len(chat_prompt_ids(self.processor, text_or_messages))
        raise TypeError("count_tokens takes a string or a list of chat messages")

    # ------------------------------------------------------------ compilation
    def precompile(self, config: vInferencePreCompileConfig) -> bool:
        """Compile every (batch_size, prefill_length) combination once, with a progress bar."""
        from tqdm.auto import tqdm

        combos = config.combinations()
        for batch, length in tqdm(combos, desc=f"Compiling {self._inference_name}", unit="bucket"):
            if length > self.model_prefill_length:
                raise ValueError(f"prefill_length {length} exceeds model_prefill_length {self.model_prefill_length}")
            self._buckets.get(batch, length)
        self.precompiled_configs[len(self.precompiled_configs)] = config
        return True

    @property
    def compiled_buckets(self) -> list[tuple[int, int]]:
        return sorted(self._buckets.buckets)

    # ------------------------------------------------------------ requests -> rows
    def resolve_params(self, sampling_params) -> SamplingParams:
        default = self.generation_config.sampling_params
        if sampling_params is None:
            return default or SamplingParams(max_tokens=self.generation_config.max_new_tokens)
        return SamplingParams.coerce(sampling_params)

    def make_rows(self, prompt_ids: list[int], params: SamplingParams) -> list[RowRequest]:
        """Validate one prompt and expand it into `params.n` rows."""
        cap = self.generation_config.max_new_tokens
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        vocab = self._model.config.vocab_size
        bad = [t for t in prompt_ids if not 0 <= int(t) < vocab]
        if bad:
            raise ValueError(f"token id {bad[0]} is out of range for the vocabulary of size {vocab}")
        limit = self.model_prefill_length
        if len(prompt_ids) > limit:
            if not self.generation_config.truncate_prompt:
                raise ValueError(
                    f"the prompt has {len(prompt_ids)} tokens, more than the {limit} this vInference can prefill "
                    f"(context {self._model.config.max_position_embeddings} - max_new_tokens {cap}); "
                    f"set truncate_prompt=True in vInferenceConfig to keep the end of the prompt")
            prompt_ids = list(prompt_ids[-limit:])  # keep the END: the question is usually last
        max_new = cap if params.max_tokens is None else params.max_tokens
        if max_new > cap:
            raise ValueError(f"max_tokens ({max_new}) exceeds this vInference's max_new_tokens ({cap})")
        eos = params.eos_ids(self.generation_config.eos_token_ids)
        if len(eos) > EOS_WIDTH:
            raise ValueError(f"at most {EOS_WIDTH} stop token ids (eos included) are supported, got {len(eos)}")
        base = params.seed if params.seed is not None else int(self._rng.integers(0, 2**63 - 1))
        return [RowRequest([int(t) for t in prompt_ids], params, base + i, max_new, eos) for i in range(params.n)]

    # ------------------------------------------------------------ generation
    def generate(self, input_ids, attention_mask=None, *, graphstate=None, graphother=None,
                 sampling_params: SamplingParams | None = None, **model_kwargs) -> Generator[SampleState, Any, SampleState]:
        """Yield a SampleState every `streaming_chunks` tokens until every row is finished.

        input_ids: (B, T) ints, left-padded as HF tokenizers do when attention_mask is given.
        graphstate/graphother: other weights of the same structure (no recompilation).
        """
        if model_kwargs:
            raise ValueError(f"unsupported model kwargs: {', '.join(sorted(model_kwargs))}")
        ids = np.asarray(input_ids)
        if ids.ndim == 1:
            ids = ids[None]
        mask = np.ones_like(ids) if attention_mask is None else np.asarray(attention_mask).reshape(ids.shape)
        params = self.resolve_params(sampling_params)
        rows = []
        for r in range(ids.shape[0]):
            rows.extend(self.make_rows(ids[r][mask[r].astype(bool)].tolist(), params))
        return self.run_rows(rows, graphstate=graphstate, graphother=graphother)

    def run_rows(self, rows: Sequence[RowRequest], graphstate=None, graphother=None):
        """Generator over SampleStates of one batch. `send(rows)` marks rows finished from the host."""
        gs = self.graphstate if graphstate is None else graphstate
        go = self.graphother if graphother is None else graphother
        longest = max(len(r.prompt_ids) for r in rows)
        batch, length = self._buckets.choose(len(rows), longest, self.model_prefill_length)
        bucket = self._buckets.get(batch, length)
        inputs = self._device_inputs(rows, batch, length)
        lengths = inputs[1]
        with self._device_lock:
            start = time.perf_counter()
            state = bucket.prefill(gs, go, *inputs)
            snapshot = self._snapshot(state, length, lengths, start)
            self._metrics.stage("prefill", time.perf_counter() - start)
            while True:
                stop_rows = yield snapshot
                finished = snapshot.is_sequence_finished.copy()
                if stop_rows:
                    finished[list(stop_rows)] = True
                    state = dataclasses.replace(state, finished=jnp.asarray(finished))
                if finished[: len(rows)].all():
                    return snapshot
                tick = time.perf_counter()
                state = bucket.decode(gs, go, state)
                snapshot = self._snapshot(state, length, lengths, start)
                self._metrics.stage("decode", time.perf_counter() - tick)

    def _device_inputs(self, rows: Sequence[RowRequest], batch: int, length: int):
        vocab = self._model.config.vocab_size
        tokens = np.zeros((batch, length), np.int32)
        for i, r in enumerate(rows):
            tokens[i, : len(r.prompt_ids)] = r.prompt_ids
        lengths = pad_rows([np.int32(len(r.prompt_ids)) for r in rows], batch, 1)
        max_new = pad_rows([np.int32(r.max_new) for r in rows], batch, 1)  # padding rows stop at once
        eos = pad_rows([np.asarray(r.eos + [-1] * (EOS_WIDTH - len(r.eos)), np.int32) for r in rows], batch, -1)
        sampling = SamplingArrays.from_params([r.params for r in rows], [r.seed for r in rows])
        neutral = SamplingArrays.neutral(batch - len(rows))
        sampling = jax.tree.map(lambda a, b: np.concatenate([a, b]), sampling, neutral)
        bias = np.zeros((batch, vocab), np.float32)
        for i, r in enumerate(rows):
            for token, value in (r.params.logit_bias or {}).items():
                if not 0 <= token < vocab:
                    raise ValueError(f"logit_bias token id {token} is out of range for the vocabulary of size {vocab}")
                bias[i, token] = value
        return tokens, lengths, sampling, bias, eos, max_new

    def _snapshot(self, state, padded_length: int, lengths: np.ndarray, start: float) -> SampleState:
        sequences, generated, finished, running = jax.device_get(
            (state.sequences, state.generated, state.finished, state.running_token))
        elapsed = max(time.perf_counter() - start, 1e-9)
        return SampleState(
            sequences=sequences,
            current_length=lengths + generated,
            running_token=running[:, None],
            is_sequence_finished=finished,
            generated_tokens=int(generated.max()),
            tokens_per_second=float(generated.sum()) / elapsed,
            padded_length=padded_length,
            generated_tokens_per_row=generated,
            prompt_lengths=lengths,
            prng_key=state.sampling.key_data,
            cache=state.cache,
        )

    # ------------------------------------------------------------ persistence
    def save_inference(self, path) -> None:
        from .persistence import save_inference

        save_inference(self, path)

    @classmethod
    def load_inference(cls, path, model, processor_class) -> "vInference":
        from .persistence import load_inference

        return load_inference(cls, path, model, processor_class)
