"""Recurrent layers' per-sequence state, held beside the KV cache (linear attention, Mamba-2, short
convolutions).

A recurrent layer (`config.layer_kind(i)` neither "attention" nor "mlp") keeps a fixed-size state per sequence
instead of keys and values; its `StateLayer` (config.py) names the parts, e.g. a convolution's
window of past inputs ("conv") and a delta-rule or SSM state ("ssm"). Every cache holds them per
row: the dense cache per batch row, the paged pool per sequence slot (S+1 rows, the last the spare
row that padding rows write), and the passes without a cache start each row from zeros and keep
nothing. A layer asks its cache to run one recurrent op over the step's tokens:

    out, cache = cache.recurrent(state_index, part, op, inputs, positions, shape)

`op(inputs, state, valid) -> (out, state)` works on rows of tokens: inputs a tuple of (R, T, ...)
arrays, state (R, ...) float32 (however the cache stores it: `state_dtype`), valid (R, T) bool, True on a prefix of each row (a False token must
leave the state as it was); `shape` is the part's shape (the `StateLayer`'s), for caches that start
from zeros. The cache decides which rows those are and where their states live.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from ..config import StateLayer
from ..hardware.devices import platform
from . import STATE_DTYPES


def state_dtype(setting: str | None, model) -> jnp.dtype:
    """How the paged engine stores recurrent states (`--state-dtype`): "auto" is float32 for a model
    whose weights are all float32 (the exact path the tests compare), else bfloat16, as vLLM's
    `--mamba-ssm-cache-dtype auto` (the model's dtype): a 32-row decode step of a Qwen3.5-shaped
    model reads and writes its states once each, as many bytes as its weights in float32
    (benchmarks/hybrid_decode.py). The ops always compute in float32; only the stored rows round."""
    if setting not in (None, *STATE_DTYPES):
        raise ValueError(f"state_dtype (--state-dtype) must be one of {', '.join(STATE_DTYPES)}, got {setting!r}")
    if setting in (None, "auto"):
        exact = jnp.dtype(model.param_dtype) == jnp.float32 and getattr(model, "quantization", None) is None
        return jnp.dtype(jnp.float32 if exact else jnp.bfloat16)
    return jnp.dtype(setting)


def state_row_bytes(model_config, dtype=jnp.float32) -> int:
    """Bytes of one sequence's recurrent states (every recurrent layer's parts, stored as `dtype`);
    0 for a model with attention layers only."""
    size = jnp.dtype(dtype).itemsize
    return sum(size * math.prod(shape) for layer in model_config.state_layout for _, shape in layer.parts)


def stored_row_bytes(model, setting: str | None) -> int:
    """Bytes of one sequence's recurrent states as the paged engine stores them (`--state-dtype`)."""
    return state_row_bytes(model.config, state_dtype(setting, model))


def init_states(layout: tuple[StateLayer, ...], rows: int, dtype=jnp.float32) -> list[dict]:
    """Zero states of every recurrent layer for `rows` rows: per layer {part: (rows, *shape) dtype}."""
    return [{name: jnp.zeros((rows, *shape), dtype) for name, shape in layer.parts} for layer in layout]


def _f32(state):
    return state.astype(jnp.float32)


def by_length(chunked, step, row_by_row: bool = False, in_place=None):
    """One op from a prompt form `chunked(inputs, state, valid)` and a one-token form
    `step(inputs (R, ...), state, valid (R,))`: rows of one token (decode) take the step form.
    `row_by_row`: the paged engine may update large states of decode rows one row at a time in
    place (run_packed); only for a step form measured to gain from it. `in_place(inputs (R, ...),
    states (S+1, ...), slots (R,), fresh (R,), valid (R,)) -> (out (R, ...), states)`: the step form
    on rows whose states live in `states` at `slots` (a row with `fresh` starts from zeros), for the
    paged engine's decode rows; it returns None where it cannot run (a C++ kernel on CPU only)."""
    def op(inputs, state, valid):
        if inputs[0].shape[1] != 1:
            return chunked(inputs, state, valid)
        out, state = step(tuple(a[:, 0] for a in inputs), state, valid[:, 0])
        return out[:, None], state
    op.row_by_row, op.in_place = row_by_row, in_place
    return op


def replace_part(states: list[dict], index: int, part: str, value) -> list[dict]:
    out = list(states)
    out[index] = {**states[index], part: value}
    return out


def _at_slots(op, inputs, states, slots, positions, snaps=None, restore=None):
    """Rows of sequences held at `slots` (R,) of `states` (S+1, ...): positions (R, T), -1 = padding;
    a row whose first token is position 0 starts its sequence, from a zero state; one with a
    `restore` row (R,) >= 0 resumes a cached prefix from that row of `snaps` (kv/state_snapshots.py)."""
    start = _f32(states[slots])
    fresh = positions[:, 0] == 0
    start = jnp.where(fresh.reshape(-1, *(1,) * (start.ndim - 1)), 0.0, start)
    if restore is not None:
        taken = _f32(snaps[jnp.where(restore >= 0, restore, snaps.shape[0] - 1)])
        start = jnp.where((restore >= 0).reshape(-1, *(1,) * (start.ndim - 1)), taken, start)
    out, new = op(inputs, start, positions >= 0)
    return out, put_rows(states, new, slots), new


def put_rows(rows, values, indices):
    """rows (N, ...) with rows `indices` (R,) replaced by values (R, ...) (see put_row)."""
    return _as_bits(lambda r, v: r.at[indices].set(v), rows, values)


def _at_slot(op, inputs, states, slot, positions, snaps=None, restore=None):
    """_at_slots for one row (a prompt chunk row): its state read and written as a dynamic slice of
    `states` (a scalar slot, put_row), not a gather and a scatter, which XLA:CPU turned into a loop over
    the whole array and then a copy of it, every layer and step: ~30 ms of a 0.6 s prompt step of a
    ~0.5B Qwen3-Next with bfloat16 states (33 snapshot rows a layer)."""
    start = _f32(jax.lax.dynamic_index_in_dim(states, slot))  # (1, ...)
    start = jnp.where(positions[0, 0] == 0, 0.0, start)
    if restore is not None:
        taken = _f32(jax.lax.dynamic_index_in_dim(snaps, jnp.where(restore >= 0, restore, snaps.shape[0] - 1)))
        start = jnp.where(restore >= 0, taken, start)
    out, new = op(inputs, start, positions >= 0)
    return out, put_row(states, new, slot), new


def put_row(rows, value, index):
    """rows (N, ...) with row `index` replaced by value (1, ...), in place."""
    return _as_bits(lambda r, v: jax.lax.dynamic_update_index_in_dim(r, v, index, 0), rows, value)


def _as_bits(update, rows, values):
    """update(rows, values) with values cast to rows' dtype; on a CPU a 2-byte float array is updated as
    its uint16 bits: XLA:CPU widens a bfloat16 scatter or dynamic-update-slice to float32 over the whole
    array (convert, update, convert back) rather than writing the rows. Not elsewhere: a v5e copied the
    whole state array into its bits and back every layer and step (1.9 ms of a ~0.5B Qwen3.5-shaped hybrid's
    7.6 ms 32-row decode step, benchmarks/roofline.py --models hybrid --trace, 2026-12-07)."""
    values = values.astype(rows.dtype)
    if rows.dtype.itemsize != 2 or not jnp.issubdtype(rows.dtype, jnp.floating) or platform() != "cpu":
        return update(rows, values)
    bits = update(jax.lax.bitcast_convert_type(rows, jnp.uint16), jax.lax.bitcast_convert_type(values, jnp.uint16))
    return jax.lax.bitcast_convert_type(bits, rows.dtype)


# A state row at least this big, of an op that allows it (`by_length(row_by_row=True)`), is updated in
# place, one row after another: gathering every row's state, then scattering the new ones back, makes
# a fresh copy of them each step (XLA:CPU), most of a 32-row decode step of a Qwen3.5-shaped model
# (benchmarks/hybrid_decode.py). Small states go faster batched, and so does Mamba-2's step: in its
# row loop XLA copies the whole state array for every row, so Mamba-2 and LFM2 stay batched.
ROW_BY_ROW_BYTES = 1 << 16


def one_row_at_a_time(op, row_bytes: int) -> bool:
    """Whether decode rows' states of `op` (row_bytes each) are updated one row after another in place, not
    gathered, run together and scattered back: on XLA:CPU only (above). An accelerator's XLA scatters into the
    donated states in place, and a row loop there runs 32 small updates a layer one after another: the v5e ran
    the ~0.5B Qwen3.5-shaped hybrid's 32-row decode at 33% of its roofline with it, its dense twin at 54%
    (docs/tpu.md, 2026-12-07)."""
    return getattr(op, "row_by_row", False) and row_bytes >= ROW_BY_ROW_BYTES and platform() == "cpu"


def _one_by_one(op, inputs, states, slots, positions, snaps=None, restore=None):
    """`_at_slots` for the rows one at a time (a scan): the same results, each state read and
    written where it lives (a dynamic slice and a dynamic update, in place; a gather, a select and
    a scatter of one row each cost a pass over the state). Returns (out, states, None)."""
    def one_row(states, row):
        xs, slot, position, back = row
        start = _f32(jax.lax.dynamic_index_in_dim(states, slot, keepdims=True))  # (1, ...)
        if restore is not None:
            start = jax.lax.cond(back >= 0, lambda: _f32(jax.lax.dynamic_index_in_dim(snaps, back, keepdims=True)),
                                 lambda: start)
        start = jax.lax.cond(position[0] == 0, lambda: jnp.zeros_like(start), lambda: start)
        out, new = op(tuple(a[None] for a in xs), start, (position >= 0)[None])
        return jax.lax.dynamic_update_index_in_dim(states, new.astype(states.dtype), slot, 0), out[0]

    back = jnp.zeros_like(slots) if restore is None else restore
    states, out = jax.lax.scan(one_row, states, (inputs, slots, positions, back))
    return out, states, None


def _run_drafts(op, rows, out, states, drafts, layout):
    """Speculation on a hybrid model: the step's draft rows (`layout.draft_rows`), one after another,
    each from the state its sequence's previous row left (its slot's, for the first draft: the decode
    rows ran first; else a row of `drafts`), its end state into its own row of `drafts`, never the slot
    (verification may reject it; the scheduler restores the accepted one next step). rows (D, 1, ...),
    out (D, 1, ...) -> (out with the draft rows' outputs, drafts)."""
    d, spare = out.shape[0], drafts.shape[0] - 1

    def one_draft(carry, draft):
        out, drafts = carry
        row, slot, start, to = draft
        real = row >= 0
        xs = tuple(jax.lax.dynamic_index_in_dim(a, jnp.maximum(row, 0), keepdims=True) for a in rows)
        state = _f32(jnp.where(start >= 0, drafts[jnp.maximum(start, 0)], states[slot]))[None]
        y, state = op(xs, state, jnp.broadcast_to(real, (1, 1)))
        out = out.at[jnp.where(real, row, d)].set(y[0], mode="drop")
        drafts = drafts.at[jnp.where(real, to, spare)].set(state[0].astype(drafts.dtype))
        return (out, drafts), None

    def run(carry):
        return jax.lax.scan(one_draft, carry, (layout.draft_rows, layout.draft_slots, layout.draft_from,
                                               layout.draft_to))[0]

    # (a step without drafts copies no state)
    return jax.lax.cond(jnp.any(layout.draft_rows >= 0), run, lambda carry: carry, (out, drafts))


def run_packed(op, inputs, states, layout, snaps=None, drafts=None):
    """The engines' packed step (kv/paged.py): inputs (1, N, ...) = D decode tokens, then P chunk rows
    of C tokens; states (S+1, ...) by slot -> (out (1, N, ...), states, snaps, drafts). Chunk rows run
    one after another: a long prompt's consecutive rows in one step carry its state from row to row.
    With `snaps` (R+1, ...), a chunk row may start from a snapshot (`layout.chunk_restore`) and
    leave its end state in one (`layout.chunk_save`; -1 = neither: the spare row takes the write).
    With `drafts` (X+1, ...) (a speculating engine), a decode row may start from a draft state
    (`layout.decode_restore`), and draft rows run after the decode rows (`_run_drafts`)."""
    d, (p, c) = layout.num_decode, layout.chunk_pos.shape
    parts = []
    if d:
        rows = tuple(a[0, :d, None] for a in inputs)  # (D, 1, ...)
        row_bytes = math.prod(states.shape[1:]) * states.dtype.itemsize
        at_slots = _one_by_one if one_row_at_a_time(op, row_bytes) else _at_slots
        restore = None if drafts is None else layout.decode_restore
        fused = None
        if restore is None and getattr(op, "in_place", None) is not None:
            first = layout.decode_pos[:, 0]
            fused = op.in_place(tuple(a[:, 0] for a in rows), states, layout.decode_slots, first == 0, first >= 0)
        if fused is not None:
            out, states = fused[0][:, None], fused[1]
        else:
            out, states, _ = at_slots(op, rows, states, layout.decode_slots, layout.decode_pos, drafts, restore)
        if drafts is not None and layout.draft_rows is not None and layout.draft_rows.shape[0]:
            out, drafts = _run_drafts(op, rows, out, states, drafts, layout)
        parts.append(out[:, 0])
    if p:
        rows = tuple(a[0, d:].reshape(p, c, *a.shape[2:]) for a in inputs)  # (P, C, ...)
        keep = snaps is not None
        none = jnp.full((p,), -1, jnp.int32)
        restore, save = (layout.chunk_restore, layout.chunk_save) if keep else (none, none)

        def one_row(carry, row):
            states, snaps = carry
            xs, slot, positions, back, to = row
            out, states, new = _at_slot(op, tuple(a[None] for a in xs), states, slot, positions[None],
                                        snaps, back if keep else None)
            if keep:
                snaps = put_row(snaps, new, jnp.where(to >= 0, to, snaps.shape[0] - 1))
            return (states, snaps), out[0]

        xs = (rows, layout.chunk_slots, layout.chunk_pos, restore, save)
        if p == 1:  # one row: no loop to compile
            (states, snaps), out = one_row((states, snaps), jax.tree.map(lambda a: a[0], xs))
            out = out[None]
        else:
            (states, snaps), out = jax.lax.scan(one_row, (states, snaps), xs)
        parts.append(out.reshape(p * c, *out.shape[2:]))
    return (jnp.concatenate(parts) if len(parts) > 1 else parts[0])[None], states, snaps, drafts


def run_fresh(op, inputs, shape: tuple[int, ...], valid):
    """Rows (B, T) that start from zero states and keep nothing (passes without a cache)."""
    out, _ = op(inputs, jnp.zeros((inputs[0].shape[0], *shape), jnp.float32), valid)
    return out
