"""The table of an engine's compiled program kinds: for each, which keys it compiles, how it is
built, what host inputs it takes and how a call is replayed on another process.

A program is named by a key tuple whose first item is its kind (`("decode", rows, window)`,
`("mixed", rows, shape)`, ...). EngineCore compiles `keys(engine)` of every kind at start-up
(`build`), the multi-host leader (scale/multihost.py) publishes each call's host inputs (the
arguments after `device_args`), and a follower rebuilds them (`host_tree`) and runs the same call
(`replay`). Adding a kind (an image encoder, a state update) is one entry here and its function in
programs.py (or encode.py / transfer.py); nothing in engine/core.py or scale/ names kinds.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any, Callable

import jax
import numpy as np

from . import encode, programs, tiers


@dataclasses.dataclass(frozen=True)
class ProgramKind:
    name: str
    # leading arguments already on the devices: 0 (none), 1 (the state) or 3 (weights graphstate,
    # graphother, then the state); the rest are host inputs, what the leader publishes
    device_args: int
    build: Callable[[Any, tuple, Any, Any, Any], Any]  # (engine, key, abstract state, weights gs, go) -> compiled
    keys: Callable[[Any], list[tuple]] = lambda engine: []  # what start-up compiles ([]: on first use)
    host_tree: Callable[[Any, tuple], Any] = lambda engine, key: ()  # pytree of the host inputs
    returns_output: bool = False  # returns (state, output) rather than the state
    replayed: bool = True  # multi-host followers run it too (the embed / score passes run on process 0 only)


def _abstract(tree):
    """Shapes and dtypes only (numpy host arrays included): what a program is lowered on."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype
                                                       if isinstance(x, np.ndarray) else x.dtype), tree)


def _build_init(engine, key, state, gs, go):
    return jax.jit(engine._empty_state, **engine._shardings("init", state)).lower().compile()


def _build_set_slot(engine, key, state, gs, go):
    fn = jax.jit(programs.set_slot, donate_argnums=(0,), **engine._shardings("set_slot", state))
    return fn.lower(state, *engine.batches.slot_arrays_spec()).compile()


def _decode_host(engine, key):  # a long window's program loops over its page columns: one more input
    return (engine.batches.decode_spec(key[1], key[2], engine.config.dynamic_window(key[2])),)


def _build_decode(engine, key, state, gs, go):
    batch = _abstract(_decode_host(engine, key)[0])
    fn = jax.jit(partial(programs.decode, engine.graphdef, max_steps=engine.config.decode_steps),
                 donate_argnums=(2,), **engine._shardings("step", state, batch))
    return fn.lower(gs, go, state, batch).compile()


def _decode_keys(engine):
    c = engine.config
    return [] if c.role == "prefill" else [("decode", rows, window) for window in c.page_windows
                                           for rows in c.decode_rows]


def _mixed_host(engine, key):
    return (engine.batches.mixed_spec(key[1], key[2]),)


def _build_mixed(engine, key, state, gs, go):
    batch = _abstract(_mixed_host(engine, key)[0])
    fn = jax.jit(partial(programs.mixed, engine.graphdef), donate_argnums=(2,),
                 **engine._shardings("step", state, batch))
    return fn.lower(gs, go, state, batch).compile()


def _mixed_keys(engine):
    c = engine.config
    return [] if c.role == "decode" else [("mixed", rows, shape) for shape in c.chunk_shapes
                                          for rows in c.mixed_rows(shape)]


def _build_encode(engine, key, state, gs, go):
    kind, rows, length = key
    batch = _abstract(encode.batch_of((rows, length), [], []))
    fn = jax.jit(partial(getattr(programs, kind), engine.graphdef), **engine._shardings("encode", state, batch))
    return fn.lower(gs, go, batch).compile()


def _build_vision(engine, key, state, gs, go):
    h, w = key[2:] if len(key) > 2 else engine.model.config.tile_size  # ("vision", 1, H, W): one image's size
    pixels = jax.ShapeDtypeStruct((key[1], h, w, 3), np.uint8)
    fn = jax.jit(partial(programs.vision, engine.graphdef), **engine._shardings("encode", state, pixels))
    return fn.lower(gs, go, pixels).compile()


def _build_transfer(engine, key, state, gs, go):
    return engine._compile_transfer(key, state)


def _transfer_keys(kind):
    return lambda engine: [key for key in engine._transfer_jobs() if key[0] == kind]


def _build_state_copy(engine, key, state, gs, go):
    return tiers.compile_state_copy(engine, key, state)


def _state_copy_keys(kind):
    return lambda engine: [key for key in tiers.state_copy_keys(engine) if key[0] == kind]


_KINDS = [
    ProgramKind("init", 0, _build_init, keys=lambda engine: [("init",)]),
    ProgramKind("set_slot", 1, _build_set_slot, keys=lambda engine: [("set_slot",)],
                host_tree=lambda engine, key: engine.batches.slot_arrays_spec()),
    ProgramKind("decode", 3, _build_decode, keys=_decode_keys, host_tree=_decode_host, returns_output=True),
    ProgramKind("mixed", 3, _build_mixed, keys=_mixed_keys, host_tree=_mixed_host, returns_output=True),
    # prefix pages out of / into the pool, and tail copies (transfer.py)
    ProgramKind("export", 1, _build_transfer, keys=_transfer_keys("export"), replayed=False),
    ProgramKind("import", 1, _build_transfer, keys=_transfer_keys("import"), replayed=False),
    ProgramKind("copy", 1, _build_transfer, keys=_transfer_keys("copy"), replayed=False),
    # a hybrid model's state snapshot rows out of / into the device, for the prefix cache's tiers (tiers.py)
    ProgramKind("state_export", 1, _build_state_copy, keys=_state_copy_keys("state_export"), replayed=False),
    ProgramKind("state_import", 1, _build_state_copy, keys=_state_copy_keys("state_import"), replayed=False),
    # whole-prompt passes (encode.py): compiled on first use
    *(ProgramKind(kind, 2, _build_encode, replayed=False) for kind in encode.KINDS),
    # a vision-language model's tower over a bucket of image tiles (media.py), compiled on first use; the
    # embeddings go to the host (multi-host followers get them in the step's inputs)
    ProgramKind("vision", 2, _build_vision, replayed=False),
]
PROGRAMS: dict[str, ProgramKind] = {kind.name: kind for kind in _KINDS}


def replay(engine, key: tuple, state, leaves: list):
    """Run one call another process published (its key and host-input leaves) on `engine`'s own
    compiled program and device arguments: -> (state, output or None)."""
    kind = PROGRAMS[key[0]]
    if not kind.replayed:
        raise RuntimeError(f"{key[0]} calls are not replayed on other processes")
    host = jax.tree.unflatten(jax.tree.structure(kind.host_tree(engine, key)), leaves)
    device = {0: (), 1: (state,), 3: (engine.graphstate, engine.graphother, state)}[kind.device_args]
    result = engine._compiled[key](*device, *host)
    return result if kind.returns_output else (result, None)
