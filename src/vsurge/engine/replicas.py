"""Data and tensor parallelism for the drivers: one engine per replica, each on its own device group.

    vSurge.create_odriver(model, processor, tensor_parallel_size=2, data_parallel_size=2)

puts the weights on a (data=2, model=2) mesh and builds one engine per row of
it: each replica sees its own copy of the weights (views of the shards already
on its devices, no second copy), owns its KV cache, scheduler and thread, and
runs its programs tensor-parallel over its row. One driver routes each request
to the least loaded replica and records each replica's metrics under its own
`replica` label (driver.py).
"""

from __future__ import annotations

import jax

from ..sharding import (make_mesh, mesh_of, place_model, replica_meshes, replica_model,
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
    from ..distributed import agree_min
    from .oengine import pages_that_fit

    return config.replace(num_pages=agree_min(pages_that_fit(model, config)))

