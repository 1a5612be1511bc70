"""How the multi-host leader should ship each step's host inputs to the followers.

Two processes on loopback (1 CPU device each, gloo collectives) send the host inputs
of a 32-row decode step of the default model (bucket key, tokens, page tables, slots,
sampling arrays, the 32 x 1536-word bitmask) from process 0 to process 1, two ways:

  kv-store   jax.distributed's coordination service: the leader sets one key per step
             (scale/multihost.py's encoding: arrays of one repeated value travel as
             that value), the follower waits on it; the leader never waits
  broadcast  jax.experimental.multihost_utils.broadcast_one_to_all: a fixed header
             (which program, so the follower knows the shapes) then the arrays, each a
             cross-process psum program that both processes block in

    python benchmarks/multihost_transport.py            # prints one row per transport
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

STEPS = int(os.environ.get("VSURGE_TRANSPORT_STEPS", "200"))


def worker(rank: int, port: int) -> None:
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    from vsurge.scale import distributed
    from vsurge.engine.batch import BatchBuilder
    from vsurge.scale.multihost import StepChannel, encode

    distributed.initialize(f"127.0.0.1:{port}", 2, rank)
    batches = BatchBuilder(49152, 1024, 128, 32, 16)
    rng = np.random.default_rng(0)  # real rows: tokens, positions, tables differ; the bitmask allows all
    leaves = [rng.integers(0, 1000, np.shape(x)).astype(np.asarray(x).dtype)
              if np.ndim(x) and np.shape(x)[1:] != (batches.words,) else x
              for x in jax.tree.leaves(batches.decode_spec(32, 4))]
    key = ("decode", 32, 4)
    payload = len(encode(key, leaves))
    raw = sum(np.asarray(x).nbytes for x in leaves)

    channel = StepChannel("vsurge/bench")
    for _ in range(3):  # warm-up: the broadcast compiles its psum programs
        if rank == 0:
            channel.send(key, leaves)
        else:
            channel.receive()
        multihost_utils.broadcast_one_to_all(np.zeros(4, np.int32))
        multihost_utils.broadcast_one_to_all(leaves)
    multihost_utils.sync_global_devices("start")
    start = time.perf_counter()
    for _ in range(STEPS):
        if rank == 0:
            channel.send(key, leaves)
        else:
            channel.receive()
    multihost_utils.sync_global_devices("kv done")
    kv = (time.perf_counter() - start) / STEPS

    header = np.zeros(4, np.int32)
    start = time.perf_counter()
    for _ in range(STEPS):
        multihost_utils.broadcast_one_to_all(header)
        multihost_utils.broadcast_one_to_all(leaves)
    multihost_utils.sync_global_devices("broadcast done")
    broadcast = (time.perf_counter() - start) / STEPS
    if rank == 0:
        print(f"| transport | ms per step | bytes sent |\n|---|---|---|\n"
              f"| kv-store (one key per step) | {kv * 1e3:.2f} | {payload} |\n"
              f"| broadcast_one_to_all (header + arrays) | {broadcast * 1e3:.2f} | {raw} |", flush=True)


def main() -> None:
    if len(sys.argv) == 3:
        worker(int(sys.argv[1]), int(sys.argv[2]))
        return
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, __file__, str(rank), str(port)]) for rank in (1, 0)]
    sys.exit(max(p.wait() for p in procs))


if __name__ == "__main__":
    main()
