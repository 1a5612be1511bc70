"""An engine's LoRA adapters: its device slots set up before the model is split (`enable`), and the
slot writes the scheduler queued copied to the device before a step (`apply_writes`)."""

from __future__ import annotations

from flax import nnx

from . import stacks
from .adapter import check_servable
from .slots import AdapterSlots


def enable(model, config) -> AdapterSlots | None:
    """With config.max_loras > 0: attach that many slots of rank config.max_lora_rank to `model` (in
    place; on its mesh, split like the projections they adapt) and return their bookkeeping; None
    otherwise. Raises where adapters cannot be served."""
    if not config.max_loras:
        return None
    check_servable(model)
    from ..hardware.sharding import mesh_of

    if config.role != "both":
        raise ValueError("LoRA adapters are not served by disaggregated prefill/decode engines yet")
    stacks.attach(model, config.max_loras, config.max_lora_rank, mesh_of(model))
    stacks.write(model, 0, None)  # the slot writes' ops compile now, not in the first adapter request's step
    return AdapterSlots(config.max_loras)


def apply_writes(engine) -> None:
    """Copy the adapters the scheduler placed in slots since the last step to the device, and refresh
    the engine's split of the model (the stacks are in `graphother`; the weights are untouched)."""
    writes = engine.adapters.take_writes()
    if not writes:
        return
    for slot, adapter in writes:
        stacks.write(engine.model, slot, adapter)
    _, _, engine.graphother = nnx.split(engine.model, nnx.Param, ...)
