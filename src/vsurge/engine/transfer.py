"""A prefix's K/V between engines (disaggregated serving): copied out of a prefill engine's pages,
moved onto a decode engine's mesh, written into its pages.

    prefix = prefill.export_prefix(prefill_state, seq)    # its pages gathered, on the prefill mesh
    prefix = decode.receive_prefix(prefix)                 # jax.device_put onto the decode mesh
    decode_state = decode.insert_prefix(decode_state, prefix, seq)   # into the pages it attached

A prefix holds the pages covering the sequence's computed tokens, padded to a
bucket of `EngineConfig.transfer_pages` (1, 2, 4, ... pages: one compiled
program each, nothing compiles while serving). Its arrays are laid out as the
page pool (per layer keys (n, KVH, dk, page_size), values (n, KVH, page_size,
dv)) and sharded by `prefix_destination()`: KV heads over the mesh's
`model` axis, so on two meshes of the same size the move is a device-to-device
copy of each shard. A hybrid model's sequence also carries its recurrent states (every recurrent
layer's parts at its slot, after its prompt): read out of the prefill engine's slot (the
`STATE_EXPORT` program on "states", engine/state_rows.py), moved replicated (as the states live on a
mesh) and written into the slot the decode engine attached, whose first decode row reads them
(its position is past 0). The sampling state needs no move: it is rebuilt from the
sequence (its request, seed and tokens) when the decode engine's next step
loads its slot, and a sampled token's key depends only on the seed and the
token's index, so the decode side samples what the prefill side would have.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from ..kv.access import put_pages, take_pages
from ..kv.dense import DenseKVCache
from ..hardware.sharding import named_sharding
from .program_kinds import COPY, EXPORT, IMPORT, STATE_EXPORT, STATE_IMPORT
from .programs import EngineState


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PrefixPages:
    """K/V pages of one sequence's prefix: a bucket of n pages (device arrays)."""

    k: list  # per layer (n, KVH, dk, page_size)
    v: list  # per layer (n, KVH, page_size, dv)


@dataclasses.dataclass
class KVPrefix:
    """What travels from a prefill engine to a decode engine: the pages, and how many are real."""

    pages: PrefixPages
    num_pages: int  # the first num_pages of the bucket hold the sequence's K/V
    transfer_id: int | None = None  # across processes: names the pages the decode engine's owner received
    states: list | None = None  # a hybrid model's: its slot's row of every recurrent layer's parts (leaves)

    @property
    def bucket(self) -> int:
        return self.pages.k[0].shape[0]


def gather_pages(state: EngineState, ids) -> PrefixPages:
    """ids (n,) page ids -> those pages of every layer (a copy)."""
    kv = state.kv
    return PrefixPages([take_pages(k, ids) for k in kv.k], [take_pages(v, ids) for v in kv.v])


def scatter_pages(state: EngineState, prefix: PrefixPages, ids) -> EngineState:
    """Write the prefix's pages at ids (n,); an id of num_pages (padding) writes nothing."""
    kv = state.kv
    k = [put_pages(pages, ids, p) for pages, p in zip(kv.k, prefix.k)]
    v = [put_pages(pages, ids, p) for pages, p in zip(kv.v, prefix.v)]
    return dataclasses.replace(state, kv=dataclasses.replace(kv, k=k, v=v))


def copy_between(state: EngineState, src, dst) -> EngineState:
    """Page src[i]'s K/V written into page dst[i] (n,); a dst of num_pages (padding) writes nothing."""
    return scatter_pages(state, gather_pages(state, src), dst)


COPY_BUCKETS = (1, 8)  # pages per copy program call (tails copied on write: one per admitted prompt)


def prefix_pages_needed(seq, page_size: int) -> int:
    """Pages holding the K/V a prefill engine computed for `seq` (its tokens but the last; none for a
    one-token prompt: the decode engine computes its only token)."""
    return -(-seq.num_computed // page_size)


class PrefixTransferAPI:
    """export_prefix / receive_prefix / insert_prefix on EngineCore (self.config, self.pool, ...)."""

    @property
    def kv_signature(self) -> tuple:
        """What a prefix's pages and states look like here (per-layer KV shapes, storage dtype, recurrent
        state parts and their dtype): engines that hand prefixes to each other must agree on it (an int8
        pool takes no float pages)."""
        from ..kv.recurrent import state_dtype

        config = self.model.config
        states = tuple(layer.parts for layer in config.state_layout) if config.recurrent_layers else ()
        stored = str(jnp.dtype(state_dtype(self.config.state_dtype, self.model))) if states else ""
        return (tuple((l.heads, l.k_dim, l.v_dim) for l in config.kv_layout), str(self.kv_dtype), states, stored)

    def _bucket(self, pages: int) -> int:
        return next(n for n in self.config.transfer_pages if n >= pages)

    def _prefix_spec(self, pages: int) -> PrefixPages:
        state = jax.eval_shape(self._empty_state)
        return PrefixPages([jax.ShapeDtypeStruct((pages, *a.shape[1:]), a.dtype) for a in state.kv.k],
                           [jax.ShapeDtypeStruct((pages, *a.shape[1:]), a.dtype) for a in state.kv.v])

    def prefix_destination(self):
        """Where a prefix's arrays are placed on this engine: split over KV heads on the model's mesh
        (as the pages they go to; the seed's get_prefix_destination_sharding), else its device."""
        if self.mesh is not None:
            return named_sharding(self.mesh, DenseKVCache.K_AXES)
        return jax.sharding.SingleDeviceSharding(jax.devices()[0])

    def prefix_shardings(self, pages: int):
        """Where a prefix of `pages` pages lives on this engine (None: the default device)."""
        if self.mesh is None:
            return None
        dest = self.prefix_destination()
        return jax.tree.map(lambda _: dest, self._prefix_spec(pages))

    def export_prefix(self, state: EngineState, seq) -> KVPrefix:
        """The K/V pages of `seq`'s computed tokens, copied out of `state` (prefill engine)."""
        real = prefix_pages_needed(seq, self.pool.page_size)
        bucket = self._bucket(max(real, 1))
        ids = np.zeros(bucket, np.int32)  # padding reads page 0: its copy is never written anywhere
        ids[:real] = seq.pages.pages[:real]
        states = (self._program(STATE_EXPORT.key("states"))(state, np.int32(seq.slot))
                  if self.model.config.recurrent_layers else None)
        return KVPrefix(self._program(EXPORT.key(bucket))(state, ids), real, states=states)

    def receive_prefix(self, prefix: KVPrefix) -> KVPrefix:
        """`prefix` moved onto this engine's devices: jax.device_put onto its prefix sharding (decode
        engine). Returns once the copy is done, so its time is the transfer's."""
        dest = self.prefix_shardings(prefix.bucket)
        moved = jax.device_put(prefix.pages, dest if dest is not None else jax.devices()[0])
        states = None
        if prefix.states is not None:  # replicated, as the recurrent states are on a mesh
            from ..hardware.sharding import replicated

            states = jax.device_put(prefix.states, replicated(self.mesh) if self.mesh is not None
                                    else jax.devices()[0])
        return KVPrefix(jax.block_until_ready(moved), prefix.num_pages, states=jax.block_until_ready(states))

    def insert_prefix(self, state: EngineState, prefix: KVPrefix, seq) -> EngineState:
        """Write a received prefix into the pages `seq` attached here (decode engine)."""
        ids = np.full(prefix.bucket, self.pool.num_pages, np.int32)  # padding: dropped writes
        ids[: prefix.num_pages] = seq.pages.pages[: prefix.num_pages]
        state = self._program(IMPORT.key(prefix.bucket))(state, prefix.pages, ids)
        if prefix.states is not None:
            state = self._program(STATE_IMPORT.key("states"))(state, prefix.states, np.int32(seq.slot))
        return state

    def copy_pages(self, state: EngineState, copies: list[tuple[int, int]]) -> EngineState:
        """Copy page src's K/V into page dst for each (src, dst) (tails copied on write)."""
        for i in range(0, len(copies), COPY_BUCKETS[-1]):
            part = copies[i : i + COPY_BUCKETS[-1]]
            bucket = next(n for n in COPY_BUCKETS if n >= len(part))
            src = np.zeros(bucket, np.int32)  # padding reads page 0 and writes nowhere
            dst = np.full(bucket, self.pool.num_pages, np.int32)
            src[: len(part)], dst[: len(part)] = zip(*part)
            state = self._program(COPY.key(bucket))(state, src, dst)
        return state

    # ------------------------------------------------------------ compiling and warming up
    def _transfer_keys(self) -> list[tuple]:
        """The page copies start-up compiles: a prefill engine's exports, a decode engine's imports
        (both with host/disk tiers, which copy pages both ways), and tail copies where prefix caching
        shares tails."""
        role = self.config.role
        kinds = {"prefill": [EXPORT], "decode": [IMPORT]}.get(role, [])
        if getattr(self, "tiers", None) is not None:  # host/disk tiers copy pages both ways
            kinds = [EXPORT, IMPORT]
        keys = [kind.key(n) for kind in kinds for n in self.config.transfer_pages]
        if role != "decode" and self.config.enable_prefix_caching and getattr(self.pool, "tail_hits", False):
            keys += [COPY.key(n) for n in COPY_BUCKETS]
        return keys

    def _page_shardings(self, state):
        """(the pool's, replicated) shardings on the engine's mesh, for the page copies' jax.jit."""
        from ..hardware.sharding import replicated, state_shardings

        return state_shardings(state, self.mesh), replicated(self.mesh)

    def _compile_export(self, pages: int, state):
        """The EXPORT program of `pages` pages: (state, page ids (pages,)) -> PrefixPages."""
        ids = jax.ShapeDtypeStruct((pages,), jnp.int32)
        shardings = {}
        if self.mesh is not None:
            kv, rep = self._page_shardings(state)
            shardings = dict(in_shardings=(kv, rep), out_shardings=self.prefix_shardings(pages))
        return jax.jit(gather_pages, **shardings).lower(state, ids).compile()

    def _compile_import(self, pages: int, state):
        """The IMPORT program of `pages` pages: (state, PrefixPages, page ids (pages,)) -> state."""
        ids = jax.ShapeDtypeStruct((pages,), jnp.int32)
        shardings = {}
        if self.mesh is not None:
            kv, rep = self._page_shardings(state)
            shardings = dict(in_shardings=(kv, self.prefix_shardings(pages), rep), out_shardings=kv)
        fn = jax.jit(scatter_pages, donate_argnums=(0,), **shardings)
        return fn.lower(state, self._prefix_spec(pages), ids).compile()

    def _compile_copy(self, pages: int, state):
        """The COPY program of `pages` pairs: (state, source ids (pages,), destination ids (pages,)) -> state."""
        ids = jax.ShapeDtypeStruct((pages,), jnp.int32)
        shardings = {}
        if self.mesh is not None:
            kv, rep = self._page_shardings(state)
            shardings = dict(in_shardings=(kv, rep, rep), out_shardings=kv)
        return jax.jit(copy_between, donate_argnums=(0,), **shardings).lower(state, ids, ids).compile()

    def _warm_up_role(self, state: EngineState, request) -> EngineState:
        """The first runs of what a prefill engine (a prompt step, then a prefix copied out) or a
        decode engine (a prefix written in, then decode steps) runs."""
        from .sequence import Sequence

        scheduler = self.new_scheduler()
        seq = Sequence.of(request, self._processor, self.vocab_size)
        if self.config.role == "prefill":
            scheduler.add(seq)
            while scheduler.has_work:
                plan = scheduler.schedule()
                state, out = self.step(state, plan)
                scheduler.postprocess(plan, out.to_host(False))
            for ready in scheduler.ready_for_handover():
                jax.block_until_ready(self.export_prefix(state, ready))
                scheduler.detach(ready)
            return state
        seq.num_computed = len(seq.tokens) - 1  # as a prefix arrives: every token but the last computed
        scheduler.attach(seq)
        pages = prefix_pages_needed(seq, self.pool.page_size)
        zeros = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), self._prefix_spec(self._bucket(max(pages, 1))))
        states = None
        if self.model.config.recurrent_layers:  # one slot's row of every state part (state_rows.gather_states')
            states = [np.zeros(leaf.shape[1:], leaf.dtype) for leaf in jax.tree.leaves(state.kv.states)]
        state = self.insert_prefix(state, self.receive_prefix(KVPrefix(zeros, pages, states=states)), seq)
        while scheduler.has_work:
            plan = scheduler.schedule()
            state, out = self.step(state, plan)
            scheduler.postprocess(plan, out.to_host(False))
        return state
