"""The adapter slots on the device: per layer and site, A (K, L, S, R) and per projection B (L, R, N)
(ops/lora.py multiplies them), as `LoraStack` variables of the model's layers (and of the model, for
the embedding and the output head).

`attach` adds them (zeros: no slot adapts anything) before the engine splits the model; `write`
puts one adapter in one slot (ranks below R zero-padded, projections it does not adapt zeroed).

On a tensor-parallel mesh a stack is split like the weight it adapts: a column-split projection
(qkv, gate/up: output heads or units over the devices) keeps A whole and splits B's columns, a
row-split one (o, down: its input split) splits A's rows and keeps B whole, so x @ A is local or
one all-reduce of (tokens, L*S*R) beside the projection's own.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..ops.lora import LoraStack
from .adapter import Adapter
from .layout import adapter_holders, site_weight


def stack_dtype(model):
    """The weights' dtype; for a model held in GGUF blocks (float32 beside them), bfloat16 where the device
    multiplies it natively (devices.default_dtype): half the bytes each step reads, twice the dot rate."""
    from ..hardware.devices import default_dtype

    if model.block_formats() and model.param_dtype == jnp.float32:
        return jnp.dtype(default_dtype())
    return model.param_dtype


def attach(model, slots: int, rank: int, mesh=None) -> None:
    """Give every adaptable site of the model `slots` adapter slots of rank `rank` (in place; on `mesh`
    when the model's weights are split over one)."""
    dtype = stack_dtype(model)
    axes = {"lm_head": ("embed", "vocab"), **model.weight_axes()} if mesh is not None else {}
    for holder, prefix, sites in adapter_holders(model):
        for site, projections in sites.items():
            fan_in_axis, fan_out_axis = axes.get(prefix + site_weight(site), (None, None))
            if site == "embed":  # (the embedding's axes are (vocab, embed): its A is read by token)
                fan_in_axis, fan_out_axis = None, None
            fan_in = projections[0].fan_in
            a = _zeros((fan_in, slots, len(projections), rank), dtype, mesh, (fan_in_axis, None, None, None))
            setattr(holder, f"lora_{site}_a", LoraStack(a))
            for p in projections:
                b = _zeros((slots, rank, p.fan_out), dtype, mesh, (None, None, fan_out_axis))
                setattr(holder, f"lora_{p.name}_b", LoraStack(b))


def _zeros(shape, dtype, mesh, axes):
    """Zeros of `shape`, on `mesh` by the logical `axes` (hardware/sharding.py's rules) when given one."""
    if mesh is None:
        return jnp.zeros(shape, dtype)
    from ..hardware.sharding import named_sharding

    return jax.jit(lambda: jnp.zeros(shape, dtype), out_shardings=named_sharding(mesh, axes, shape))()


def attached(model) -> tuple[int, int] | None:
    """(slots, rank) of the model's adapter stacks, or None without them."""
    for holder in [*model.layers, model]:
        for name, value in vars(holder).items():
            if isinstance(value, LoraStack) and name.endswith("_a"):
                return value[...].shape[1], value[...].shape[3]
    return None


def write(model, slot: int, adapter: Adapter | None) -> None:
    """Put `adapter` in `slot` of every stack (None: clear the slot), in one compiled call."""
    rank = attached(model)[1]
    weights = {} if adapter is None else adapter.weights
    variables, values = [], []  # each stack and its slot's new contents
    for layer, _, sites in adapter_holders(model):
        for site, projections in sites.items():
            a_slot = np.zeros((projections[0].fan_in, len(projections), rank), np.float32)
            for s, p in enumerate(projections):
                b_slot = np.zeros((rank, p.fan_out), np.float32)
                pair = weights.get((p.layer, site, p.name))
                if pair is not None:
                    a, b = pair
                    a_slot[:, s, : a.shape[1]] = a
                    b_slot[: b.shape[0]] = b
                variables.append(getattr(layer, f"lora_{p.name}_b"))
                values.append(b_slot[None])  # (1, R, N): slot axis 0
            variables.append(getattr(layer, f"lora_{site}_a"))
            values.append(a_slot[:, None])  # (K, 1, S, R): slot axis 1
    stacks = [v[...] for v in variables]
    values = [jnp.asarray(x, s.dtype) for x, s in zip(values, stacks)]
    for variable, old, new in zip(variables, stacks, _put_slot(stacks, values, jnp.int32(slot))):
        variable.set_value(jax.device_put(new, old.sharding))  # (the programs were compiled for its sharding)


@jax.jit
def _put_slot(stacks: list, values: list, slot):
    """Each stack with `slot` replaced: B stacks (L, R, N) along axis 0, A stacks (K, L, S, R) along axis 1."""
    out = []
    for stack, value in zip(stacks, values):
        axis = 0 if stack.ndim == 3 else 1
        start = [0] * stack.ndim
        start[axis] = slot
        out.append(jax.lax.dynamic_update_slice(stack, value, start))
    return out
