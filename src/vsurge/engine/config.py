"""EngineConfig: every setting of an engine in one frozen (hashable) dataclass.

The seed API spreads these over keyword arguments of vEngine/oEngine and
vSurge.create_vdriver/create_odriver (`max_concurrent_decodes`,
`max_prefill_length`, `prefill_lengths`, `max_concurrent_prefill`, ...);
`from_seed_kwargs` maps them here once. The compiled shapes (buckets) are
derived from the config, so two engines with equal configs run the same programs.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from dataclasses import dataclass

from ..kv import KV_CACHE_DTYPES

SCHEDULING_POLICIES = ("fcfs", "priority")
ROLES = ("both", "prefill", "decode")
EOS_WIDTH = 32  # most end-of-sequence ids (eos + stop_token_ids) one request may have


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


@dataclass(frozen=True)
class EngineConfig:
    max_slots: int = 32  # sequences generating at once (the seed's max_concurrent_decodes)
    max_length: int = 2048  # prompt + generated tokens of one sequence
    max_prompt_length: int | None = None  # longest prompt accepted; None = max_length - 1
    prefill_tokens: int = 512  # prompt tokens one step computes (vLLM's max_num_batched_tokens)
    chunk_lengths: tuple[int, ...] = ()  # prompt-row lengths a step may use; () = derived
    max_prefill_rows: int | None = None  # most prompt rows per step (the seed's max_concurrent_prefill)
    decode_steps: int = 4  # decode steps per device call while no prompt waits
    page_size: int = 128  # tokens per KV page
    num_pages: int | None = None  # paged engine's pool; None = sized from free memory
    hbm_utilization: float = 0.6  # fraction of the free memory the pool may take
    enable_prefix_caching: bool = True
    # steps a prompt may wait for a prefix that a running sequence is computing (0 = never wait)
    prefix_wait_steps: int = 64
    kv_host_cache_bytes: int = 0  # host-memory tier of the prefix cache (kv/tiers.py); 0 = none
    kv_cache_dir: str | None = None  # disk tier across restarts (kv/disk_tier.py); None = none
    kv_disk_cache_bytes: int = 4 << 30  # the disk tier's size cap
    # the disk tier's most recent pages read into free device pages at start-up (engine/tiers.py)
    kv_disk_prefetch_bytes: int = 512 << 20
    # KV pages' storage: None / "auto" = the model dtype; "int8" / "fp8" (float8_e4m3fn) = quantized
    # per token and KV head with a float16 scale each (kv/quant.py): about half a bfloat16 page
    kv_cache_dtype: str | None = None
    speculative_tokens: int = 0  # prompt-lookup drafts per greedy sequence and step (0 = off)
    speculative_rows: int = 8  # speculate only while a step's decode rows stay within this
    seed: int = 894
    # Narrower program sets (vInference compiles one batch shape at a time): empty = derived.
    row_buckets: tuple[int, ...] = ()  # decode rows of decode programs
    # a one-row decode program (EngineCore sets it when the model multiplies in GGUF blocks: the block
    # kernel's cost grows with its rows, while a float one-row dot runs as two rows anyway)
    one_row_decode: bool = False
    window_buckets: tuple[int, ...] = ()  # pages per row of decode programs
    prefill_first: bool = False  # no decode rows while a prompt is being prefilled
    # "fcfs": first come, first served; "priority": requests' `priority` orders the queue and may preempt
    scheduling_policy: str = "fcfs"
    # What the engine's steps compute (disaggregated serving, engine/disaggregated.py): "both"
    # (prompt chunks and decode rows in one step: interleaved), "prefill" (prompt chunks only; a
    # finished prefix is handed to a decode engine) or "decode" (decode rows only).
    role: str = "both"
    # Plan and dispatch step N+1 before reading step N's tokens (fed back on the device), so host work
    # overlaps the device's (driver.py); False: each step's tokens are read before the next is planned.
    async_scheduling: bool = True

    def __post_init__(self):
        for name in ("max_slots", "max_length", "prefill_tokens", "decode_steps", "page_size"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.max_length < 2:
            raise ValueError(f"max_length must be at least 2, got {self.max_length}")
        if self.max_prompt_length is not None and not 1 <= self.max_prompt_length < self.max_length:
            raise ValueError(f"max_prompt_length must be in [1, max_length - 1 = {self.max_length - 1}], "
                             f"got {self.max_prompt_length}")
        if not 0 < self.hbm_utilization <= 1:
            raise ValueError(f"hbm_utilization must be in (0, 1], got {self.hbm_utilization}")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling_policy must be one of {', '.join(SCHEDULING_POLICIES)}, "
                             f"got {self.scheduling_policy!r}")
        for name in ("prefix_wait_steps", "kv_host_cache_bytes", "kv_disk_prefetch_bytes"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {getattr(self, name)!r}")
        if self.kv_disk_cache_bytes <= 0:
            raise ValueError(f"kv_disk_cache_bytes must be positive, got {self.kv_disk_cache_bytes!r}")
        if self.kv_cache_dtype not in (None, *KV_CACHE_DTYPES):
            raise ValueError(f"kv_cache_dtype (--kv-cache-dtype) must be one of {', '.join(KV_CACHE_DTYPES)}, "
                             f"got {self.kv_cache_dtype!r}")
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {self.role!r}")
        if any(n < 1 or n > self.prefill_tokens for n in self.chunk_lengths):
            raise ValueError(f"chunk_lengths must be in [1, prefill_tokens={self.prefill_tokens}], "
                             f"got {self.chunk_lengths}")

    @classmethod
    def from_seed_kwargs(cls, *, max_concurrent_decodes=None, max_concurrent_prefill=None, prefill_lengths=None,
                         max_prefill_length=None, max_length=None, seed=894, context: int | None = None,
                         **rest) -> "EngineConfig":
        """The seed's engine keyword arguments -> EngineConfig. `context` caps max_length (the model's)."""
        length = int(max_length or 2048)
        if context:
            length = min(length, int(context))
        if isinstance(prefill_lengths, int):
            prefill_lengths = [prefill_lengths]
        values = dict(max_slots=int(max_concurrent_decodes or default_slots()), max_length=length, seed=seed)
        if max_prefill_length:
            values["max_prompt_length"] = min(int(max_prefill_length), length - 1)
        if max_concurrent_prefill:
            values["max_prefill_rows"] = int(max_concurrent_prefill)
        values.update({k: v for k, v in rest.items() if v is not None})
        if prefill_lengths:
            values["prefill_tokens"] = max(values.get("prefill_tokens", 512), max(int(n) for n in prefill_lengths))
            values["chunk_lengths"] = tuple(sorted({int(n) for n in prefill_lengths}))
        return cls(**values)

    def replace(self, **changes) -> "EngineConfig":
        return dataclasses.replace(self, **changes)

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
        bfloat16 dot is slow on XLA:CPU, and the spare slot makes the padding free), from 1 with
        `one_row_decode` (weights in blocks: a padding row would cost the kernel a row's work)."""
        if self.row_buckets:
            return sorted(self.row_buckets)
        least = 1 if self.one_row_decode else 2
        most = max(self.max_slots, self.speculative_rows if self.speculative_tokens else 0)
        return sorted({*_powers(least, most), max(least, most)})

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
        """Decode rows of the mixed programs of one chunk shape: 0 only for the smallest shape (a
        lone prompt's step); a larger shape's step with no decode rows pads them (~6% more tokens),
        which saves two programs to load at every start."""
        rows = self.mixed_decode_rows
        if len(rows) > 1 and shape != min(self.chunk_shapes, key=lambda s: s[0] * s[1]):
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
        lengths = self.chunk_lengths or tuple(n for n in (self.prefill_tokens, self.prefill_tokens // 16) if n >= 16)
        rows_cap = self.max_prefill_rows or self.prefill_tokens
        shapes = {(max(1, min(self.prefill_tokens // n, rows_cap)), n) for n in lengths}
        if not self.chunk_lengths and self.prefill_tokens // 16 >= 16:
            shapes.add((max(1, min(4, rows_cap)), self.prefill_tokens // 16))
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
