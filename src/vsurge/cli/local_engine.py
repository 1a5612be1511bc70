"""The engine behind `vsurge chat` and `vsurge generate`: the server's vSurge path, sized for one user.

Everything compiles in `start()` (a progress bar), through the same persistent
compilation cache as `vsurge serve`, so the first reply runs the programs the
later ones run and a second start loads them from disk in seconds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import time
from pathlib import Path
from typing import Callable, Mapping

from ..engine.engine_config import EngineConfig
from ..sampling.params import SamplingParams

# One user: 2 decode slots (with weights in blocks a lone row has its own program) and prompts
# prefilled 64 tokens a step, with no decode rows beside them. One prompt-row length only: the
# scheduler fills the longest row a prompt fits, so with 512-token rows too a 26-token question would
# pay for 512 (0.8 s instead of 0.15 s on 2 loaded cores); 64 covers a first chat turn in one step,
# and longer prompts take more steps (600 tokens: ~1.9 s, against ~1.5 s with 128-token rows).
# The prefix cache keeps whole pages of the conversation, so a later turn prefills little more than
# what is new. Smaller pages would cache more, but a decode program unrolls its attention per page
# of its window: 32-token pages made the default context's window take minutes to load from the cache.
CLI_SLOTS = 2
CLI_PROMPT_ROWS = (64,)
CLI_PAGE_SIZE = 128
CLI_DECODE_STEPS = 4
CLI_LORA_RANK = 64  # --lora: one slot, as wide as the adapters vsurge serves (its rank padded to this)


@dataclasses.dataclass
class Reply:
    """One reply: its text and tokens so far, and how fast they came."""

    prompt_tokens: int
    text: str = ""
    token_ids: list[int] = dataclasses.field(default_factory=list)
    finish_reason: str | None = None  # "stop", "length", or "interrupted" (Ctrl-C)
    seed: int | None = None
    submitted_at: float = dataclasses.field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None

    @property
    def first_token_s(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.submitted_at

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Steady-state decode speed: the tokens after the first over the time since it came."""
        if self.first_token_at is None or len(self.token_ids) < 2 or self.last_token_at <= self.first_token_at:
            return None
        return (len(self.token_ids) - 1) / (self.last_token_at - self.first_token_at)

    @property
    def total_s(self) -> float:
        return (self.finished_at or time.perf_counter()) - self.submitted_at

    def timing_line(self) -> str:
        parts = [f"{len(self.token_ids)} tokens"]
        if self.first_token_s is not None:
            parts.append(f"first after {self.first_token_s:.2f}s")
        if self.decode_tokens_per_s is not None:
            parts.append(f"then {self.decode_tokens_per_s:.1f} tok/s")
        if self.finish_reason not in (None, "stop"):
            parts.append(self.finish_reason)
        return "[" + ", ".join(parts) + "]"

    def as_json(self) -> dict:
        return {"text": self.text, "tokens": self.token_ids, "finish_reason": self.finish_reason,
                "prompt_tokens": self.prompt_tokens, "completion_tokens": len(self.token_ids), "seed": self.seed,
                "timings": {"first_token_s": _round(self.first_token_s),
                            "decode_tokens_per_s": _round(self.decode_tokens_per_s),
                            "total_s": _round(self.total_s)}}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def status(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class LocalEngine:
    """A loaded, compiled and running vSurge for the command line. Use as a context manager."""

    def __init__(self, surge, processor, adapter: str | None = None):
        self.surge = surge
        self.processor = processor
        self.adapter = adapter  # the LoRA adapter every reply uses (--lora), or None
        self._runner = asyncio.Runner()

    @classmethod
    def start(cls, model: str, *, dtype=None, quantization=None, activation_passes=None,
              settings: Mapping[str, object] | None = None,
              compilation_cache: str | None = None, tensor_parallel_size: int | None = None,
              lora: str | None = None, mmproj: str | None = None) -> "LocalEngine":
        """settings: EngineConfig values from the command line (arguments.CHAT_ENGINE_FLAGS: --max-length), over
        the one-user sizing above; the rest are EngineConfig's defaults (its one default context length too)."""
        from ..errors import ModelLoadError
        from ..loading import DEFAULT_MODEL_NAME, load, resolve_model_path
        from ..vsurge import Surge

        use_cache_dir(compilation_cache)
        status(f"Loading {model} ...")
        try:
            path = resolve_model_path(model)
            loaded, processor = load(path, dtype=dtype, quantization=quantization, activation_passes=activation_passes,
                                     mmproj=mmproj,
                                     **({"tensor_parallel_size": tensor_parallel_size} if tensor_parallel_size else {}))
        except (ModelLoadError, ValueError) as e:
            raise SystemExit(f"vsurge: error: {e}") from None
        status(describe_model(loaded))
        try:
            sizing = dict(max_slots=CLI_SLOTS, max_prefill_rows=1, chunk_lengths=CLI_PROMPT_ROWS,
                          page_size=CLI_PAGE_SIZE, decode_steps=CLI_DECODE_STEPS, prefill_first=True,
                          **({"max_loras": 1, "max_lora_rank": CLI_LORA_RANK} if lora else {}))
            config = EngineConfig.fitted(loaded.config.max_position_embeddings, **(sizing | dict(settings or {})))
            surge = Surge.from_config(loaded, processor, config, paged=True,
                                       vsurge_name=DEFAULT_MODEL_NAME if model == "default" else None)
            if lora:
                adapter = surge.load_adapter("lora", lora)
                status(f"LoRA adapter {lora}: rank {adapter.rank} on {', '.join(adapter.modules)}")
        except ValueError as e:
            raise SystemExit(f"vsurge: error: {e}") from None
        begin = time.perf_counter()
        surge.compile()  # the progress bar "Compiling EngineCore: n/N programs", then a warm-up sequence
        surge.start()
        engine = cls(surge, processor, "lora" if lora else None)
        cached = compilation_cache if compilation_cache and compilation_cache.lower() != "none" else None
        status(f"Ready in {time.perf_counter() - begin:.1f}s"
               + (f" (compiled programs are cached in {cached})." if cached else "."))
        return engine

    # ------------------------------------------------------------ prompts
    @property
    def max_length(self) -> int:
        return self.surge.max_length

    def chat_prompt(self, messages: list[dict]):
        """Token ids of the conversation; with image parts ({"type": "image", "data": bytes}) a
        MultimodalPrompt (ValueError: the model takes no images, or one cannot be decoded)."""
        from ..multimodal.chat import chat_prompt
        from ..tokenizer.compat import chat_prompt_ids
        from ..tokenizer.vision_chat import image_parts

        parts = image_parts(messages)
        if not parts:
            return chat_prompt_ids(self.processor, messages)
        if getattr(self.processor, "images", None) is None:
            raise ValueError("image inputs are not supported by this model")
        return chat_prompt(self.processor, messages, [p["data"] for p in parts])[1]

    def raw_prompt(self, text: str) -> list[int]:
        return list(self.processor.encode(text))

    # ------------------------------------------------------------ replies
    def reply(self, prompt_ids: list[int], params: SamplingParams,
              on_text: Callable[[str], None] | None = None) -> Reply:
        """Generate one reply, calling `on_text` with each new piece of text.

        Ctrl-C stops it: the request is cancelled (its slot freed) and the Reply returned so far has
        finish_reason "interrupted"."""
        reply = Reply(prompt_tokens=len(prompt_ids), seed=params.seed)
        try:
            self._runner.run(self._stream(prompt_ids, params, reply, on_text))
        except KeyboardInterrupt:
            reply.finish_reason = "interrupted"
        reply.finished_at = time.perf_counter()
        return reply

    async def _stream(self, prompt_ids, params, reply: Reply, on_text) -> None:
        reply.submitted_at = time.perf_counter()
        async for samples in self.surge.submit(prompt_ids, params, adapter=self.adapter).updates():
            for sample in samples:
                if sample.token_ids:
                    now = time.perf_counter()
                    reply.first_token_at = reply.first_token_at or now
                    reply.last_token_at = now
                    reply.token_ids.extend(sample.token_ids)
                if sample.text:
                    reply.text += sample.text
                    if on_text is not None:
                        on_text(sample.text)
                if sample.finish_reason is not None:
                    reply.finish_reason = sample.finish_reason

    def close(self) -> None:
        self.surge.stop(timeout=1.0)
        self._runner.close()

    def __enter__(self) -> "LocalEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def describe_kv_pool(model, engine) -> str:
    """The start-up line about an engine's KV page pool: pages, tokens, bytes, storage dtype, pages
    per GiB. `model`: this process's model (a remote decode engine holds none; its pool is of it)."""
    from ..kv.paged import pool_dtype, pool_page_bytes
    from ..kv.quant import is_quantized

    pool, role = engine.pool, engine.config.role
    dtype, per_page = pool_dtype(model, engine.config), pool_page_bytes(model, engine.config)
    held = f"{dtype.name} with float16 scales" if is_quantized(dtype) else dtype.name
    return (f"Paged KV cache{'' if role == 'both' else ' of a ' + role + ' engine'}: {pool.num_pages} pages of "
            f"{pool.page_size} tokens ({pool.max_tokens} tokens, {pool.num_pages * per_page / 2**20:.1f} MiB, "
            f"{held}, {2**30 // per_page} pages per GiB)"
            + (f"; sized {pool.sized_by}" if pool.sized_by else "")
            + (f"; {backend} attention backend" if (backend := getattr(engine, "attention_backend", None)) else ""))


def describe_model(model) -> str:
    """The start-up line about the loaded weights: their bytes, how they are held, and the CPU's ISA
    with the kernel that multiplies blocks (what decides the speed here)."""
    from .. import kernels
    from ..hardware.devices import platform

    formats = model.block_formats()
    listed = ", ".join(f"{f} {n}" for f, n in sorted(formats.items()))
    held = (f"{sum(formats.values())} matrices in GGUF blocks ({listed}), the rest {model.param_dtype.name}"
            if formats else f"{model.param_dtype.name}" + (f", {model.quantization}" if model.quantization else ""))
    if model.stack_dtype != model.param_dtype:  # a GGUF file's expert stacks (loading/__init__.py)
        held += f" but the expert stacks {model.stack_dtype.name}"
    line = f"Weights: {model.weight_bytes / 2**20:.1f} MiB, {held}"
    if platform() == "cpu":
        line += f"; CPU ISA {kernels.cpu_isa()}, block kernel {kernels.variant() or 'unavailable'}"
        if model.activation_passes:
            line += (" in two passes (activations' rounding residual too)" if model.activation_passes == 2
                     else " in one pass (llama.cpp's arithmetic)")
    return line


def use_cache_dir(directory: str | None) -> None:
    """Turn on JAX's persistent compilation cache (None or "none": compile in memory only)."""
    if directory and directory.lower() != "none":
        from ..hardware.compilation_cache import use_compilation_cache

        use_compilation_cache(Path(directory).expanduser())
