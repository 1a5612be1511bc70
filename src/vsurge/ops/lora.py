"""LoRA adapters beside a projection, several in one step (the S-LoRA / Punica idea, in XLA).

Every adapted projection y = x @ W gains y += (x @ A[id]) @ B[id] for the adapter `id` of each token
(-1: none). The engine holds L adapter slots on the device (lora/stacks.py): for a group of
projections that read the same input (q, k, v; gate, up) one stacked A (K, L, S, R) and one B
(L, R, N_s) per projection s, with the adapter's scaling folded into B and ranks below R
zero-padded. A step multiplies its tokens by every slot's A in one dot, zeroes the columns of the
slots a token does not use, and multiplies by each projection's stacked B in one more dot: two
or S + 1 dots per group however many adapters the step mixes, never one per adapter and never a
merged weight. (The dense form costs L * R columns per token; a gathered one would read each
token's own A/B, which XLA:CPU turns into a copy of them per token.)

The adapter ids reach the model the way the kernel's real rows do: `lora_rows(ids)` while a step's
forward pass is traced (engine/programs.py), ids (N,) for the step's token stream (1, N, K).
Nothing is added outside it (whole-prompt passes, vInference), nor to arrays of other shapes.
PEFT's embedding and output-head adapters work the same way on the model's own stacks: the
embedding's A is read by token (`lora_embedding`: a row per token, not a dot over the vocabulary),
and the head's rows are the step's logit rows (`lora_head_rows(ids)` (R,) around `model.logits`).
"""

from __future__ import annotations

import contextlib
import contextvars

import jax
import jax.numpy as jnp
from flax import nnx

from .linear import mixed_dot

_ROWS: contextvars.ContextVar = contextvars.ContextVar("vsurge_lora_rows", default=None)
_HEAD_ROWS: contextvars.ContextVar = contextvars.ContextVar("vsurge_lora_head_rows", default=None)


class LoraStack(nnx.Variable):
    """Stacked adapter weights of a layer (not a Param: they change while serving, the model's
    weights do not, and they land in the engine's `graphother`)."""


@contextlib.contextmanager
def lora_rows(ids: jax.Array | None):
    """While tracing a step over tokens (1, N): ids (N,) int32, each token's adapter slot (-1: none)."""
    token = _ROWS.set(None if ids is None else ids[None])
    try:
        yield
    finally:
        _ROWS.reset(token)


@contextlib.contextmanager
def lora_head_rows(ids: jax.Array | None):
    """While tracing a step's `model.logits` over rows (R, D): ids (R,) int32, each row's adapter slot."""
    token = _HEAD_ROWS.set(ids)
    try:
        yield
    finally:
        _HEAD_ROWS.reset(token)


def lora_deltas(x: jax.Array, a: jax.Array, bs: tuple[jax.Array, ...], ids=None) -> list[jax.Array] | None:
    """x (1, N, K) the step's tokens; a (K, L, S, R); bs S arrays (L, R, N_s) -> S deltas (1, N, N_s) in
    x's dtype, or None outside a step with adapter ids (or for an x that is not its token stream). A step
    none of whose tokens has an adapter skips the dots (the base model's users pay nothing for them).
    ids: x's rows' slots when not the token stream's (the head's logit rows)."""
    ids = _ROWS.get() if ids is None else ids
    if ids is None or ids.shape != x.shape[:-1]:
        return None
    k, slots, subs, rank = a.shape
    rows = x.reshape(-1, k)
    flat = ids.reshape(-1)

    def deltas(rows):
        xa = mixed_dot(rows, a.reshape(k, -1), 0).reshape(-1, slots, subs, rank)  # (M, L, S, R)
        mine = flat[:, None] == jnp.arange(slots, dtype=flat.dtype)[None, :]  # (M, L): each token's own slot
        xa = jnp.where(mine[:, :, None, None], xa, jnp.zeros((), xa.dtype))
        # (x's dtype: the stacks' may differ, and both branches of the cond must agree)
        return tuple(mixed_dot(xa[:, :, s, :].reshape(-1, slots * rank), b.reshape(slots * rank, -1), 0)
                     .astype(rows.dtype) for s, b in enumerate(bs))

    def none(rows):
        return tuple(jnp.zeros((rows.shape[0], b.shape[-1]), rows.dtype) for b in bs)

    out = jax.lax.cond(jnp.any(flat >= 0), deltas, none, rows)
    return [d.reshape(*x.shape[:-1], -1) for d in out]


def adapted(x: jax.Array, w: dict, site: str, names: tuple[str, ...]) -> list[jax.Array] | None:
    """The deltas of a layer's adapter site (`lora_{site}_a`, `lora_{name}_b` in its weights dict w), or
    None when the layer has no adapter slots or the pass carries no adapter ids."""
    a = w.get(f"lora_{site}_a")
    if a is None:
        return None
    return lora_deltas(x, a, tuple(w[f"lora_{name}_b"] for name in names))


def lora_embedding(input_ids: jax.Array, rows: jax.Array, a: jax.Array, b: jax.Array) -> jax.Array:
    """input_ids (1, N) the step's tokens, rows (1, N, D) their embeddings; a (V, L, 1, R) the slots' A by
    token, b (L, R, D) -> rows plus each token's adapter delta (rows unchanged outside a step with ids)."""
    ids = _ROWS.get()
    if ids is None or ids.shape != input_ids.shape:
        return rows
    vocab, slots, _, rank = a.shape
    tokens, flat = input_ids.reshape(-1), ids.reshape(-1)

    def delta(tokens):
        xa = a.reshape(vocab, slots * rank)[tokens].reshape(-1, slots, rank)  # (M, L, R): each token's A rows
        mine = flat[:, None] == jnp.arange(slots, dtype=flat.dtype)[None, :]
        xa = jnp.where(mine[:, :, None], xa, jnp.zeros((), xa.dtype))
        # (the embeddings' dtype: a float32 model's adapter stacks may be bfloat16, and both branches of
        # the cond must agree: `vsurge serve --enable-lora` on the default model failed to compile)
        return mixed_dot(xa.reshape(-1, slots * rank), b.reshape(slots * rank, -1), 0).astype(rows.dtype)

    def none(tokens):
        return jnp.zeros((tokens.shape[0], b.shape[-1]), rows.dtype)

    out = jax.lax.cond(jnp.any(flat >= 0), delta, none, tokens)
    return rows + out.reshape(rows.shape).astype(rows.dtype)


def head_delta(model, hidden: jax.Array) -> jax.Array | None:
    """The output head's adapter delta (..., V) for hidden (..., D): the logit rows' slots (`lora_head_rows`),
    else the token stream's when hidden is it (a whole-sequence pass); None without head stacks or ids."""
    if not hasattr(model, "lora_head_a"):
        return None
    out = lora_deltas(hidden, model.lora_head_a[...], (model.lora_head_b[...],), _HEAD_ROWS.get())
    return None if out is None else out[0]
