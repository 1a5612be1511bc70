"""vEngine and oEngine, the seed's engines (EasyDeL's API): EngineCore behind the seed's
constructors (seed/engine_kwargs.py maps their keywords) and the seed's methods.

Called by: code written against the seed API (`prefill` -> `insert` -> `decode`
loops, `forward` with a plan, the sharding and property getters). vsurge's own
drivers never call these: they call `EngineCore.step(state, plan)`. Each shim
runs on the same compiled step programs; `prefill` computes a prompt's K/V
apart (a Prefix) and `insert` writes them into a slot's pages.
"""

from __future__ import annotations

import abc
import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ..kv.dense import DenseKVCache
from ..kv.access import KEY_AXIS, VALUE_AXIS, write_tokens
from ..hardware.sharding import replicated, state_shardings
from ..ops.sampling import SamplingArrays, draw_tokens
from ..sampling.params import SamplingParams
from ..engine.core import EngineCore
from ..engine.pools import make_page_pool, make_slot_pages
from ..engine.programs import EngineState, StepOutput
from ..engine.request import ActiveRequest, ReturnChannel
from ..engine.scheduler import StepPlan
from ..engine.sequence import Sequence
from ..kv.page_manager import HBMPageManager
from ..kv.paged import PagedAttentionCache
from .base_classes import AbstractInferenceEngine
from .engine_kwargs import engine_config


class GenerationState(abc.ABC):
    """The seed's state type: what `prefill` returns (a Prefix) and what `init_decode_state`,
    `insert` and `decode` hand on (the engine's EngineState: KV pages and per-slot sampling state)."""


GenerationState.register(EngineState)
ActiveSequenceBatch = EngineState  # the seed's name of oEngine's state


@dataclasses.dataclass
class PrefixRow:
    """One prefilled prompt before it gets a slot."""

    k: list  # per layer (1, KVH, hd, T)
    v: list  # per layer (1, KVH, T, hd)
    first: jax.Array  # (1,) the first generated token
    sequence: Sequence  # its tokens (the first token appended), sampling parameters and seed


@GenerationState.register
@dataclasses.dataclass
class Prefix:
    """The GenerationState `prefill` returns: its batch's prefilled prompts, one PrefixRow per row,
    until `insert` / `bulk_insert` give them slots."""

    rows: list[PrefixRow]

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def tokens(self) -> np.ndarray:
        """(B, 1) each row's first generated token."""
        return np.asarray([[int(r.first[0])] for r in self.rows], np.int32)

    @property
    def sequence(self) -> Sequence:
        """The one row's sequence (its tokens, sampling parameters and seed)."""
        return self.only().sequence

    def only(self) -> PrefixRow:
        if len(self.rows) != 1:
            raise ValueError(f"this prefix holds {len(self.rows)} rows: give bulk_insert a slot for each")
        return self.rows[0]


@dataclasses.dataclass
class ResultTokens:
    """A step's tokens: per slot for `decode`, per prompt row for `prefill` (the seed's result).
    np.asarray(result) is `tokens`."""

    tokens: np.ndarray  # (S,) i32 the token each slot (row) produced
    valid: np.ndarray  # (S,) bool: the slot was decoding (its token is real)

    def __array__(self, dtype=None, copy=None):
        return self.tokens if dtype is None else self.tokens.astype(dtype)


@dataclasses.dataclass
class ModelOutputBatch:
    """What `forward(state, plan)` returns: the new state and each plan row's sampled token."""

    state: object  # the engine state after the step (the input state was donated)
    output: StepOutput  # tokens (K, R): decode rows, then prompt rows from output.chunk_offset

    @property
    def tokens(self):
        return self.output.tokens

    @property
    def prefill_row(self) -> int:
        return self.output.chunk_offset


def _prefix_forward(graphdef, graphstate, graphother, tokens, length, sampling):
    """tokens (1, T) right-padded, length (1,) -> (k, v per layer, first token (1,))."""
    model = nnx.merge(graphdef, graphstate, graphother)
    t = tokens.shape[1]
    cache = DenseKVCache.init(model.config.kv_layout, 1, t, model.dtype).with_mode(True)
    logits, cache = model(tokens, None, cache, logits_index=length - 1)
    return cache.k, cache.v, draw_tokens(logits, sampling, jnp.zeros((1,), jnp.int32))


def _write_prefix(state, k, v, slot_mapping):
    """Scatter a prefix's K/V (per layer (1, KVH, hd, T) / (1, KVH, T, hd), the model dtype) into its
    pages (quantized there when the pool is int8 / fp8, kv/quant.py)."""
    kv = state.kv
    page, offset = slot_mapping // kv.page_size, slot_mapping % kv.page_size
    new_k = [write_tokens(pages, page, offset, kl[0].transpose(2, 0, 1), KEY_AXIS) for pages, kl in zip(kv.k, k)]
    new_v = [write_tokens(pages, page, offset, vl[0].transpose(1, 0, 2), VALUE_AXIS) for pages, vl in zip(kv.v, v)]
    return dataclasses.replace(state, kv=dataclasses.replace(kv, k=new_k, v=new_v))


def _row(value, b: int, kind):
    """Row b of a per-row array, or a shared scalar."""
    a = np.asarray(value).reshape(-1)
    return kind(a[b] if a.size > 1 else a[0])


def _seed_of(key, index: int) -> int:
    """A request seed from a PRNG key folded with `index` (a typed key or raw uint32 key data)."""
    key = jnp.asarray(key)
    if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.wrap_key_data(key.astype(jnp.uint32).reshape(-1)[-2:])
    data = np.asarray(jax.random.key_data(jax.random.fold_in(key, index))).reshape(-1)
    return (int(data[-2]) << 32 | int(data[-1])) & (2**63 - 1)


class SeedEngineAPI:
    """Seed methods on top of EngineCore (self.config, self.pool, self.step, self.batches ...)."""

    _batch_size: int | None = None

    # ------------------------------------------------------------ properties
    @property
    def max_prefill_length(self) -> int:
        """Longest prompt accepted (prompts are prefilled in chunks of `prefill_lengths`)."""
        return self.config.prompt_limit

    @property
    def prefill_lengths(self) -> list[int]:
        return sorted({length for _, length in self.config.chunk_shapes})

    @property
    def max_concurrent_prefill(self) -> int:
        """Most prompt rows one step computes."""
        return max(rows for rows, _ in self.config.chunk_shapes)

    @property
    def batch_size(self) -> int | None:
        return self._batch_size

    @property
    def samples_per_slot(self) -> int:
        return 1

    @property
    def colocated_cpus(self):
        return None

    @property
    def prng_key(self):
        """A fresh key split from the engine's key (sampling itself uses per-request seeds)."""
        key = getattr(self, "_key", None)
        if key is None:
            key = jax.random.PRNGKey(self.config.seed)
        self._key, out = jax.random.split(key)
        return out

    def get_state_shardings(self, is_decode: bool = False) -> tuple:
        """A tuple of shardings, one per array of a state, in `jax.tree.leaves` order.

        is_decode=True: the decode state (`init_decode_state`, `insert`, `decode`): on the model's
        mesh the KV pages are split over their KV heads and the per-slot sampling state is
        replicated. is_decode=False: a prefill's state (a Prefix row's arrays: per layer keys, per
        layer values, then its first token): keys and values as `get_prefix_destination_sharding`,
        the token replicated. Off a mesh every array is on the engine's one device."""
        if is_decode:
            state = jax.eval_shape(self._empty_state)
            if self.mesh is not None:
                return tuple(jax.tree.leaves(state_shardings(state, self.mesh)))
            device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
            return tuple(device for _ in jax.tree.leaves(state))
        kv = self.get_prefix_destination_sharding()
        token = replicated(self.mesh) if self.mesh is not None else kv
        layers = len(self.model.config.kv_layout)
        return (kv,) * (2 * layers) + (token,)

    def get_prefix_destination_sharding(self):
        """Where prefixes are placed before `insert`: their per-layer keys (1, KVH, hd, T) and values
        (1, KVH, T, hd) split over KV heads on the model's mesh (as the pages they go to); else the
        engine's device (EngineCore.prefix_destination, under the seed's name)."""
        return self.prefix_destination()

    def init_decode_state(self, *args, **kwargs):
        """Empty state (arguments are accepted for the seed's signature and unused)."""
        return self.init_state()

    # ------------------------------------------------------------ prefill -> insert -> decode
    def _seed_slots(self) -> dict[int, Sequence]:
        if not hasattr(self, "_slots_in_use"):
            self._slots_in_use = {}
        return self._slots_in_use

    def _prefill_rows(self, graphstate, graphothers, tokens, valids, true_length, temperature, top_p, top_k, rngs,
                      max_new_tokens: int | None):
        """A batch of prompts (B, T) -> (its Prefix, a GenerationState; ResultTokens of the B first tokens).

        Row b's prompt is its `valids[b]` tokens (any padding, left or right), else its first
        `true_length[b]`. valids may be (B, T) or (B, max_length) (the seed's mask over the whole
        context: its first T columns cover the prompt; the rest is ignored). temperature / top_p /
        top_k are per row (arrays) or shared (scalars).
        `rngs` (a PRNG key) gives row b the sampling seed of fold_in(rngs, b), so a key fixes the
        samples; without one, seeds come from the engine's generator. A sequence may generate
        until the context is full unless `max_new_tokens` caps it (the seed has no cap)."""
        tokens = np.asarray(tokens)
        tokens = tokens[None] if tokens.ndim == 1 else tokens
        if tokens.ndim != 2:
            raise ValueError(f"tokens must be (batch, length), got shape {tokens.shape}")
        rows = tokens.shape[0]
        lengths = np.broadcast_to(np.asarray(true_length, np.int64).reshape(-1), (rows,))
        mask = None
        if valids is not None:
            mask = np.asarray(valids).astype(bool)
            mask = mask[None] if mask.ndim == 1 else mask
            if mask.ndim != 2 or mask.shape[1] < tokens.shape[1]:
                raise ValueError(f"valids must be (batch, {tokens.shape[1]}) or (batch, max_length), "
                                 f"got shape {np.asarray(valids).shape}")
            mask = np.broadcast_to(mask[:, : tokens.shape[1]], tokens.shape)
        prefixes, firsts = [], []
        for b in range(rows):
            ids = tokens[b][mask[b]] if mask is not None else tokens[b][: int(lengths[b])]
            if mask is not None and true_length is not None and len(ids) != int(lengths[b]):
                raise ValueError(f"row {b}: valids marks {len(ids)} tokens but true_length is {int(lengths[b])}")
            prefix = self._prefill_one([int(t) for t in ids], _row(temperature, b, float), _row(top_p, b, float),
                                       _row(top_k, b, int), graphstate, graphothers,
                                       self.new_seed() if rngs is None else _seed_of(rngs, b), max_new_tokens)
            prefixes.append(prefix)
            firsts.append(int(prefix.first[0]))
        return Prefix(prefixes), ResultTokens(np.asarray(firsts, np.int32), np.ones(rows, bool))

    def _prefill_one(self, ids: list[int], temperature: float, top_p: float, top_k: int, graphstate, graphothers,
                     seed: int, max_new_tokens: int | None) -> PrefixRow:
        if not ids:
            raise ValueError("the prompt is empty")
        if self.model.config.recurrent_layers:
            raise NotImplementedError(f"{self.model.config.architecture} has recurrent layers: the seed's prefill/insert "
                                      "hands over KV pages only, not their states (docs/state_cache.md); serve it "
                                      "with vSurge's drivers")
        if len(ids) >= self.config.max_length:
            raise ValueError(f"the prompt has {len(ids)} tokens; this engine holds {self.config.max_length} in all")
        room = self.config.max_length - len(ids)
        budget = room if max_new_tokens is None else min(int(max_new_tokens), room)
        params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=budget)
        request = ActiveRequest(ids, params, seed, budget, self.eos_token_ids, ReturnChannel())
        length = max(16, 1 << (len(ids) - 1).bit_length())
        padded = np.zeros((1, length), np.int32)
        padded[0, : len(ids)] = ids
        fn = self._seed_program(("prefix", length), self._prefix_program)
        gs = self.graphstate if graphstate is None else graphstate
        go = self.graphother if graphothers is None else graphothers
        k, v, first = fn(gs, go, padded, np.asarray([len(ids)], np.int32),
                         SamplingArrays.from_params([params], [request.seed]))
        sequence = Sequence.of(request, self.processor)
        sequence.num_computed = len(ids)
        sequence.tokens.append(int(first[0]))
        return PrefixRow(k, v, first, sequence)

    def _prefix_program(self):
        if self.mesh is None:
            return jax.jit(partial(_prefix_forward, self.graphdef))
        prefix = self.get_prefix_destination_sharding()
        return jax.jit(partial(_prefix_forward, self.graphdef), out_shardings=(prefix, prefix, replicated(self.mesh)))

    def insert(self, prefix: Prefix, decode_state, slot: int):
        """Put a one-row prefix into `slot`: its K/V into the slot's pages, its sampling state into the slot."""
        prefix = prefix.only() if isinstance(prefix, Prefix) else prefix
        if not 0 <= slot < self.config.max_slots:
            raise ValueError(f"slot {slot} is out of range [0, {self.config.max_slots})")
        self.free_resource(slot)
        seq = dataclasses.replace(prefix.sequence, tokens=list(prefix.sequence.tokens))
        seq.pages = type(seq.pages)()
        self.pool.add_sequence(seq.pages, seq.tokens, slot)
        if not self.pool.reserve(seq.pages, len(seq.tokens)):
            raise RuntimeError("no free KV pages for this prefix")
        seq.mark_admitted(slot)
        positions = np.arange(prefix.v[0].shape[2])
        pages = np.asarray(seq.pages.pages)
        mapping = np.where(positions < seq.num_computed,
                           pages[np.minimum(positions // self.pool.page_size, len(pages) - 1)] * self.pool.page_size
                           + positions % self.pool.page_size, self.pool.num_pages * self.pool.page_size)
        write = self._seed_program(("write_prefix", len(positions)),
                                   lambda: jax.jit(_write_prefix, donate_argnums=(0,)))
        state = write(decode_state, prefix.k, prefix.v, mapping.astype(np.int32))
        self._seed_slots()[slot] = seq
        return self.setup_slots(state, self.slot_setups(StepPlan(decode=[seq])))

    def bulk_insert(self, prefix, decode_state, slots: list[int]):
        """Insert a prefix's rows into several slots: row i into slots[i] (a one-row prefix is copied into
        every slot); a list of one-row prefixes, one per slot, is taken too."""
        if isinstance(prefix, (list, tuple)):
            prefixes = [p.only() if isinstance(p, Prefix) else p for p in prefix]
        else:
            prefixes = prefix.rows if len(prefix) > 1 else prefix.rows * len(slots)
        if len(prefixes) != len(slots):
            raise ValueError(f"got {len(prefixes)} prefixes for {len(slots)} slots")
        for p, slot in zip(prefixes, slots):
            decode_state = self.insert(p, decode_state, slot)
        return decode_state

    def decode(self, graphstate, graphothers, state, rngs=None):
        """One token for every inserted, unfinished slot -> (state, ResultTokens per slot). A slot
        decodes until an end token or the context is full (or its prefill's max_new_tokens). `rngs`:
        a PRNG key; slot s samples this step with the seed of fold_in(rngs, s), so the same key gives
        the same tokens (without one, each slot goes on with its prefill's seed)."""
        live = {slot: s for slot, s in self._seed_slots().items()
                if not s.output.finished and s.tokens_left > 0 and s.tokens[-1] not in s.request.eos_token_ids}
        if rngs is not None:
            for slot, seq in live.items():
                seq.request.seed, seq.needs_setup = _seed_of(rngs, slot), True  # loaded by the step
        tokens = np.zeros(self.config.max_slots, np.int32)
        valid = np.zeros(self.config.max_slots, bool)
        if not live:
            return state, ResultTokens(tokens, valid)
        for seq in live.values():
            if not self.pool.reserve(seq.pages, len(seq.tokens)):
                raise RuntimeError("no free KV pages to decode")
        plan = StepPlan(decode=list(live.values()))
        state, out = self.step(state, plan, graphstate=graphstate, graphother=graphothers)
        host = out.to_host(False)
        for row, (slot, seq) in enumerate(live.items()):
            seq.num_computed += 1
            seq.tokens.append(int(host.tokens[0][row]))
            tokens[slot], valid[slot] = seq.tokens[-1], True
        return state, ResultTokens(tokens, valid)

    def free_resource(self, slot: int) -> bool:
        """Free a slot's pages; False if nothing was inserted there."""
        seq = self._seed_slots().pop(slot, None)
        if seq is None:
            return False
        self.pool.free_sequence(seq.pages)
        return True

    def forward(self, graphstate, graphothers, state, iteration_plan: StepPlan) -> ModelOutputBatch:
        """Run one plan (from a Scheduler built by `new_scheduler()`)."""
        state, out = self.step(state, iteration_plan, graphstate=graphstate, graphother=graphothers)
        return ModelOutputBatch(state, out)

    def _seed_program(self, key, make):
        with self._compile_lock:
            if key not in self._compiled:
                self._compiled[key] = make()
            return self._compiled[key]


class vEngine(SeedEngineAPI, EngineCore, AbstractInferenceEngine):  # noqa: N801 (the seed's name)
    """The dense engine: each of `max_concurrent_decodes` slots owns a fixed run of pages for
    `max_length` tokens (engine/pools.py), so admission never waits for memory and nothing is
    preempted; prompts are prefilled in chunks inside the shared steps."""

    def __init__(self, model, processor, max_concurrent_decodes: int | None = None,
                 max_concurrent_prefill: int | None = None, prefill_lengths: list[int] | int | None = None,
                 max_prefill_length: int | None = None, max_length: int | None = None,
                 batch_size: int | None = None, seed: int = 894, config=None):
        config = engine_config(model, config, batch_size=batch_size, max_concurrent_decodes=max_concurrent_decodes,
                               max_concurrent_prefill=max_concurrent_prefill, prefill_lengths=prefill_lengths,
                               max_prefill_length=max_prefill_length, max_length=max_length, seed=seed)
        super().__init__(model, processor, config, make_slot_pages(config))
        self._batch_size = batch_size

    def prefill(self, graphstate, graphothers, tokens, valids, true_length, temperature=0.0, top_p=1.0, rngs=None,
                *, top_k=0, max_new_tokens: int | None = None):
        """The seed's vEngine.prefill (its argument order: no top_k before rngs): a batch of prompts
        (B, T) -> (its GenerationState, ResultTokens of the B first tokens). See `_prefill_rows`."""
        return self._prefill_rows(graphstate, graphothers, tokens, valids, true_length, temperature, top_p, top_k,
                                  rngs, max_new_tokens)


class oEngine(SeedEngineAPI, EngineCore, AbstractInferenceEngine):  # noqa: N801 (the seed's name)
    """The paged engine: pages are handed out on demand by an HBMPageManager (prefix caching,
    recompute preemption when they run out); the pool is sized from the memory left after the
    weights unless `num_pages` says otherwise (engine/pools.py)."""

    def __init__(self, model, processor, storage: PagedAttentionCache | None = None,
                 manager: HBMPageManager | None = None, max_concurrent_decodes: int | None = None,
                 max_concurrent_prefill: int | None = None, prefill_lengths: list[int] | int | None = None,
                 max_prefill_length: int | None = None, max_length: int | None = None,
                 batch_size: int | None = None, seed: int = 894, page_size: int = 128,
                 hbm_utilization: float = 0.6, num_pages: int | None = None, enable_prefix_caching: bool = True,
                 config=None):
        config = engine_config(model, config, batch_size=batch_size, manager=manager,
                               max_concurrent_decodes=max_concurrent_decodes,
                               max_concurrent_prefill=max_concurrent_prefill, prefill_lengths=prefill_lengths,
                               max_prefill_length=max_prefill_length, max_length=max_length, seed=seed,
                               page_size=page_size, hbm_utilization=hbm_utilization, num_pages=num_pages,
                               enable_prefix_caching=enable_prefix_caching)
        super().__init__(model, processor, config, manager or make_page_pool(model, config))
        if storage is not None and storage.num_pages != self.pool.num_pages:
            raise ValueError(f"storage has {storage.num_pages} pages but the manager has {self.pool.num_pages}")
        self._storage = storage  # used as the first state's pages, then owned by the state
        self._batch_size = batch_size

    def prefill(self, graphstate, graphothers, tokens, valids, true_length, temperature=0.0, top_p=1.0, top_k=0,
                rngs=None, *, max_new_tokens: int | None = None):
        """The seed's oEngine.prefill (top_k, then rngs): a batch of prompts (B, T) -> (its
        GenerationState, ResultTokens of the B first tokens). See `_prefill_rows`."""
        return self._prefill_rows(graphstate, graphothers, tokens, valids, true_length, temperature, top_p, top_k,
                                  rngs, max_new_tokens)

    @property
    def manager(self) -> HBMPageManager:
        return self.pool

    @property
    def page_size(self) -> int:
        return self.pool.page_size

    def init_state(self):
        state = super().init_state()
        if self._storage is not None:
            state = type(state)(self._storage, state.slots)
            self._storage = None
        return state


__all__ = ["ActiveSequenceBatch", "GenerationState", "ModelOutputBatch", "Prefix", "PrefixRow", "ResultTokens", "oEngine", "vEngine"]
