"""The table of an engine's compiled program kinds: for each, which keys it compiles, how it is
built, what host inputs it takes and how a call is replayed on another process.

Each kind is one `ProgramKind` object below (INIT, SET_SLOT, DECODE, MIXED, EXPORT, ...), and code
that compiles or calls a program holds these objects: a program's key is built by its kind
(`DECODE.key(rows, window)` -> `("decode", rows, window)`) and `kind_of(key)` finds a key's kind.
Keys stay plain tuples led by the kind's name, so they pickle into the multi-host leader's messages
and name the same program on every process. EngineCore compiles `keys(engine)` of every kind at
start-up (`build`), the multi-host leader (scale/multihost.py) publishes each call's host inputs (the
arguments after `device_args`), and a follower rebuilds them (`host_tree`) and runs the same call
(`replay`). Adding a kind (an image encoder, a state update) is one entry here and its function in
programs.py (or encode.py / transfer.py / state_rows.py); nothing in engine/core.py or scale/ compares
a kind's name.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any, Callable

import jax
import numpy as np

from . import encode, programs, state_rows
from .compile_mode import defers
from .image_encoder import tile_buckets


@dataclasses.dataclass(frozen=True)
class ProgramKind:
    name: str  # the first item of its keys
    # leading arguments already on the devices: 0 (none), 1 (the state), 2 (weights graphstate and
    # graphother) or 3 (weights, then the state); the rest are host inputs, what the leader publishes
    device_args: int
    build: Callable[[Any, tuple, Any, Any, Any], Any]  # (engine, key, abstract state, weights gs, go) -> compiled
    keys: Callable[[Any], list[tuple]] = lambda engine: []  # what start-up compiles ([]: on first use)
    host_tree: Callable[[Any, tuple], Any] = lambda engine, key: ()  # pytree of the host inputs
    returns_output: bool = False  # returns (state, output) rather than the state
    replayed: bool = True  # multi-host followers run it too (the embed / score passes run on process 0 only)
    # a whole-prompt pass's host side: (batch, places, requests, its outputs on the host) -> results
    results: Callable[[Any, list, list, tuple], list] | None = None

    def key(self, *shape) -> tuple:
        """The key of this kind's program for `shape` (its buckets: rows, window, pages, ...)."""
        return (self.name, *shape)


def _abstract(tree):
    """Shapes and dtypes only (numpy host arrays included): what a program is lowered on."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype
                                                       if isinstance(x, np.ndarray) else x.dtype), tree)


def _build_init(engine, key, state, gs, go):
    return jax.jit(engine._empty_state, **engine._init_shardings(state)).lower().compile()


def _build_set_slot(engine, key, state, gs, go):
    fn = jax.jit(programs.set_slot, donate_argnums=(0,), **engine._set_slot_shardings(state))
    return fn.lower(state, *engine.batches.slot_arrays_spec()).compile()


def _decode_host(engine, key):  # a long window's program loops over its page columns: one more input
    return (engine.batches.decode_spec(key[1], key[2], engine.config.dynamic_window(key[2])),)


def _build_decode(engine, key, state, gs, go):
    batch = _abstract(_decode_host(engine, key)[0])
    fn = jax.jit(partial(programs.decode, engine.graphdef, max_steps=engine.config.decode_steps),
                 donate_argnums=(2,), **engine._step_shardings(state, batch))
    return fn.lower(gs, go, state, batch).compile()


def _decode_keys(engine):
    c = engine.config
    return [] if c.role == "prefill" else [DECODE.key(rows, window) for window in c.page_windows
                                           for rows in c.decode_rows]


def _mixed_host(engine, key):
    return (engine.batches.mixed_spec(key[1], key[2]),)


def _build_mixed(engine, key, state, gs, go):
    batch = _abstract(_mixed_host(engine, key)[0])
    fn = jax.jit(partial(programs.mixed, engine.graphdef), donate_argnums=(2,),
                 **engine._step_shardings(state, batch))
    return fn.lower(gs, go, state, batch).compile()


def _mixed_keys(engine):
    c = engine.config
    return [] if c.role == "decode" else [MIXED.key(rows, shape) for shape in c.chunk_shapes
                                          for rows in c.mixed_rows(shape)]


def _encode_builder(program):
    """The build of a whole-prompt pass (`program`: programs.embed or programs.score); key (kind, rows, length)."""
    def build(engine, key, state, gs, go):
        batch = _abstract(encode.batch_of(key[1:], [], []))
        fn = jax.jit(partial(program, engine.graphdef), **engine._encode_shardings(batch))
        return fn.lower(gs, go, batch).compile()
    return build


def _build_vision(engine, key, state, gs, go):
    h, w = key[2:] if len(key) > 2 else engine.model.config.tile_size  # (1, H, W): one image's size
    pixels = jax.ShapeDtypeStruct((key[1], h, w, 3), np.uint8)
    fn = jax.jit(partial(programs.vision, engine.graphdef), **engine._encode_shardings(pixels))
    return fn.lower(gs, go, pixels).compile()


def _transfers(engine, kind) -> list[tuple]:
    """Start-up keys of `kind` among the page copies the engine's role and caches need (transfer.py)."""
    return [key for key in engine._transfer_keys() if kind_of(key) is kind]


def _tiered_snapshots(engine) -> bool:
    snaps = getattr(engine.pool, "snapshots", None)
    return snaps is not None and snaps.host is not None


def _state_copies(engine, kind) -> list[tuple]:
    """Both state copies, for a pool whose snapshots have lower tiers; a hybrid model's prefill engine
    exports its sequences' states ("states") and a decode engine imports them."""
    keys = [STATE_EXPORT.key(), STATE_IMPORT.key()] if _tiered_snapshots(engine) else []
    if engine.model.config.recurrent_layers:
        keys += {"prefill": [STATE_EXPORT.key("states")], "decode": [STATE_IMPORT.key("states")]}.get(
            engine.config.role, [])
    return [key for key in keys if kind_of(key) is kind]


INIT = ProgramKind("init", 0, _build_init, keys=lambda engine: [INIT.key()])
SET_SLOT = ProgramKind("set_slot", 1, _build_set_slot, keys=lambda engine: [SET_SLOT.key()],
                       host_tree=lambda engine, key: engine.batches.slot_arrays_spec())
DECODE = ProgramKind("decode", 3, _build_decode, keys=_decode_keys, host_tree=_decode_host, returns_output=True)
MIXED = ProgramKind("mixed", 3, _build_mixed, keys=_mixed_keys, host_tree=_mixed_host, returns_output=True)
# prefix pages out of / into the pool, and tail copies (transfer.py)
EXPORT = ProgramKind("export", 1, lambda engine, key, state, gs, go: engine._compile_export(key[1], state),
                     keys=lambda engine: _transfers(engine, EXPORT), replayed=False)
IMPORT = ProgramKind("import", 1, lambda engine, key, state, gs, go: engine._compile_import(key[1], state),
                     keys=lambda engine: _transfers(engine, IMPORT), replayed=False)
COPY = ProgramKind("copy", 1, lambda engine, key, state, gs, go: engine._compile_copy(key[1], state),
                   keys=lambda engine: _transfers(engine, COPY), replayed=False)
# a hybrid model's state rows out of / into the device, for the prefix cache's tiers (tiers.py) and a
# disaggregated hand-over (transfer.py); key[1], where given, names the rows (state_rows.py)
STATE_EXPORT = ProgramKind("state_export", 1, lambda engine, key, state, gs, go:
                           state_rows.compile_gather(engine, state, *key[1:]),
                           keys=lambda engine: _state_copies(engine, STATE_EXPORT), replayed=False)
STATE_IMPORT = ProgramKind("state_import", 1, lambda engine, key, state, gs, go:
                           state_rows.compile_scatter(engine, state, *key[1:]),
                           keys=lambda engine: _state_copies(engine, STATE_IMPORT), replayed=False)
# whole-prompt passes (encode.py), one per EncodeRequest kind (encode.KINDS): compiled on first use
EMBED = ProgramKind("embed", 2, _encode_builder(programs.embed), replayed=False,
                    results=lambda batch, places, requests, out: encode.embed_results(*out, len(requests)))
SCORE = ProgramKind("score", 2, _encode_builder(programs.score), replayed=False,
                    results=lambda batch, places, requests, out: encode.score_results(batch, places, requests, *out))


def _vision_keys(engine) -> list[tuple]:
    """The tower's tile buckets, for an engine that compiles after it is ready (an accelerator: the first image
    request on a v5e waited 50 s for the two buckets its 17 tiles take); elsewhere each compiles on first use
    (seconds on a CPU; a test's tiny tower needs one or two). Towers of images' own sizes always compile per
    size on first use (engine.program_ready)."""
    config = engine.model.config
    if engine.media is None or getattr(config, "variable_images", False) or not defers(engine):
        return []
    return [VISION.key(b) for b in tile_buckets()]


# a vision-language model's tower over a bucket of image tiles (image_encoder.py): the embeddings go to the
# host (multi-host followers get them in the step's inputs)
VISION = ProgramKind("vision", 2, _build_vision, keys=_vision_keys, replayed=False)

PROGRAMS: dict[str, ProgramKind] = {kind.name: kind for kind in (
    INIT, SET_SLOT, DECODE, MIXED, EXPORT, IMPORT, COPY, STATE_EXPORT, STATE_IMPORT, EMBED, SCORE, VISION)}


def kind_of(key: tuple) -> ProgramKind:
    """The kind of the program `key` names (KeyError: no program kind)."""
    return PROGRAMS[key[0]]


def replay(engine, key: tuple, state, leaves: list):
    """Run one call another process published (its key and host-input leaves) on `engine`'s own
    compiled program and device arguments: -> (state, output or None)."""
    kind = kind_of(key)
    if not kind.replayed:
        raise RuntimeError(f"{kind.name} calls are not replayed on other processes")
    host = jax.tree.unflatten(jax.tree.structure(kind.host_tree(engine, key)), leaves)
    device = {0: (), 1: (state,), 3: (engine.graphstate, engine.graphother, state)}[kind.device_args]
    result = engine._compiled[key](*device, *host)
    return result if kind.returns_output else (result, None)
