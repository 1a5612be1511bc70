"""Sharded loading: each device reads and receives only its own slice of every weight.

For each weight, the mesh and the weight's logical axes give every local
device an index (a contiguous slice per axis); `WeightReader` builds that slice
from just the checkpoint rows it needs (safetensors through a memory map, GGUF
dequantizing only those rows) and it goes straight to its device. No device
and no host buffer ever holds a whole sharded weight, so a model larger than
one device's memory loads. Slices that several devices share (replicated
weights, or the same shard on every data-parallel replica) are read once.

Weights kept in GGUF blocks (loading/gguf_blocks.py) are replicated: every device holds the whole
block matrix and the kernel multiplies it with the whole input (XLA gathers a sharded input
before the custom call), so tensor parallelism splits only the float weights and attention.
"""

from __future__ import annotations

import jax
from tqdm.auto import tqdm

from ..config import ModelConfig
from ..models.parts.spec import TensorSource
from ..hardware.sharding import named_sharding, replicated
from .gguf_blocks import keep_blocks
from .weights import WeightReader


def _key(index: tuple) -> tuple:
    return tuple((s.start, s.stop, s.step) for s in index)


def load_sharded(family, checkpoint: ModelConfig, config: ModelConfig, source: TensorSource, dtype, fmt: str,
                 mesh, progress: bool = True, blocks: bool = False, stack_dtype=None) -> dict[str, jax.Array]:
    """name -> global jax.Array on `mesh`, built shard by shard. `checkpoint` is the file's config,
    `config` the model's (KV heads replicated for the mesh's tensor-parallel size). blocks: keep
    the weights that can stay in the file's block formats so, replicated; stack_dtype: the expert
    stacks' dtype, where not `dtype`."""
    reader = WeightReader(family, checkpoint, source, dtype, fmt, config, stack_dtype=stack_dtype)
    held = {name: jax.device_put(w, replicated(mesh)) for name, w in (keep_blocks(reader) if blocks else {}).items()}
    shapes = {name: spec.shape for name, spec in reader.specs.items() if name not in held}
    devices = [d for d in mesh.devices.flat if d.process_index == jax.process_index()]
    totals = {d: 0 for d in devices}
    shardings = {name: named_sharding(mesh, reader.specs[name].axes, shape) for name, shape in shapes.items()}
    for name, shape in shapes.items():  # bytes per device, for the bars
        for device, index in shardings[name].addressable_devices_indices_map(shape).items():
            totals[device] += _nbytes(shape, index, reader.np_dtype.itemsize)
    bars = [tqdm(total=totals[d], desc=f"Loading shard {i} ({d.platform}:{d.id})", unit="B", unit_scale=True,
                 position=i, leave=True, disable=not progress) for i, d in enumerate(devices)]
    bar_of = dict(zip(devices, bars))
    out = {}
    try:
        for name, shape in shapes.items():
            sharding = shardings[name]
            slices: dict[tuple, object] = {}
            arrays = []
            for device, index in sharding.addressable_devices_indices_map(shape).items():
                key = _key(index)
                if key not in slices:
                    slices[key] = reader.read(name, index)
                arrays.append(jax.device_put(slices[key], device))
                bar_of[device].update(slices[key].nbytes)
            out[name] = jax.make_array_from_single_device_arrays(shape, sharding, arrays)
    finally:
        for bar in bars:
            bar.close()
    return {**out, **held}


def _nbytes(shape, index, itemsize: int) -> int:
    n = itemsize
    for size, s in zip(shape, index):
        start, stop, _ = s.indices(size)
        n *= stop - start
    return n
