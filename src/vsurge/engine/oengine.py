"""oEngine: the device side of paged continuous batching.

State on the device: a PagedAttentionCache (pages shared by all sequences)
and per-slot sampling state (token counts, prompt mask, logit bias, sampling
knobs) for `max_concurrent_decodes` admitted sequences plus one spare row
that padding rows write to. `forward` runs one NextIterationPlan as a packed
row of tokens: D decode tokens then one prefill chunk of C tokens, padded to
compiled buckets (decode rows, chunk length, pages gathered per row), and
samples one token per decode row and for the chunk when it ends its sequence.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ..decoding import maybe_logprobs
from ..kv.paged import PagedAttentionCache, page_bytes
from ..ops.sampling import SamplingArrays, sample
from ..paged.memory import available_kv_bytes
from ..paged.page_manager import HBMPageManager
from ..paged.scheduler import NextIterationPlan
from .engine_base import EngineBase

log = logging.getLogger(__name__)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class ActiveSequenceBatch:
    """Device state of the paged engine (S = max_concurrent_decodes, +1 spare row for padding)."""

    cache: PagedAttentionCache
    counts: jax.Array  # (S+1, V) i32 generated-token counts
    prompt_mask: jax.Array  # (S+1, V) bool
    bias: jax.Array  # (S+1, V) f32
    sampling: SamplingArrays  # rows of S+1
    want_logprobs: jax.Array  # (S+1,) bool


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class ModelOutputBatch:
    tokens: jax.Array  # (R,) one sampled token per row: decode rows, then the chunk
    logprob: jax.Array  # (R,)
    top_ids: jax.Array  # (R, K)
    top_logprobs: jax.Array  # (R, K)
    prefill_row: int = dataclasses.field(default=0, metadata=dict(static=True))  # the chunk's row (the D bucket)


def _forward(graphdef, graphstate, graphother, state: ActiveSequenceBatch, tokens, positions, slot_mapping, tables,
             row_slots, steps, logits_index, real, *, num_decode: int):
    """tokens/positions/slot_mapping (N,); tables (R, W); row_slots/steps/logits_index/real (R,)."""
    model = nnx.merge(graphdef, graphstate, graphother)
    cache = state.cache.for_step(slot_mapping, tables, num_decode)
    hidden = model.embed[...][tokens[None]].astype(model.dtype)  # (1, N, D)
    hidden, cache = model.decode_layers(hidden, positions[None], cache)
    logits = model.logits(hidden[0, logits_index])  # (R, V)
    rows = lambda a: a[row_slots]  # noqa: E731
    new = sample(logits, rows(state.counts), rows(state.prompt_mask), jax.tree.map(rows, state.sampling), steps,
                 rows(state.bias))
    logprobs = maybe_logprobs(logits, new, rows(state.want_logprobs) & real)
    counts = state.counts.at[row_slots, new].add(real.astype(jnp.int32))
    state = dataclasses.replace(state, cache=cache.storage_only(), counts=counts)
    return state, ModelOutputBatch(new, *logprobs)


def _set_slot(state: ActiveSequenceBatch, slot, counts, prompt_mask, bias, sampling: SamplingArrays, want_logprobs):
    """Load one admitted sequence's sampling state into its slot (rows of 1 in)."""
    def put(full, row):
        return full.at[slot].set(row[0])

    return dataclasses.replace(
        state, counts=put(state.counts, counts), prompt_mask=put(state.prompt_mask, prompt_mask),
        bias=put(state.bias, bias), sampling=jax.tree.map(put, state.sampling, sampling),
        want_logprobs=put(state.want_logprobs, want_logprobs))


class oEngine(EngineBase):  # noqa: N801 (the seed's name)
    def __init__(self, model, processor, storage: PagedAttentionCache | None = None,
                 manager: HBMPageManager | None = None, max_concurrent_decodes: int | None = None,
                 max_concurrent_prefill: int | None = None, prefill_lengths: list[int] | int | None = None,
                 max_prefill_length: int | None = None, max_length: int | None = None,
                 batch_size: int | None = None, seed: int = 894, page_size: int = 128,
                 hbm_utilization: float = 0.6, num_pages: int | None = None, enable_prefix_caching: bool = True):
        self.model = model
        self._processor = processor
        context = model.config.max_position_embeddings
        self._max_length = int(min(max_length or 2048, context))
        self._max_concurrent_decodes = int(max_concurrent_decodes or 8)
        # prompts longer than a chunk are prefilled over several steps
        self._chunk_size = int(min(max_prefill_length or 512, self._max_length))
        if isinstance(prefill_lengths, int):
            prefill_lengths = [prefill_lengths]
        self.chunk_lengths = sorted({int(n) for n in (prefill_lengths or _powers(32, self._chunk_size, 4))
                                     if n <= self._chunk_size} | {self._chunk_size})
        self._max_concurrent_prefill = 1  # one chunk per step; the token budget bounds the step
        self._batch_size = batch_size
        self.manager = manager or self._make_manager(page_size, hbm_utilization, num_pages, enable_prefix_caching)
        self.page_size = self.manager.page_size
        if self.manager.max_tokens < self._max_length:
            raise ValueError(f"too little KV memory: {self.manager.num_pages} pages of {self.page_size} tokens hold "
                             f"{self.manager.max_tokens} tokens, less than max_length={self._max_length}; lower "
                             f"max_length or raise hbm_utilization / num_pages")
        self._storage = storage
        self.decode_widths = sorted({0, *_powers(1, self._max_concurrent_decodes, 4), self._max_concurrent_decodes})
        # pages gathered per row: enough for 256, 1024, 4096, ... tokens, and for max_length
        max_pages = math.ceil(self._max_length / self.page_size)
        self.page_windows = sorted({min(max_pages, math.ceil(t / self.page_size))
                                    for t in _powers(256, self._max_length, 4)} | {max_pages})
        self._rng = np.random.default_rng(seed)
        self.graphdef, self.graphstate, self.graphother = nnx.split(model, nnx.Param, ...)
        self._compiled: dict[Any, Any] = {}
        self._compile_lock = threading.Lock()
        self.compile_seconds = 0.0

    def _make_manager(self, page_size, hbm_utilization, num_pages, enable_prefix_caching) -> HBMPageManager:
        per_page = page_bytes(self.model.config, page_size, self.model.dtype)
        if num_pages is None:
            budget = available_kv_bytes(self.model.weight_bytes, hbm_utilization)
            # more pages than every slot at full length only serve the prefix cache: cap at twice that
            cap = 2 * self._max_concurrent_decodes * math.ceil(self._max_length / page_size)
            num_pages = min(budget // per_page, cap)
        log.info("paged KV cache: %d pages of %d tokens (%.1f MiB each), %d tokens in all", num_pages, page_size,
                 per_page / 2**20, num_pages * page_size)
        return HBMPageManager(int(num_pages), page_size, enable_prefix_caching)

    # ------------------------------------------------------------ seed properties
    @property
    def max_prefill_length(self) -> int:
        """Tokens of one prefill chunk."""
        return self._chunk_size

    @property
    def max_prompt_length(self) -> int:
        """Longest prompt a request may have (chunked prefill: anything that leaves room for a token)."""
        return self._max_length - 1

    @property
    def prefill_lengths(self) -> list[int]:
        return list(self.chunk_lengths)

    # ------------------------------------------------------------ compilation
    def buckets(self) -> list[tuple[int, int, int]]:
        """(decode rows, chunk length, pages per row) of every step program."""
        return [(d, c, w) for w in self.page_windows for d in self.decode_widths for c in [0, *self.chunk_lengths]
                if d or c]

    def compile(self, progress: bool = True) -> None:
        """Compile every program the engine will run; nothing compiles while serving."""
        from tqdm.auto import tqdm

        jobs = [("init", 0), ("set_slot", 0)] + [("forward", b) for b in self.buckets()]
        for job in tqdm(jobs, desc="Compiling oEngine", unit="program", disable=not progress):
            self._program(*job)

    def _build(self, kind: str, size):
        s = jax.ShapeDtypeStruct
        state = jax.eval_shape(self._empty_state)
        if kind == "init":
            exe = jax.jit(self._empty_state).lower().compile()
        elif kind == "set_slot":
            vocab = self.model.config.vocab_size
            exe = jax.jit(_set_slot, donate_argnums=(0,)).lower(
                state, s((), jnp.int32), s((1, vocab), jnp.int32), s((1, vocab), bool), s((1, vocab), jnp.float32),
                self._abstract(SamplingArrays.neutral(1)), s((1,), bool)).compile()
        else:
            d, c, w = size
            n, r = d + c, d + (1 if c else 0)
            fn = jax.jit(partial(_forward, self.graphdef, num_decode=d), donate_argnums=(2,))
            i32 = jnp.int32
            exe = fn.lower(self._abstract(self.graphstate), self._abstract(self.graphother), state,
                           s((n,), i32), s((n,), i32), s((n,), i32), s((r, w), i32), s((r,), i32),
                           s((r,), i32), s((r,), i32), s((r,), bool)).compile()
        return exe

    # ------------------------------------------------------------ device programs
    def _empty_state(self) -> ActiveSequenceBatch:
        rows, vocab = self._max_concurrent_decodes + 1, self.model.config.vocab_size
        cache = self._storage or PagedAttentionCache.init(self.model.config, self.manager.num_pages, self.page_size,
                                                          self.model.dtype)
        return ActiveSequenceBatch(
            cache=cache, counts=jnp.zeros((rows, vocab), jnp.int32), prompt_mask=jnp.zeros((rows, vocab), bool),
            bias=jnp.zeros((rows, vocab), jnp.float32), sampling=jax.tree.map(jnp.asarray, SamplingArrays.neutral(rows)),
            want_logprobs=jnp.zeros((rows,), bool))

    def init_decode_state(self) -> ActiveSequenceBatch:
        state = self._program("init", 0)()
        self._storage = None  # the state owns the pages now
        return state

    def set_slot(self, state: ActiveSequenceBatch, seq) -> ActiveSequenceBatch:
        """Load an admitted sequence's sampling state (counts include what it generated before a preemption)."""
        request = seq.request
        vocab = self.model.config.vocab_size
        counts = np.bincount(np.asarray(seq.generated, np.int64), minlength=vocab)[None, :vocab].astype(np.int32)
        prompt_mask = np.zeros((1, vocab), bool)
        prompt_mask[0, request.prompt_ids] = True
        bias = np.zeros((1, vocab), np.float32)
        for token, value in (request.params.logit_bias or {}).items():
            bias[0, token] = value
        sampling = SamplingArrays.from_params([request.params], [request.seed])
        want = np.asarray([request.params.logprobs is not None])
        return self._program("set_slot", 0)(state, np.int32(seq.slot), counts, prompt_mask, bias, sampling, want)

    def page_tables(self, plan: NextIterationPlan) -> dict:
        """Each planned sequence's page table, read once per step."""
        seqs = plan.decode + ([plan.prefill] if plan.prefill is not None else [])
        return {seq: self.manager.page_table(seq.seq_id) for seq in seqs}

    def bucket_for(self, plan: NextIterationPlan, tables: dict) -> tuple[int, int, int]:
        d = next(w for w in self.decode_widths if w >= len(plan.decode))
        c = next(n for n in self.chunk_lengths if n >= plan.chunk_length) if plan.prefill is not None else 0
        pages = max(len(table) for table in tables.values())
        w = next(p for p in self.page_windows if p >= pages)
        return d, c, w

    def step_inputs(self, plan: NextIterationPlan, bucket, page_tables: dict) -> tuple:
        """Host arrays of one step, padded to `bucket`."""
        d, c, w = bucket
        n, r = d + c, d + (1 if c else 0)
        ps, spare = self.page_size, self._max_concurrent_decodes
        skip = self.manager.num_pages * ps  # out of range: the write is dropped
        tokens, positions = np.zeros(n, np.int32), np.zeros(n, np.int32)
        slot_mapping = np.full(n, skip, np.int32)
        tables = np.zeros((r, w), np.int32)
        row_slots, steps = np.full(r, spare, np.int32), np.zeros(r, np.int32)
        logits_index, real = np.zeros(r, np.int32), np.zeros(r, bool)

        def place(row, seq, start, length, at):
            table = page_tables[seq]
            tables[row, : len(table)] = table
            pos = np.arange(start, start + length)
            tokens[at:at + length] = seq.tokens[start:start + length]
            positions[at:at + length] = pos
            slot_mapping[at:at + length] = np.asarray(table)[pos // ps] * ps + pos % ps
            row_slots[row], steps[row] = seq.slot, len(seq.tokens) - seq.num_prompt  # tokens generated
            logits_index[row] = at + length - 1

        for i, seq in enumerate(plan.decode):
            place(i, seq, len(seq.tokens) - 1, 1, i)
            real[i] = True
        if plan.prefill is not None:
            place(d, plan.prefill, plan.chunk_start, plan.chunk_length, d)
            real[d] = plan.prefill_samples
        return tokens, positions, slot_mapping, tables, row_slots, steps, logits_index, real

    def forward(self, graphstate, graphothers, state: ActiveSequenceBatch, iteration_plan: NextIterationPlan):
        """Run one plan -> (state, ModelOutputBatch): row i is plan.decode[i]; the row after the decode
        bucket is the prefill chunk's (meaningful when plan.prefill_samples)."""
        tables = self.page_tables(iteration_plan)
        bucket = self.bucket_for(iteration_plan, tables)
        inputs = self.step_inputs(iteration_plan, bucket, tables)
        gs = self.graphstate if graphstate is None else graphstate
        go = self.graphother if graphothers is None else graphothers
        state, out = self._program("forward", bucket)(gs, go, state, *inputs)
        return state, dataclasses.replace(out, prefill_row=bucket[0])


def _powers(start: int, stop: int, factor: int) -> list[int]:
    out, n = [], start
    while n < stop:
        out.append(n)
        n *= factor
    return out
