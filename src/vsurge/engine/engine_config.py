"""EngineConfig: every setting of an engine in one frozen (hashable) dataclass.

The seed API spreads these over keyword arguments of vEngine/oEngine and
vSurge.create_vdriver/create_odriver (`max_concurrent_decodes`,
`max_prefill_length`, `prefill_lengths`, `max_concurrent_prefill`, ...);
seed/engine_kwargs.py maps them here once. The compiled shapes (buckets) are
derived from the config, so two engines with equal configs run the same programs.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..kv import ATTENTION_BACKENDS, KV_CACHE_DTYPES, STATE_DTYPES

COMPILE_AT_START = ("auto", "all", "serving")  # engine/deferred_programs.py

SCHEDULING_POLICIES = ("fcfs", "priority")
ROLES = ("both", "prefill", "decode")
EOS_WIDTH = 32  # most end-of-sequence ids (eos + stop_token_ids) one request may have

log = logging.getLogger(__name__)


def _powers(start: int, stop: int, factor: int = 2) -> list[int]:
    out, n = [], start
    while n < stop:
        out.append(n)
        n *= factor
    return out


def default_slots() -> int:
    """Decode slots for this machine when none are asked for: the batch where the step's matmuls
    stop getting cheaper per row (CPU: 32 on 2 cores, more with more cores; accelerators: 128)."""
    import jax  # only when a default is needed: the scheduler's tests never get here

    if jax.default_backend() != "cpu":
        return 128
    return max(32, min(128, 16 * (os.cpu_count() or 2)))


DEFAULT_MAX_LENGTH = 2048  # the default context length (prompt + reply): EngineConfig's, every CLI's
GiB = 1 << 30


# ------------------------------------------------------------ the declaration of a field
@dataclass(frozen=True)
class Check:
    """A field's own check: `ok(value)`, else "<name> must be <what>, got <value>"."""

    what: str
    ok: Callable[[Any], bool]
    choices: tuple = ()  # the values a flag may take (one_of)


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def at_least(low: int) -> Check:
    return Check(f"at least {low}", lambda v: _integer(v) and v >= low)


def int_in(low: int, high: int) -> Check:
    return Check(f"in [{low}, {high}]", lambda v: _integer(v) and low <= v <= high)


def one_of(choices) -> Check:
    named = tuple(c for c in choices if c is not None)
    return Check(f"one of {', '.join(named)}", lambda v: v in choices, named)


@dataclass(frozen=True)
class Setting:
    """What EngineConfig declares about one field (its dataclass metadata): its check, and the
    `vsurge serve` flag that sets it (cli/arguments.py adds the flags with `add_flags`, cli/commands.py
    reads them with `flag_values`; `vsurge generate` / `chat` take those in `CHAT_ENGINE_FLAGS`)."""

    check: Check | None = None
    flag: str | None = None  # None: not on the command line
    help: str = ""
    unit: int = 1  # field = flag value * unit (the GB flags of byte fields)
    flag_default: Any = ...  # the flag's default, where not the field's (...: the field's)
    off: bool = False  # a True-by-default field that the flag (--no-...) turns off
    parse: Callable[[str], Any] | None = None  # the flag's text -> the field's value


def setting(default, **spec) -> Any:
    return dataclasses.field(default=default, metadata={"setting": Setting(**spec)})


def _lengths(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


@dataclass(frozen=True)
class EngineConfig:
    max_slots: int = setting(
        32, check=at_least(1), flag="--max-concurrent-decodes", flag_default=None,
        help="sequences generating at once (default: chosen for the machine, 32 on a small CPU)")
    max_length: int = setting(
        DEFAULT_MAX_LENGTH, check=at_least(2), flag="--max-length",
        help="context length per sequence: the prompt (the conversation) plus the reply, at most the model's "
             "(default %(default)s)")
    max_prompt_length: int | None = setting(  # None = max_length - 1
        None, flag="--max-prefill-length", help="longest prompt (default: max-length - 1)")
    prefill_tokens: int = setting(  # vLLM's max_num_batched_tokens
        512, check=at_least(1), flag="--prefill-tokens",
        help="prompt tokens one step computes (prompts longer than this take several steps)")
    chunk_lengths: tuple[int, ...] = setting(  # () = derived (chunk_shapes)
        (), flag="--prefill-lengths", flag_default=None, parse=_lengths,
        help="comma-separated prompt-row lengths a step may use (default: prefill-tokens and 1/16 of it)")
    max_prefill_rows: int | None = None  # most prompt rows per step (the seed's max_concurrent_prefill)
    decode_steps: int = setting(
        4, check=at_least(1), flag="--decode-steps", help="decode steps per device call while no prompt waits")
    decode_call_ms: float = setting(
        100.0, check=Check("> 0", lambda v: isinstance(v, (int, float)) and v > 0), flag="--decode-call-ms",
        help="a multi-step decode call runs at most about this long (ms, from the measured step time): "
             "its tokens reach the clients together and a new prompt waits for it (default %(default)s)")
    page_size: int = setting(128, check=at_least(1), flag="--page-size", help="tokens per KV page (paged engine)")
    num_pages: int | None = setting(  # None = sized from free memory
        None, flag="--num-pages", help="KV pages (paged engine; default: every slot at its full length, fewer where "
                                       "--hbm-utilization of the free memory holds less; the start-up line says which)")
    hbm_utilization: float = setting(
        0.6, check=Check("in (0, 1]", lambda v: isinstance(v, (int, float)) and 0 < v <= 1),
        flag="--hbm-utilization",
        help="fraction of the memory left after the weights that KV pages may take (paged engine)")
    enable_prefix_caching: bool = setting(
        True, flag="--no-prefix-caching", off=True, help="paged engine: never reuse cached prefixes")
    prefix_wait_steps: int = setting(
        64, check=at_least(0), flag="--prefix-wait-steps",
        help="steps a prompt may wait for a prefix another request is computing (0: never wait)")
    kv_host_cache_bytes: int = setting(  # kv/tiers.py
        0, check=at_least(0), flag="--kv-host-cache-gb", unit=GiB, flag_default=None,
        help="host-memory tier of the prefix cache: pages evicted from the KV pool (and those of preempted "
             "sequences) are kept there and copied back on a hit (default: 0 on CPU, where the pool is already "
             "host memory; a quarter of the free RAM, at most 64, on accelerators)")
    kv_cache_dir: str | None = setting(  # kv/disk_tier.py
        None, flag="--kv-cache-dir",
        help="disk tier of the prefix cache: prefix pages persist in this directory across restarts")
    kv_disk_cache_bytes: int = setting(
        4 * GiB, check=Check("positive", lambda v: _integer(v) and v > 0), flag="--kv-cache-dir-gb", unit=GiB,
        help="size cap of --kv-cache-dir (LRU)")
    kv_disk_prefetch_bytes: int = setting(  # engine/tier_mover.py
        GiB // 2, check=at_least(0), flag="--kv-prefetch-gb", unit=GiB,
        help="at start-up, read this much of --kv-cache-dir's most recent pages into the KV pool (0: none)")
    # KV pages' storage: None / "auto" = the model dtype; "int8" / "fp8" (float8_e4m3fn) = quantized
    # per token and KV head with a float16 scale each (kv/quant.py): about half a bfloat16 page
    kv_cache_dtype: str | None = setting(
        None, check=one_of((None, *KV_CACHE_DTYPES)), flag="--kv-cache-dtype", flag_default="auto",
        help="how the paged KV pool stores keys and values: auto (the model's activation dtype; on a CPU with "
             "vsurge's C++ kernels float16, as llama.cpp's default cache); float32; bfloat16 or float16 (a float32 "
             "model's cache in half the memory); int8 or fp8 (float8_e4m3fn), each token's vector per KV head with "
             "a float16 scale: about twice the pages of a bfloat16 pool in the same memory (the start-up line "
             "prints them)")
    # which step programs compile before the engine is ready (engine/deferred_programs.py)
    compile_at_start: str = setting(
        "auto", check=one_of(COMPILE_AT_START), flag="--compile-at-start",
        help="all: every step program before the server is ready; serving: the programs every step can fall "
             "back to (the most rows, two chunk shapes), the others on background threads after (a TPU's XLA "
             "takes 15-40 s a program); auto (default): serving on an accelerator, all on a CPU")
    # the attention backend: its KV page layout, K/V writes and attention kernels (kv/backends)
    attention_backend: str = setting(
        "auto", check=one_of(ATTENTION_BACKENDS), flag="--attention-backend",
        help="how the paged KV pool is laid out and attended: auto (tpu on a TPU, cpu on a CPU, xla elsewhere); "
             "cpu (vsurge's C++ kernels); xla (XLA ops only); tpu (the ragged-paged-attention layout and JAX's "
             "Pallas kernel); gpu (JAX's Triton decode kernel, which re-lays the pages every step)")
    speculative_tokens: int = setting(
        0, check=int_in(0, 16), flag="--speculative-tokens",
        help="prompt-lookup drafts per greedy request and step (0 = off; requests may set their own, except on "
             "hybrid models, whose engine keeps the draft states only when this is set)")
    # the model holds a recurrent state per sequence (for_model): requests speculate only when the engine
    # does (`draft_state_rows`: the states after each draft are kept, for rolling back to the accepted one)
    recurrent_state: bool = False
    state_dtype: str = setting(  # kv/recurrent.py state_dtype
        "auto", check=one_of(STATE_DTYPES), flag="--state-dtype",
        help="hybrid models: how the recurrent states (and their snapshots) are stored: auto (float32 for a "
             "float32 model, else bfloat16, as vLLM's --mamba-ssm-cache-dtype auto; half the bytes a decode step "
             "moves), float32 (llama.cpp's choice) or bfloat16; the ops compute in float32 either way")
    state_snapshots: int | None = setting(  # None = sized from free memory (engine/pools.py)
        None, check=Check(">= 0", lambda v: v is None or (_integer(v) and v >= 0)), flag="--state-snapshots",
        help="hybrid models (recurrent layers): rows of recurrent states kept at page boundaries of prompts, so the "
             "prefix cache can resume them (default: up to 4 per sequence slot, within a quarter of the KV "
             "memory; 0 turns the prefix cache off for such a model)")
    speculative_rows: int = 8  # speculate only while a step's decode rows stay within this
    seed: int = 894
    # Narrower program sets (vInference compiles one batch shape at a time): empty = derived.
    row_buckets: tuple[int, ...] = ()  # decode rows of decode programs
    # a one-row decode program (EngineCore sets it when the model multiplies in GGUF blocks: the block
    # kernel's cost grows with its rows, while a float one-row dot runs as two rows anyway)
    one_row_decode: bool = False
    # decode programs at 8, 32, 128 ... rows (EngineCore sets it on an accelerator: below ~100 rows a decode
    # step's cost is its weights' bytes, so padding rows are nearly free, and each program is a compile at
    # start-up: a TPU v5e took 110 s for 25 programs)
    coarse_rows: bool = False
    window_buckets: tuple[int, ...] = ()  # pages per row of decode programs
    prefill_first: bool = False  # no decode rows while a prompt is being prefilled
    # "fcfs": first come, first served; "priority": requests' `priority` orders the queue and may preempt
    scheduling_policy: str = setting(
        "fcfs", check=one_of(SCHEDULING_POLICIES), flag="--scheduling-policy",
        help="priority: requests' `priority` (lower first) orders the queue, and a waiting request preempts a "
             "running one of lower priority (default fcfs: first come, first served)")
    # What the engine's steps compute (disaggregated serving, engine/disaggregated.py): "both"
    # (prompt chunks and decode rows in one step: interleaved), "prefill" (prompt chunks only; a
    # finished prefix is handed to a decode engine) or "decode" (decode rows only).
    role: str = setting("both", check=one_of(ROLES))
    # Plan and dispatch step N+1 before reading step N's tokens (fed back on the device), so host work
    # overlaps the device's (driver.py); False: each step's tokens are read before the next is planned.
    async_scheduling: bool = setting(
        True, flag="--no-async-scheduling", off=True,
        help="read each step's tokens before planning the next (default: the next step is planned and "
             "dispatched while the device runs this one, fed its tokens on the device)")
    # A step the device has not finished after this many seconds means a stuck engine (a deadlocked
    # runtime, a lost device): the driver fails every live request and stops being ready (driver.py).
    step_timeout: float = setting(
        300.0, check=Check("at least 0 (0: never)", lambda v: isinstance(v, (int, float)) and v >= 0),
        flag="--step-timeout",
        help="seconds one engine step may take before the engine counts as stuck: its requests fail with "
             "an error and readiness turns false (0: wait forever; default %(default)s)")

    # LoRA adapters (lora/, ops/lora.py): device slots (0: the engine serves no adapters) and their rank
    max_loras: int = setting(
        0, check=at_least(0), flag="--max-loras",
        help="LoRA adapters on the device at once, any mix of them and the base model in one step (others wait in "
             "host memory); 0 without --lora/--enable-lora, else default 4")
    max_lora_rank: int = setting(
        16, check=int_in(1, 256), flag="--max-lora-rank",
        help="the highest adapter rank served (each slot holds this rank; default %(default)s)")
    image_cache_mb: int = setting(
        256, check=int_in(0, 1 << 20), flag="--image-cache-mb",
        help="host memory for the embeddings of images encoded recently (a vision-language model): an image "
             "seen again (same bytes) is not encoded again; 0 keeps none (default %(default)s)")

    def __post_init__(self):
        for f in SETTINGS:
            spec, value = f.metadata["setting"], getattr(self, f.name)
            if spec.check is not None and not spec.check.ok(value):
                raise ValueError(f"{f.name} must be {spec.check.what}, got {value!r}")
        if self.max_prompt_length is not None and not 1 <= self.max_prompt_length < self.max_length:
            raise ValueError(f"max_prompt_length must be in [1, max_length - 1 = {self.max_length - 1}], "
                             f"got {self.max_prompt_length}")
        if any(n < 1 or n > self.prefill_tokens for n in self.chunk_lengths):
            raise ValueError(f"chunk_lengths must be in [1, prefill_tokens={self.prefill_tokens}], "
                             f"got {self.chunk_lengths}")

    @classmethod
    def fitted(cls, context: int | None = None, **values) -> "EngineConfig":
        """EngineConfig(**values) for one model: max_length capped at its `context`, the longest prompt
        below it, prefill_tokens at least the longest chunk length, max_slots for this machine if unset."""
        length = int(values.pop("max_length", None) or DEFAULT_MAX_LENGTH)
        if context:
            length = min(length, int(context))
        if values.get("max_prompt_length"):
            values["max_prompt_length"] = min(int(values["max_prompt_length"]), length - 1)
        if values.get("chunk_lengths"):
            values["chunk_lengths"] = tuple(sorted({int(n) for n in values["chunk_lengths"]}))
            values["prefill_tokens"] = max(values.get("prefill_tokens", cls.prefill_tokens), *values["chunk_lengths"])
        if values.get("max_slots") is None:
            values["max_slots"] = default_slots()
        return cls(max_length=length, **values)

    def replace(self, **changes) -> "EngineConfig":
        return dataclasses.replace(self, **changes)

    def for_model(self, model_config) -> "EngineConfig":
        """The config a model runs with: a model with recurrent layers (a fixed-size state per
        sequence, kv/recurrent.py) runs with the prefix cache only if its states are snapshotted at
        page boundaries (`state_snapshots`, docs/state_cache.md)."""
        if not model_config.recurrent_layers or self.recurrent_state:
            return self
        prefix = self.enable_prefix_caching and self.state_snapshots != 0
        if prefix != self.enable_prefix_caching:
            log.info("%s has recurrent layers: the prefix cache is off (no state snapshots)", model_config.architecture)
        return self.replace(enable_prefix_caching=prefix, recurrent_state=True)

    @property
    def draft_state_rows(self) -> int:
        """Rows of draft states a hybrid model's speculating engine keeps (kv/recurrent.py): one per
        draft row a step may hold; 0 when it does not speculate (its requests then do not either)."""
        return self.speculative_rows if self.recurrent_state and self.speculative_tokens else 0

    @property
    def snapshots_states(self) -> bool:
        """A hybrid model's prefix cache: prompt rows end on page boundaries, where states are kept."""
        return self.recurrent_state and self.enable_prefix_caching

    # ------------------------------------------------------------ the command line (cli/)
    @staticmethod
    def add_flags(parser, names: Sequence[str] | None = None) -> None:
        """One flag per declared setting (`names`: only these fields; default all with a flag)."""
        for f in SETTINGS:
            spec = f.metadata["setting"]
            if spec.flag is None or (names is not None and f.name not in names):
                continue
            if spec.off:
                parser.add_argument(spec.flag, action="store_true", help=spec.help)
                continue
            default = f.default / spec.unit if spec.unit != 1 else f.default
            default = default if spec.flag_default is ... else spec.flag_default
            choices = list(spec.check.choices) if spec.check is not None and spec.check.choices else None
            kind = str if spec.parse else (float if spec.unit != 1 else _flag_type(f))
            parser.add_argument(spec.flag, type=kind, default=default, choices=choices, help=spec.help)

    @staticmethod
    def flag_values(args) -> dict:
        """The declared flags present in `args` -> field values (unset flags left out), each checked:
        a bad one raises ValueError naming the flag."""
        values = {}
        for f in SETTINGS:
            spec = f.metadata["setting"]
            dest = spec.flag and spec.flag.removeprefix("--").replace("-", "_")
            if dest is None or not hasattr(args, dest):
                continue
            given = getattr(args, dest)
            if spec.off:
                values[f.name] = not given
                continue
            if given is None:
                continue
            try:
                value = spec.parse(given) if spec.parse else given
            except ValueError:
                raise ValueError(f"{spec.flag}: cannot read {given!r}") from None
            value = int(value * spec.unit) if spec.unit != 1 else value
            if spec.check is not None and not spec.check.ok(value):
                raise ValueError(f"{spec.flag} must be {spec.check.what}, got {given}")
            values[f.name] = value
        return values

    # ------------------------------------------------------------ derived sizes and buckets
    # (the bucket lists are cached: the engine reads them every step; a frozen config never changes)
    @property
    def prompt_limit(self) -> int:
        return self.max_prompt_length or self.max_length - 1

    @property
    def pages_per_sequence(self) -> int:
        return math.ceil(self.max_length / self.page_size)

    @functools.cached_property
    def decode_rows(self) -> list[int]:
        """Row counts of decode programs: 2, 4, 8, ... and max_slots (one row runs as two: a one-row
        bfloat16 dot is slow on XLA:CPU, and the spare slot makes the padding free). With
        `one_row_decode` (weights in blocks) 1, 4, 16, ... and max_slots: the kernel skips padding
        rows, so a coarser ladder costs little, and each program held ~25-35 MiB (two fewer, with the
        kernel's row map: the ~1B Q8_0 file's peak RSS 1.24x -> 1.20x llama-server's, 8 concurrent
        no slower). With `coarse_rows` (an accelerator) 8, 32, 128, ... and max_slots."""
        least = 1 if self.one_row_decode else 2
        if self.row_buckets:
            return sorted(self.row_buckets)
        most = max(self.max_slots, self.speculative_rows if self.speculative_tokens else 0)
        if self.coarse_rows:
            return sorted({*_powers(8, most, 4), most})
        return sorted({*_powers(least, most, 4 if self.one_row_decode else 2), max(least, most)})

    @functools.cached_property
    def mixed_decode_rows(self) -> list[int]:
        """Decode rows of steps that also prefill: 0, max_slots, and every quarter of it down to 32
        (coarser than decode_rows: such a step's cost is mostly its prompt tokens)."""
        if self.prefill_first or self.role == "prefill":
            return [0]
        rows, n = {0, max(2, self.max_slots)}, self.max_slots // 4
        while n >= 32:
            rows.add(n)
            n //= 4
        return sorted(rows)

    def mixed_rows(self, shape: tuple[int, int]) -> list[int]:
        """Decode rows of the mixed programs of one chunk shape: 0 only for the two smallest shapes (a
        lone prompt's step); a larger shape's step with no decode rows pads them (~6% more tokens),
        which saves two programs to load at every start."""
        rows = self.mixed_decode_rows
        if len(rows) > 1 and shape not in sorted(self.chunk_shapes, key=lambda s: s[0] * s[1])[:2]:
            rows = [n for n in rows if n]
        return rows

    @functools.cached_property
    def chunk_shapes(self) -> list[tuple[int, int]]:
        """(rows, tokens per row) of the prompt part of a step, each about `prefill_tokens` tokens,
        plus one of a quarter of that in short rows: a step costs what its shape holds, so one short
        prompt arriving alone (a chat turn) is not padded to the whole budget (benchmarks/serve.py,
        one stream of 128-token prompts: TTFT p50 0.41 -> 0.14 s)."""
        # rows of 1/16 of the budget pack short prompts; one full-budget row takes long ones with
        # one gather of their pages per step
        # (a hybrid model with the prefix cache: long rows of a page, whose ends are where states are
        # snapshotted, so a shared prefix resumes at most a page before its end)
        longest = min(self.prefill_tokens, self.page_size) if self.snapshots_states else self.prefill_tokens
        lengths = self.chunk_lengths or tuple(n for n in (longest, self.prefill_tokens // 16) if n >= 16)
        rows_cap = self.max_prefill_rows or self.prefill_tokens
        shapes = {(max(1, min(self.prefill_tokens // n, rows_cap)), n) for n in lengths}
        if not self.chunk_lengths and self.prefill_tokens // 16 >= 16:
            shapes.add((max(1, min(4, rows_cap)), self.prefill_tokens // 16))
            # one short row: a lone chat turn of <= 32 tokens costs 32 tokens' work, not 128 (the
            # default model, 12-token prompt, one stream: TTFT 0.19 s against llama-server's 0.04 s)
            shapes.add((1, self.prefill_tokens // 16))
            # a burst of short prompts (chat turns of ~10-15 tokens) in one step: rows of 1/32 of the
            # budget, one per slot (in rows of 32 two steps held them at ~40% padding)
            short = self.prefill_tokens // 32
            if short >= 8 and self.prefill_tokens // short <= min(self.max_slots, rows_cap):
                shapes.add((self.prefill_tokens // short, short))
        return sorted(shapes, key=lambda s: (s[1], s[0]))

    @functools.cached_property
    def page_windows(self) -> list[int]:
        """Pages a decode row may read: all of max_length, in one program (`dynamic_window`: it loops
        over as many page columns as the step needs). Extra programs with short windows unrolled
        read every column of their window (docs/performance.md, Attention at decode) and tripled
        the programs to compile."""
        if self.window_buckets:
            return sorted(self.window_buckets)
        return [self.pages_per_sequence]

    @functools.cached_property
    def transfer_pages(self) -> list[int]:
        """Page counts of the programs that move a prefix between a prefill and a decode engine
        (1, 2, 4, ... and every page of max_length): a prefix is padded to the next one."""
        return sorted({*_powers(1, self.pages_per_sequence), self.pages_per_sequence})

    def dynamic_window(self, window: int) -> bool:
        """Decode programs of this window loop over page columns instead of unrolling them (more than
        4 columns: the loop costs nothing extra there, and unrolling makes programs slow to compile)."""
        return window == self.pages_per_sequence and window > 4


SETTINGS = [f for f in dataclasses.fields(EngineConfig) if "setting" in f.metadata]


def _flag_type(f) -> type:
    """The flag's type: the field's annotation (a string here: `from __future__ import annotations`)."""
    return next((kind for kind in (str, float, int) if kind.__name__ in str(f.type)), str)
