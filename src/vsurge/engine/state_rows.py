"""A hybrid model's recurrent-state rows copied off and onto the device: a snapshot row (the prefix
cache's tiers, tiers.py) or a sequence slot's states (a disaggregated hand-over, transfer.py). These
are the `STATE_EXPORT` and `STATE_IMPORT` programs of engine/program_kinds.py."""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import numpy as np


def gather_states(state, row, held: str = "snapshots"):
    """Row `row` (a traced i32) of every recurrent layer's parts in `held` ("snapshots": a snapshot row;
    "states": a sequence slot's states): the leaves of a row."""
    return [leaf[row] for leaf in jax.tree.leaves(getattr(state.kv, held))]


def scatter_states(state, leaves: list, row, held: str = "snapshots"):
    """Write `leaves` (as gather_states returns) into row `row` of `held`."""
    rows = getattr(state.kv, held)
    new = [leaf.at[row].set(value) for leaf, value in zip(jax.tree.leaves(rows), leaves)]
    kv = dataclasses.replace(state.kv, **{held: jax.tree.unflatten(jax.tree.structure(rows), new)})
    return dataclasses.replace(state, kv=kv)


def _shardings(engine, state) -> tuple[dict, dict]:
    """jax.jit's shardings of (gather, scatter) on the engine's mesh ({} on one device)."""
    if engine.mesh is None:
        return {}, {}
    from ..hardware.sharding import replicated, state_shardings

    kv, rep = state_shardings(state, engine.mesh), replicated(engine.mesh)
    return dict(in_shardings=(kv, rep), out_shardings=rep), dict(in_shardings=(kv, rep, rep), out_shardings=kv)


def compile_gather(engine, state, held: str = "snapshots"):
    """The state export program: (state, row) -> the row's leaves (as gather_states)."""
    row = jax.ShapeDtypeStruct((), np.int32)
    return jax.jit(partial(gather_states, held=held), **_shardings(engine, state)[0]).lower(state, row).compile()


def compile_scatter(engine, state, held: str = "snapshots"):
    """The state import program: (state, leaves, row) -> state (as scatter_states)."""
    gather, row = partial(gather_states, held=held), jax.ShapeDtypeStruct((), np.int32)
    leaves = jax.eval_shape(gather, state, row)
    fn = jax.jit(partial(scatter_states, held=held), donate_argnums=(0,), **_shardings(engine, state)[1])
    return fn.lower(state, leaves, row).compile()
