"""Data and tensor parallelism for the drivers: one engine per replica, each on its own device group.

    vSurge.create_odriver(model, processor, tensor_parallel_size=2, data_parallel_size=2)

puts the weights on a (data=2, model=2) mesh and builds one engine per row of
it: each replica sees its own copy of the weights (views of the shards already
on its devices, no second copy), owns its KV cache, scheduler and thread, and
runs its programs tensor-parallel over its row. One driver routes each request
to the least loaded replica and records each replica's metrics under its own
`replica` label (driver.py).

Disaggregated serving puts prefill and decode engines on two device groups:

    vSurge.create_odriver(model, processor, prefill_devices="0-2", decode_devices="3-5")

each group holds its own copy of the weights (`group_models`).
"""

from __future__ import annotations

import jax

from ..hardware.sharding import (make_mesh, mesh_of, place_model, replica_meshes, replica_model,
                        tensor_parallel_size as tp_of)


def target_mesh(model, tensor_parallel_size: int | None = None, data_parallel_size: int | None = None,
                mesh=None):
    """The mesh the engines run on: `mesh`, else one of the asked sizes (reusing the weights' own
    mesh when it has them), else the weights' mesh (None: the default device)."""
    current = mesh_of(model)
    if mesh is not None or (tensor_parallel_size is None and data_parallel_size is None):
        return mesh if mesh is not None else current
    tp = tensor_parallel_size or tp_of(current)
    dp = data_parallel_size or 1
    if current is not None and dict(current.shape) == {"data": dp, "model": tp}:
        return current
    return make_mesh(tp, dp)


def replica_models(model, tensor_parallel_size: int | None = None, data_parallel_size: int | None = None,
                   mesh=None) -> list:
    """One model per data-parallel replica, each with its weights on its own device group."""
    mesh = target_mesh(model, tensor_parallel_size, data_parallel_size, mesh)
    if mesh is None:
        return [model]
    if mesh_of(model) != mesh:
        model = place_model(model, mesh)
    meshes = replica_meshes(mesh)
    return [model] if len(meshes) == 1 else [replica_model(model, m) for m in meshes]


def agreed_num_pages(model, config):
    """With several processes every process must compile the same programs: the paged pool is
    the smallest that every process's free memory allows."""
    if config.num_pages is not None or jax.process_count() == 1:
        return config
    from ..engine.pools import pages_that_fit
    from .distributed import agree_min

    return config.replace(num_pages=agree_min(pages_that_fit(model, config)))



# ------------------------------------------------------------------ disaggregated serving: two device groups
def parse_devices(spec) -> list[int]:
    """Device indices (of jax.devices()) from "0-2", "0,2,4", "0-1,4", an int, or a list/range of ints."""
    if isinstance(spec, int):
        return [spec]
    if isinstance(spec, str):
        out: list[int] = []
        for part in spec.split(","):
            part = part.strip()
            if not part:
                continue
            first, _, last = part.partition("-")
            if not first.isdigit() or (last and not last.isdigit()):
                raise ValueError(f"device list {spec!r}: expected indices and ranges such as 0-2 or 0,2,4")
            out += list(range(int(first), int(last or first) + 1))
        spec = out
    indices = [int(i) for i in spec]
    if not indices:
        raise ValueError("a device group needs at least one device")
    if len(set(indices)) != len(indices):
        raise ValueError(f"device list {indices} names a device twice")
    return indices


def group_mesh(devices, tensor_parallel_size: int | None = None):
    """The (data, model) mesh of a device group: replicas of `tensor_parallel_size` devices (default:
    the whole group is one tensor-parallel engine)."""
    indices = parse_devices(devices)
    visible = jax.devices()
    if max(indices) >= len(visible):
        raise ValueError(f"device {max(indices)} does not exist: {len(visible)} devices are visible "
                         f"({visible[0].platform}); on CPU set XLA_FLAGS=--xla_force_host_platform_device_count=N")
    tp = tensor_parallel_size or len(indices)
    if len(indices) % tp:
        raise ValueError(f"a group of {len(indices)} devices cannot be split into engines of {tp} devices")
    return make_mesh(tp, len(indices) // tp, devices=[visible[i] for i in indices])


def group_models(model, devices, tensor_parallel_size: int | None = None) -> list:
    """One model per engine of a device group (its weights copied there unless already placed so)."""
    return replica_models(model, mesh=group_mesh(devices, tensor_parallel_size))


def disaggregated_models(model, prefill_devices, decode_devices, prefill_tensor_parallel_size=None,
                         tensor_parallel_size=None) -> tuple[list, list]:
    """(prefill models, decode models) on two disjoint device groups."""
    if (prefill_devices is None) != (decode_devices is None):
        raise ValueError("disaggregated serving needs both prefill_devices and decode_devices")
    overlap = set(parse_devices(prefill_devices)) & set(parse_devices(decode_devices))
    if overlap:
        raise ValueError(f"prefill and decode device groups must not overlap: both hold devices {sorted(overlap)}")
    return (group_models(model, prefill_devices, prefill_tensor_parallel_size),
            group_models(model, decode_devices, tensor_parallel_size))
