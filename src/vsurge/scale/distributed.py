"""The multi-process runtime: jax.distributed set up from flags or the environment.

Every process of a multi-host job calls `initialize` before anything else
touches JAX; then `jax.devices()` lists every process's devices and one mesh
spans them all. vsurge sets three things first:

  * jax_enable_recoverability: the coordination service must not kill the
    leader when a follower dies; the leader fails its requests and answers 503
    instead (scale/multihost.py);
  * jax_enable_preemption_service off: it takes SIGTERM, which the server uses
    to drain;
  * on CPU, cross-process collectives over gloo (jax_cpu_collectives_implementation);
  * for disaggregated serving across processes (scale/remote.py), JAX's transfer
    server at `transfer_address` (jax_cross_host_transfer_socket_address): it
    carries jax.device_put of a prefix from one process's devices to another's.

The coordination service (run by process 0) also carries vsurge's per-step
messages and its view of which processes are alive (`client`, `live_processes`).
"""

from __future__ import annotations

import logging
import os

import numpy as np

log = logging.getLogger(__name__)

DEFAULT_HEARTBEAT_TIMEOUT = 10  # seconds without a heartbeat before a process counts as lost
heartbeat_timeout = DEFAULT_HEARTBEAT_TIMEOUT  # this job's, once initialized


def requested(coordinator_address=None, num_processes=None, process_id=None, auto: bool = False) -> bool:
    """Whether a multi-process run was asked for (flags, JAX_COORDINATOR_ADDRESS, or `auto`)."""
    given = (coordinator_address, num_processes, process_id)
    return auto or any(v is not None for v in given) or bool(os.environ.get("JAX_COORDINATOR_ADDRESS"))


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, heartbeat_timeout_seconds: int = DEFAULT_HEARTBEAT_TIMEOUT,
               initialization_timeout: int = 300, transfer_address: str | None = None) -> None:
    """jax.distributed.initialize with vsurge's settings. Unset arguments come from JAX's own
    cluster detection (JAX_COORDINATOR_ADDRESS, SLURM, Open MPI, TPU pod slices, GKE, ...)."""
    import jax

    global heartbeat_timeout
    heartbeat_timeout = int(heartbeat_timeout_seconds)
    jax.config.update("jax_enable_recoverability", True)
    jax.config.update("jax_enable_preemption_service", False)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if transfer_address:  # before the backend starts: its client is made with the transfer server
        jax.config.update("jax_cross_host_transfer_socket_address", transfer_address)
    jax.distributed.initialize(coordinator_address, num_processes, process_id,
                               heartbeat_timeout_seconds=int(heartbeat_timeout_seconds),
                               initialization_timeout=int(initialization_timeout))
    log.info("process %d of %d: %d local devices, %d in all", jax.process_index(), jax.process_count(),
             jax.local_device_count(), jax.device_count())


def is_multiprocess() -> bool:
    import jax

    return jax.process_count() > 1


def client():
    """The coordination-service client of this process (key-value store, barriers, liveness)."""
    from jax._src.distributed import global_state

    if global_state.client is None:
        raise RuntimeError("jax.distributed is not initialized (vsurge.scale.distributed.initialize)")
    return global_state.client


def live_processes() -> set[int]:
    """Processes the coordination service has heard a heartbeat from lately."""
    import jax

    return set(client().get_live_nodes(list(range(jax.process_count()))))


def agree_min(value: int) -> int:
    """The smallest `value` over every process (every process must call this at the same point)."""
    from jax.experimental import multihost_utils

    return int(np.min(multihost_utils.process_allgather(np.asarray(value, np.int64))))


def default_transfer_address(coordinator_address: str | None, process_id: int | None) -> str:
    """This process's transfer-server address when none is given: on the coordinator's host (a
    loopback job) or this host's name, at the coordinator's port + 1 + the process id."""
    import socket

    if not coordinator_address or process_id is None:
        raise ValueError("disaggregated serving across processes needs --transfer-address HOST:PORT (where the "
                         "other processes reach this one) when the coordinator or the process id is detected")
    host, _, port = coordinator_address.rpartition(":")
    if host not in ("127.0.0.1", "localhost", "::1", "[::1]"):
        host = socket.gethostbyname(socket.gethostname())
    return f"{host}:{int(port) + 1 + int(process_id)}"
