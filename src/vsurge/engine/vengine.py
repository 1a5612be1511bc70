"""vEngine: the device side of dense continuous batching.

`max_concurrent_decodes` slots share one decode state: a dense KV cache
(L, slots, KVH, max_length, hd) plus per-slot token, position, counters and
sampling arrays. A request is prefilled alone into a prompt-length bucket
(a Prefix), inserted into a free slot, and advanced one token per `decode`
together with every other slot. All programs are compiled by `compile()`;
the state is donated to each call, so the cache is updated in place.
"""

from __future__ import annotations

import dataclasses
import threading
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ..decoding import decode_step, is_eos, prefill_first_token
from ..kv import DenseKVCache
from ..ops.sampling import SamplingArrays
from ..sampling_params import SamplingParams
from ..vinference.buckets import EOS_WIDTH, next_power_of_two
from .engine_base import EngineBase
from .request import ActiveRequest


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Prefix:
    """One prefilled request, before it gets a slot."""

    k: jax.Array  # (L, 1, KVH, T, hd)
    v: jax.Array
    first: jax.Array  # (1,) first generated token
    length: jax.Array  # (1,) prompt length
    done: jax.Array  # (1,) bool: the first token already ends it
    max_new: jax.Array  # (1,)
    eos: jax.Array  # (1, E)
    prompt_mask: jax.Array  # (1, V) bool
    bias: jax.Array  # (1, V) f32
    sampling: SamplingArrays  # rows of 1
    want_logprobs: jax.Array  # (1,) bool
    logprobs: tuple  # the first token's (chosen (1,), top ids (1, K), top values (1, K))


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class SlotState:
    """The decode state of all slots (B = max_concurrent_decodes)."""

    cache: DenseKVCache  # (L, B, KVH, max_length, hd)
    tokens: jax.Array  # (B,) last token of each slot
    positions: jax.Array  # (B,) position of that token
    active: jax.Array  # (B,) bool
    generated: jax.Array  # (B,)
    max_new: jax.Array  # (B,)
    eos: jax.Array  # (B, E)
    counts: jax.Array  # (B, V) i32
    prompt_mask: jax.Array  # (B, V) bool
    bias: jax.Array  # (B, V) f32
    sampling: SamplingArrays
    want_logprobs: jax.Array  # (B,) bool


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class ResultTokens:
    tokens: jax.Array  # (B,) the token each slot produced this step
    valid: jax.Array  # (B,) bool: the slot was active (its token is real)
    logprob: jax.Array  # (B,) f32 log-probability of that token (0 unless requested)
    top_ids: jax.Array  # (B, K) i32 most likely alternatives
    top_logprobs: jax.Array  # (B, K) f32


def _prefill(graphdef, graphstate, graphother, tokens, length, sampling, bias, eos, max_new, want_logprobs) -> Prefix:
    model = nnx.merge(graphdef, graphstate, graphother)
    first, _, prompt_mask, cache, logprobs = prefill_first_token(model, tokens, length, sampling, bias,
                                                                 tokens.shape[1], want_logprobs)
    done = is_eos(first, eos) | (max_new <= 1)
    return Prefix(cache.k, cache.v, first, length, done, max_new, eos, prompt_mask, bias, sampling, want_logprobs,
                  logprobs)


def _insert(prefix: Prefix, state: SlotState, slot) -> SlotState:
    cache = state.cache
    at = (0, slot, 0, 0, 0)
    cache = dataclasses.replace(cache, k=jax.lax.dynamic_update_slice(cache.k, prefix.k.astype(cache.k.dtype), at),
                                v=jax.lax.dynamic_update_slice(cache.v, prefix.v.astype(cache.v.dtype), at))
    vocab = state.counts.shape[1]

    def put(row_values, values):
        return row_values.at[slot].set(values[0])

    return SlotState(
        cache=cache,
        tokens=put(state.tokens, prefix.first),
        positions=put(state.positions, prefix.length),
        active=put(state.active, ~prefix.done),
        generated=state.generated.at[slot].set(1),
        max_new=put(state.max_new, prefix.max_new),
        eos=put(state.eos, prefix.eos),
        counts=state.counts.at[slot].set(jax.nn.one_hot(prefix.first[0], vocab, dtype=jnp.int32)),
        prompt_mask=put(state.prompt_mask, prefix.prompt_mask),
        bias=put(state.bias, prefix.bias),
        sampling=jax.tree.map(put, state.sampling, prefix.sampling),
        want_logprobs=put(state.want_logprobs, prefix.want_logprobs),
    )


def _decode(graphdef, graphstate, graphother, state: SlotState, release, *, window: int, width: int):
    """One token for every active slot among the first `width`; `release` (B,) bool deactivates
    freed slots first. Slots are handed out lowest-first, so `width` covers every busy one."""
    model = nnx.merge(graphdef, graphstate, graphother)
    active = state.active & ~release
    head = lambda a: a[:width]  # noqa: E731
    token, generated, done, counts, cache, (logprob, top_ids, top_values) = decode_step(
        model, head(state.tokens), head(state.positions), head(active), head(state.generated), head(state.max_new),
        head(state.eos), head(state.counts), head(state.prompt_mask), head(state.bias),
        jax.tree.map(head, state.sampling), state.cache.with_window(window), head(state.want_logprobs))

    def put(full, part):
        return full.at[:width].set(part)

    step_active = head(active)
    state = dataclasses.replace(
        state, cache=cache.with_window(None), tokens=put(state.tokens, token),
        positions=put(state.positions, head(state.positions) + step_active),
        active=put(active, step_active & ~done), generated=put(state.generated, generated),
        counts=put(state.counts, counts))
    b = state.tokens.shape[0]
    result = ResultTokens(
        state.tokens, put(jnp.zeros_like(active), step_active), put(jnp.zeros((b,), jnp.float32), logprob),
        put(jnp.zeros((b, top_ids.shape[1]), jnp.int32), top_ids),
        put(jnp.zeros((b, top_values.shape[1]), jnp.float32), top_values))
    return state, result


class vEngine(EngineBase):  # noqa: N801 (the seed's name)
    def __init__(self, model, processor, max_concurrent_decodes: int | None = None,
                 max_concurrent_prefill: int | None = None, prefill_lengths: list[int] | int | None = None,
                 max_prefill_length: int | None = None, max_length: int | None = None,
                 batch_size: int | None = None, seed: int = 894):
        self.model = model
        self._processor = processor
        context = model.config.max_position_embeddings
        self._max_length = int(min(max_length or 2048, context))
        self._max_prefill_length = int(min(max_prefill_length or min(512, self._max_length // 2), self._max_length - 1))
        if isinstance(prefill_lengths, int):
            prefill_lengths = [prefill_lengths]
        buckets = prefill_lengths or _powers_of_two(32, self._max_prefill_length)
        self._prefill_lengths = sorted({int(b) for b in buckets if b <= self._max_prefill_length} |
                                       {self._max_prefill_length})
        self._max_concurrent_decodes = int(max_concurrent_decodes or 8)
        self._max_concurrent_prefill = int(max_concurrent_prefill or 1)
        self._batch_size = batch_size
        self.decode_windows = sorted({w for w in _powers_of_two(256, self._max_length)} | {self._max_length})
        # decode the first `width` slots only: 1, 4, 16, ... and all of them
        self.decode_widths = sorted({w for w in _powers_of_four(self._max_concurrent_decodes)} |
                                    {self._max_concurrent_decodes})
        self._rng = np.random.default_rng(seed)
        self._key = jax.random.PRNGKey(seed)
        self.graphdef, self.graphstate, self.graphother = nnx.split(model, nnx.Param, ...)
        self._compiled: dict[Any, Any] = {}
        self._compile_lock = threading.Lock()
        # host mirror of the slots, for choosing the attention window and applying frees
        self._slot_position = np.zeros(self._max_concurrent_decodes, np.int64)
        self._slot_busy = np.zeros(self._max_concurrent_decodes, bool)
        self._pending_release = np.zeros(self._max_concurrent_decodes, bool)
        self.compile_seconds = 0.0

    # ------------------------------------------------------------ seed properties
    @property
    def max_prefill_length(self) -> int:
        return self._max_prefill_length

    @property
    def max_prompt_length(self) -> int:
        """Longest prompt a request may have (one prefill)."""
        return self._max_prefill_length

    @property
    def prefill_lengths(self) -> list[int]:
        return list(self._prefill_lengths)

    @property
    def prng_key(self):
        """A fresh key split from the engine's key (sampling itself uses per-request seeds)."""
        self._key, key = jax.random.split(self._key)
        return key

    def get_prefix_destination_sharding(self):
        return None

    def get_state_shardings(self, is_decode: bool = False):
        return None

    # ------------------------------------------------------------ compilation
    def _prefill_inputs(self, length: int):
        s = jax.ShapeDtypeStruct
        vocab = self.model.config.vocab_size
        return (s((1, length), jnp.int32), s((1,), jnp.int32), self._abstract(SamplingArrays.neutral(1)),
                s((1, vocab), jnp.float32), s((1, EOS_WIDTH), jnp.int32), s((1,), jnp.int32), s((1,), bool))

    def compile(self, progress: bool = True) -> None:
        """Compile every program the engine will run; nothing compiles after this."""
        from tqdm.auto import tqdm

        jobs = [("init", 0)] + [("prefill", n) for n in self._prefill_lengths]
        jobs += [("insert", n) for n in self._prefill_lengths]
        jobs += [("decode", (w, n)) for w in self.decode_windows for n in self.decode_widths]
        for job in tqdm(jobs, desc="Compiling vEngine", unit="program", disable=not progress):
            self._program(*job)

    def _build(self, kind: str, size):
        gs, go = self._abstract(self.graphstate), self._abstract(self.graphother)
        if kind == "init":
            exe = jax.jit(self._empty_state).lower().compile()
        elif kind == "prefill":
            fn = jax.jit(partial(_prefill, self.graphdef))
            exe = fn.lower(gs, go, *self._prefill_inputs(size)).compile()
        elif kind == "insert":
            prefix = jax.eval_shape(partial(_prefill, self.graphdef), gs, go, *self._prefill_inputs(size))
            exe = jax.jit(_insert, donate_argnums=(1,)).lower(
                prefix, self._abstract_state(), jax.ShapeDtypeStruct((), jnp.int32)).compile()
        else:
            window, width = size
            fn = jax.jit(partial(_decode, self.graphdef, window=window, width=width), donate_argnums=(2,))
            exe = fn.lower(gs, go, self._abstract_state(),
                           jax.ShapeDtypeStruct((self._max_concurrent_decodes,), bool)).compile()
        return exe

    def _abstract_state(self):
        return jax.eval_shape(self._empty_state)

    # ------------------------------------------------------------ device programs
    def init_decode_state(self, *args, **kwargs) -> SlotState:
        """All slots empty (a compiled program: no compilation while serving)."""
        return self._program("init", 0)()

    def _empty_state(self) -> SlotState:
        b, vocab = self._max_concurrent_decodes, self.model.config.vocab_size
        zeros = partial(jnp.zeros, (b,), jnp.int32)
        return SlotState(
            cache=DenseKVCache.init(self.model.config, b, self._max_length, self.model.dtype),
            tokens=zeros(), positions=zeros(), active=jnp.zeros((b,), bool), generated=zeros(),
            max_new=jnp.ones((b,), jnp.int32), eos=jnp.full((b, EOS_WIDTH), -1, jnp.int32),
            counts=jnp.zeros((b, vocab), jnp.int32), prompt_mask=jnp.zeros((b, vocab), bool),
            bias=jnp.zeros((b, vocab), jnp.float32),
            sampling=jax.tree.map(jnp.asarray, SamplingArrays.neutral(b)),
            want_logprobs=jnp.zeros((b,), bool),
        )

    def prefill_request(self, request: ActiveRequest) -> Prefix:
        """Pad the request's prompt into its bucket and prefill it (the driver's entry point)."""
        n = len(request.prompt_ids)
        length = next(b for b in self._prefill_lengths if b >= n)
        vocab = self.model.config.vocab_size
        tokens = np.zeros((1, length), np.int32)
        tokens[0, :n] = request.prompt_ids
        bias = np.zeros((1, vocab), np.float32)
        for token, value in (request.params.logit_bias or {}).items():
            bias[0, token] = value
        eos = np.full((1, EOS_WIDTH), -1, np.int32)
        eos[0, : len(request.eos_token_ids)] = request.eos_token_ids
        sampling = SamplingArrays.from_params([request.params], [request.seed])
        return self._program("prefill", length)(
            self.graphstate, self.graphother, tokens, np.asarray([n], np.int32), sampling, bias, eos,
            np.asarray([request.max_new_tokens], np.int32), np.asarray([request.params.logprobs is not None]))

    def prefill(self, graphstate, graphothers, tokens, valids, true_length: int, temperature=0.0, top_p=1.0,
                top_k=0, rngs=None, max_new_tokens: int = 16):
        """The seed's prefill: one prompt (1, T) -> (Prefix, first token). rngs is unused: sampling keys
        come from a seed drawn from the engine's generator."""
        ids = np.asarray(tokens).reshape(-1)[: int(true_length)].tolist()
        params = SamplingParams(temperature=float(temperature), top_p=float(top_p), top_k=int(top_k),
                                max_tokens=max_new_tokens)
        request = ActiveRequest(ids, params, self.new_seed(), max_new_tokens, self.eos_token_ids, channel=None)
        if graphstate is not None:
            self.graphstate = graphstate
        if graphothers is not None:
            self.graphother = graphothers
        prefix = self.prefill_request(request)
        return prefix, prefix.first

    def insert(self, prefix: Prefix, decode_state: SlotState, slot: int) -> SlotState:
        length = prefix.k.shape[3]
        state = self._program("insert", length)(prefix, decode_state, np.int32(slot))
        self._slot_position[slot] = length  # an upper bound until set_slot_position gives the exact one
        self._slot_busy[slot] = True
        self._pending_release[slot] = False
        return state

    def set_slot_position(self, slot: int, position: int) -> None:
        self._slot_position[slot] = position

    def bulk_insert(self, prefix: Prefix, decode_state: SlotState, slots: list[int]) -> SlotState:
        """Insert rows of a batched prefix into several slots."""
        for row, slot in enumerate(slots):
            one = jax.tree.map(lambda a: a[:, row:row + 1] if a.ndim == 5 else a[row:row + 1], prefix)
            decode_state = self.insert(one, decode_state, slot)
        return decode_state

    def free_resource(self, slot: int) -> bool:
        """Free a slot: it is deactivated on the device at the next decode and can be reused."""
        if not 0 <= slot < self._max_concurrent_decodes:
            return False
        self._pending_release[slot] = True
        self._slot_busy[slot] = False
        return True

    def window_for_next_step(self) -> int:
        busy = self._slot_position[self._slot_busy]
        needed = int(busy.max()) + 1 if busy.size else 1
        return next((w for w in self.decode_windows if w >= needed), self._max_length)

    def width_for_next_step(self) -> int:
        # slots being released this step are still active on the device until the step runs
        busy = np.flatnonzero(self._slot_busy | self._pending_release)
        needed = int(busy.max()) + 1 if busy.size else 1
        return next(w for w in self.decode_widths if w >= needed)

    def decode(self, graphstate, graphothers, state: SlotState, rngs=None):
        """One decode step for all slots -> (state, ResultTokens). Applies pending frees first."""
        width = self.width_for_next_step()
        release = self._pending_release.copy()
        self._pending_release[:] = False
        program = self._program("decode", (self.window_for_next_step(), width))
        gs = self.graphstate if graphstate is None else graphstate
        go = self.graphother if graphothers is None else graphothers
        state, result = program(gs, go, state, release)
        self._slot_position[self._slot_busy] += 1
        return state, result


def _powers_of_four(stop: int) -> list[int]:
    out, n = [], 1
    while n < stop:
        out.append(n)
        n *= 4
    return out


def _powers_of_two(start: int, stop: int) -> list[int]:
    out, n = [], start
    while n < stop:
        out.append(n)
        n *= 2
    return out


__all__ = ["vEngine", "Prefix", "SlotState", "ResultTokens", "next_power_of_two"]
