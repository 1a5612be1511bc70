"""Meshes and logical axes: where every weight and KV-cache array lives.

Arrays name their axes logically (each family's weight declarations, models/parts/spec.py;
the caches' `K_AXES`/`V_AXES` in kv/); `RULES` maps each name onto a mesh axis, every other
name is replicated. The same model code then runs on one device, a
tensor-parallel mesh or a (data, model) mesh: jit receives the shardings of its
inputs and XLA's SPMD partitioner splits the program and inserts the
collectives (per layer, one all-reduce after `wo` and one after `w_down`; the
vocabulary-parallel embedding and output head add one each per step).

Mesh axes:
    data    data-parallel replicas: each index is one engine replica (its own
            weights and KV cache, its own scheduler thread); `replica_meshes`
    model   tensor parallelism inside a replica: query heads, KV heads (fused qkv
            columns and the KV cache), MLP units, the vocabulary and (expert
            parallelism) whole experts split over it

A dimension that the mesh axis does not divide evenly stays replicated (the
vocabulary of an odd-sized tokenizer); heads and MLP units must divide
(`tensor_parallel_config` says why not).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

DATA, MODEL = "data", "model"

# logical axis name -> mesh axis (names not listed are replicated)
RULES: dict[str, str] = {
    "vocab": MODEL,  # vocabulary-parallel embedding rows and output-head columns
    "heads": MODEL,  # query heads: rows of wo
    "kv_heads": MODEL,  # KV groups: fused qkv columns, the KV cache's head axis
    "mlp": MODEL,  # MLP units: interleaved gate/up columns, rows of w_down (and of every expert)
    "experts": MODEL,  # whole experts (expert parallelism: a family names this axis instead of "mlp")
    "batch": DATA,  # rows of a batch's inputs (vInference's input_partition_spec)
}


def partition_spec(axes, mesh: Mesh | None = None, shape=None, rules: dict | None = None) -> PartitionSpec:
    """Logical axis names -> PartitionSpec. Mesh axes the mesh lacks, or that do not divide the
    dimension (`shape` given), are dropped (replicated); a mesh axis is used once at most."""
    rules = RULES if rules is None else rules
    out, used = [], set()
    for i, name in enumerate(axes):
        target = rules.get(name)
        if target is not None and mesh is not None:
            if target not in mesh.shape or (shape is not None and shape[i] % mesh.shape[target]):
                target = None
        if target in used:
            target = None
        used.add(target)
        out.append(target)
    return PartitionSpec(*out)


def named_sharding(mesh: Mesh, axes, shape=None) -> NamedSharding:
    return NamedSharding(mesh, partition_spec(axes, mesh, shape))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def constrain(x, axes):
    """Inside a program traced under `jax.set_mesh(mesh)` (the engines compile that way): pin `x`'s
    sharding to its logical axes; elsewhere (one device, no mesh) return x unchanged."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    return jax.lax.with_sharding_constraint(x, partition_spec(axes, mesh, x.shape))


# ------------------------------------------------------------------ meshes
def _device_grid(devices: list, data: int, model: int) -> np.ndarray:
    """(data, model) devices. With several processes every replica row takes an equal share of
    every process's devices: the leader process then takes part in every replica's programs."""
    processes = sorted({d.process_index for d in devices})
    if len(processes) == 1:
        return np.asarray(devices, dtype=object).reshape(data, model)
    if model % len(processes):
        raise ValueError(f"with {len(processes)} processes the tensor-parallel size ({model}) must be a "
                         f"multiple of the process count: every replica spans every process")
    share = model // len(processes)
    by_process = [[d for d in devices if d.process_index == p] for p in processes]
    rows = [[d for local in by_process for d in local[r * share:(r + 1) * share]] for r in range(data)]
    return np.asarray(rows, dtype=object)


def make_mesh(tensor_parallel_size: int = 1, data_parallel_size: int = 1, devices=None) -> Mesh:
    """A (data, model) mesh of data_parallel_size x tensor_parallel_size devices (the first ones
    of `devices`, default all of jax.devices(); with several processes, all of them)."""
    tp, dp = int(tensor_parallel_size), int(data_parallel_size)
    if tp < 1 or dp < 1:
        raise ValueError(f"tensor_parallel_size and data_parallel_size must be positive, got {tp} and {dp}")
    devices = list(jax.devices() if devices is None else devices)
    if tp * dp > len(devices):
        raise ValueError(f"tensor_parallel_size {tp} x data_parallel_size {dp} needs {tp * dp} devices, "
                         f"but {len(devices)} are visible ({devices[0].platform}); on CPU, set "
                         f"XLA_FLAGS=--xla_force_host_platform_device_count=N before JAX starts")
    if len({d.process_index for d in devices}) > 1 and tp * dp != len(devices):
        raise ValueError(f"with several processes the mesh must use every device: {tp} x {dp} != "
                         f"{len(devices)} devices")
    grid = _device_grid(devices[:tp * dp], dp, tp)
    return Mesh(grid, (DATA, MODEL), axis_types=(AxisType.Auto, AxisType.Auto))


def replica_meshes(mesh: Mesh) -> list[Mesh]:
    """One (1, model) mesh per index of the data axis: the device group of each replica."""
    if DATA not in mesh.shape:
        return [mesh]
    axis = mesh.axis_names.index(DATA)
    return [Mesh(np.take(mesh.devices, [r], axis=axis), mesh.axis_names, axis_types=mesh.axis_types)
            for r in range(mesh.shape[DATA])]


def mesh_of(model) -> Mesh | None:
    """The mesh the model's weights live on; None for a model on one default device."""
    sharding = getattr(model.embed[...], "sharding", None)
    return sharding.mesh if isinstance(sharding, NamedSharding) else None


def tensor_parallel_size(mesh: Mesh | None) -> int:
    return 1 if mesh is None else int(mesh.shape.get(MODEL, 1))


# ------------------------------------------------------------------ the model on a mesh
def tensor_parallel_config(config, tp: int):
    """The model config to run at tensor-parallel size tp (each family's `for_tensor_parallel`)."""
    return config.for_tensor_parallel(tp)


def place_model(model, mesh: Mesh):
    """A copy of an in-memory model with every weight placed on `mesh` by its logical axes (KV heads
    replicated first when the tensor-parallel size needs it). For models larger than one device,
    load them sharded instead: vsurge.load(..., mesh=...)."""
    from flax import nnx

    config = tensor_parallel_config(model.config, tensor_parallel_size(mesh))
    axes = model.weight_axes()
    grouped = model.kv_group_weights()
    copy = nnx.merge(*nnx.split(model), copy=True)
    copy.config = config
    for name, value in model.named_weights().items():
        if name in grouped:
            value = model.replicate_kv_groups(name.removesuffix("_scale"), value, config)
        _holder_param(copy, name).set_value(jax.device_put(value, named_sharding(mesh, axes[name], value.shape)))
    return copy


def replica_model(model, mesh: Mesh):
    """The model's weights seen on a sub-mesh (one replica's devices) without copying: each array
    is rebuilt from the shards it already has on those devices."""
    from flax import nnx

    devices = set(mesh.devices.flat)

    def on_mesh(array):
        shards = [s.data for s in array.addressable_shards if s.device in devices]
        sharding = NamedSharding(mesh, array.sharding.spec)
        return jax.make_array_from_single_device_arrays(array.shape, sharding, shards)

    copy = nnx.merge(*nnx.split(model), copy=True)
    for name, value in model.named_weights().items():  # a GGUF block weight is a pytree of arrays
        _holder_param(copy, name).set_value(jax.tree.map(on_mesh, value))
    return copy


def _holder_param(model, name: str):
    holder = model
    *parents, leaf = name.split(".")
    for p in parents:
        holder = holder[int(p)] if p.isdigit() else getattr(holder, p)
    return getattr(holder, leaf)


# ------------------------------------------------------------------ KV caches and engine state
def _is_cache(x) -> bool:
    return hasattr(type(x), "K_AXES")


def state_shardings(state, mesh: Mesh):
    """Shardings for any pytree holding KV caches (an engine state, a dense cache): each cache's
    keys and values split over their KV heads, every other leaf replicated."""
    def one(x):
        if _is_cache(x):
            axes = [x.layer_axes(i) if hasattr(x, "layer_axes") else (type(x).K_AXES, type(x).V_AXES)
                    for i in range(len(x.k))]
            k = [named_sharding(mesh, a[0], pool.shape) for a, pool in zip(axes, x.k)]
            v = [named_sharding(mesh, a[1], pool.shape) for a, pool in zip(axes, x.v)]
            rest = jax.tree.map(lambda _: replicated(mesh), dataclasses.replace(x, k=[], v=[]))
            return dataclasses.replace(rest, k=k, v=v)
        return replicated(mesh)

    return jax.tree.map(one, state, is_leaf=_is_cache)


def place_state(state, mesh: Mesh | None):
    """Put a state (or cache) on `mesh` by `state_shardings`; unchanged without a mesh."""
    return state if mesh is None else jax.device_put(state, state_shardings(state, mesh))


def create_state(make, mesh: Mesh | None):
    """Run `make()` (a function building a state or cache of zeros) straight into its shardings
    on `mesh`: no device ever holds the whole state. Without a mesh, just `make()`."""
    if mesh is None:
        return make()
    return jax.jit(make, out_shardings=state_shardings(jax.eval_shape(make), mesh))()


def row_shardings(batch, mesh: Mesh, spec: PartitionSpec | None):
    """Shardings of a step's host inputs: replicated, or with `spec` (vInference's
    input_partition_spec) the leading (row) axis of every input split over the mesh axes of
    spec[0], where they divide it evenly."""
    rows = None if spec is None or len(spec) == 0 else spec[0]
    names = () if rows is None else (rows if isinstance(rows, tuple) else (rows,))
    size = math.prod(mesh.shape[n] for n in names)

    def one(x):
        if names and x.ndim and x.shape[0] % size == 0:
            return NamedSharding(mesh, PartitionSpec(rows))
        return replicated(mesh)

    return jax.tree.map(one, batch)


def check_input_partition_spec(spec, mesh: Mesh | None) -> None:
    """A PartitionSpec naming only axes of `mesh` (vInference's input_partition_spec)."""
    if spec is None or mesh is None:
        return
    names = [n for entry in spec if entry is not None for n in (entry if isinstance(entry, tuple) else (entry,))]
    unknown = [n for n in names if n not in mesh.shape]
    if unknown:
        raise ValueError(f"input_partition_spec {spec} names mesh axes {unknown} that the model's mesh "
                         f"{dict(mesh.shape)} does not have")


def kv_page_shards(model) -> int:
    """Into how many device memories one KV page is split: the tensor-parallel size on
    accelerators; 1 on CPU, where every (virtual) device shares the host's memory."""
    mesh = mesh_of(model)
    if mesh is None or mesh.devices.flat[0].platform == "cpu":
        return 1
    return tensor_parallel_size(mesh)


def per_device_bytes(arrays) -> dict:
    """device -> bytes of the given arrays' shards held there."""
    out: dict = {}
    for a in jax.tree.leaves(arrays):
        for shard in a.addressable_shards:
            out[shard.device] = out.get(shard.device, 0) + shard.data.nbytes
    return out
