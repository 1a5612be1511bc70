"""The adapter slots on the device: per layer and site, A (K, L, S, R) and per projection B (L, R, N)
(ops/lora.py multiplies them), as `LoraStack` variables of the model's layers.

`attach` adds them (zeros: no slot adapts anything) before the engine splits the model; `write`
puts one adapter in one slot (ranks below R zero-padded, projections it does not adapt zeroed).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ..ops.lora import LoraStack
from .adapter import Adapter
from .layout import model_projections


def stack_dtype(model):
    """The weights' dtype; for a model held in GGUF blocks (float32 beside them), bfloat16 where the device
    multiplies it natively (devices.default_dtype): half the bytes each step reads, twice the dot rate."""
    from ..devices import default_dtype

    if model.block_formats() and model.param_dtype == jnp.float32:
        return jnp.dtype(default_dtype())
    return model.param_dtype


def attach(model, slots: int, rank: int) -> None:
    """Give every adaptable site of the model `slots` adapter slots of rank `rank` (in place)."""
    dtype = stack_dtype(model)
    for layer, sites in zip(model.layers, model_projections(model)):
        for site, projections in sites.items():
            fan_in = projections[0].fan_in
            setattr(layer, f"lora_{site}_a", LoraStack(jnp.zeros((fan_in, slots, len(projections), rank), dtype)))
            for p in projections:
                setattr(layer, f"lora_{p.name}_b", LoraStack(jnp.zeros((slots, rank, p.fan_out), dtype)))


def attached(model) -> tuple[int, int] | None:
    """(slots, rank) of the model's adapter stacks, or None without them."""
    for layer in model.layers:
        for name, value in vars(layer).items():
            if isinstance(value, LoraStack) and name.endswith("_a"):
                return value[...].shape[1], value[...].shape[3]
    return None


def write(model, slot: int, adapter: Adapter | None) -> None:
    """Put `adapter` in `slot` of every stack (None: clear the slot)."""
    rank = attached(model)[1]
    weights = {} if adapter is None else adapter.weights
    for i, (layer, sites) in enumerate(zip(model.layers, model_projections(model))):
        for site, projections in sites.items():
            a_var = getattr(layer, f"lora_{site}_a")
            a_slot = np.zeros((projections[0].fan_in, len(projections), rank), np.float32)
            for s, p in enumerate(projections):
                b_var = getattr(layer, f"lora_{p.name}_b")
                b_slot = np.zeros((rank, p.fan_out), np.float32)
                pair = weights.get((i, site, p.name))
                if pair is not None:
                    a, b = pair
                    a_slot[:, s, : a.shape[1]] = a
                    b_slot[: b.shape[0]] = b
                b_var.set_value(b_var[...].at[slot].set(jnp.asarray(b_slot, b_var[...].dtype)))
            a_var.set_value(a_var[...].at[:, slot].set(jnp.asarray(a_slot, a_var[...].dtype)))
