"""Command-line flags for tensor/data parallelism and multi-host runs (used by cli/).

    vsurge serve --tensor-parallel-size 4                       one host, 4 devices
    vsurge serve --tensor-parallel-size 2 --data-parallel-size 2
    vsurge serve --tensor-parallel-size 8 --coordinator-address 10.0.0.1:8476 \\
                 --num-processes 2 --process-id {0,1}          two hosts (same command on each)
    vsurge serve --tensor-parallel-size 16 --distributed        JAX's cluster auto-detection
    vsurge serve --prefill-devices 0-2 --decode-devices 3-5     disaggregated: prompts on devices 0-2,
                                                                decoding on 3-5 (engine/disaggregated.py)

Process 0 serves HTTP; the others follow its steps (scale/multihost.py).
"""

from __future__ import annotations

import argparse
import os
import sys


def add_parallel_args(p: argparse.ArgumentParser, multihost: bool) -> None:
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=None,
                   help="devices each model replica is split over (heads, MLP, vocabulary, KV cache)")
    p.add_argument("--enable-expert-parallel", action="store_true",
                   help="mixture-of-experts models: put whole experts on each tensor-parallel device instead of "
                        "splitting every expert (vLLM's flag of the same name)")
    if not multihost:
        return
    p.add_argument("--data-parallel-size", "-dp", type=int, default=None,
                   help="independent engine replicas, each on its own group of tensor-parallel-size devices")
    p.add_argument("--coordinator-address", default=None,
                   help="host:port of process 0 for multi-host runs (jax.distributed); every process gets the "
                        "same flags plus its own --process-id")
    p.add_argument("--num-processes", type=int, default=None, help="processes in a multi-host run")
    p.add_argument("--process-id", type=int, default=None, help="this process's rank (0 serves HTTP)")
    p.add_argument("--distributed", action="store_true",
                   help="multi-host with JAX's cluster auto-detection (SLURM, Open MPI, TPU pod slices, ...)")
    p.add_argument("--heartbeat-timeout", type=int, default=10,
                   help="seconds without a heartbeat before a process counts as lost (multi-host)")
    g = p.add_argument_group("disaggregated serving (prompts and decoding on separate devices)")
    g.add_argument("--prefill-devices", default=None, metavar="LIST",
                   help="devices of the prefill engines, e.g. 0-2 or 0,1 (indices of jax.devices())")
    g.add_argument("--decode-devices", default=None, metavar="LIST",
                   help="devices of the decode engines, e.g. 3-5; their tensor-parallel size is "
                        "--tensor-parallel-size, else all of them")
    g.add_argument("--prefill-tensor-parallel-size", type=int, default=None,
                   help="devices per prefill engine (default: all of --prefill-devices)")
    g.add_argument("--transfer-address", default=None, metavar="HOST:PORT",
                   help="multi-host: where the other processes reach this one's KV transfers (default: the "
                        "coordinator's port + 1 + process id, on loopback or this host's address)")


def validate(args) -> None:
    for name in ("tensor_parallel_size", "data_parallel_size", "num_processes", "prefill_tensor_parallel_size"):
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise SystemExit(f"vsurge: error: --{name.replace('_', '-')} must be at least 1")
    prefill, decode = getattr(args, "prefill_devices", None), getattr(args, "decode_devices", None)
    if (prefill is None) != (decode is None):
        raise SystemExit("vsurge: error: --prefill-devices and --decode-devices go together")
    if prefill is None and getattr(args, "prefill_tensor_parallel_size", None) is not None:
        raise SystemExit("vsurge: error: --prefill-tensor-parallel-size needs --prefill-devices and --decode-devices")
    if prefill is not None:
        if getattr(args, "data_parallel_size", None) is not None:
            raise SystemExit("vsurge: error: with --prefill-devices the engines per group come from the group sizes: "
                             "--data-parallel-size cannot be given")
        from .replicas import parse_devices

        try:
            parse_devices(prefill), parse_devices(decode)
        except ValueError as e:
            raise SystemExit(f"vsurge: error: {e}") from None


def disaggregated(args) -> bool:
    return getattr(args, "prefill_devices", None) is not None


def disaggregated_kwargs(args) -> dict:
    """create_vdriver/create_odriver's arguments for --prefill-devices / --decode-devices."""
    return {"prefill_devices": args.prefill_devices, "decode_devices": args.decode_devices,
            "prefill_tensor_parallel_size": args.prefill_tensor_parallel_size,
            "tensor_parallel_size": args.tensor_parallel_size}


def init_distributed(args) -> bool:
    """jax.distributed for a multi-host run, before anything else touches JAX. True if it runs."""
    from . import distributed

    if not distributed.requested(args.coordinator_address, args.num_processes, args.process_id, args.distributed):
        return False
    try:
        transfer = None
        if disaggregated(args):  # prefixes move between processes' devices
            transfer = args.transfer_address or distributed.default_transfer_address(args.coordinator_address,
                                                                                     args.process_id)
        distributed.initialize(args.coordinator_address, args.num_processes, args.process_id,
                               heartbeat_timeout_seconds=args.heartbeat_timeout, transfer_address=transfer)
    except Exception as e:  # noqa: BLE001: bad flags, an unreachable coordinator
        raise SystemExit(f"vsurge: error: jax.distributed could not start: {e}") from None
    return True


def load_kwargs(args) -> dict:
    """vsurge.load's parallelism arguments (all of jax.devices() by default in a multi-host run)."""
    import jax

    if disaggregated(args):  # loaded onto the prefill group (scale/replicas.py), then copied to the decode group
        from .replicas import group_mesh

        if jax.process_count() > 1:  # each process loads onto its own engines' devices (scale/remote.py)
            from .remote import local_mesh

            return {"mesh": local_mesh(args.prefill_devices, args.decode_devices, args.prefill_tensor_parallel_size,
                                       args.tensor_parallel_size)}
        return {"mesh": group_mesh(args.prefill_devices, args.prefill_tensor_parallel_size)}
    tp, dp = args.tensor_parallel_size, getattr(args, "data_parallel_size", None)
    if jax.process_count() > 1 and tp is None and dp is None:
        tp = jax.device_count()
    return {k: v for k, v in (("tensor_parallel_size", tp), ("data_parallel_size", dp)) if v is not None}


def is_follower() -> bool:
    import jax

    return jax.process_index() != 0


def follow(surge) -> int:
    """A follower process: run the leader's steps until it stops. Exit status 0 after a clean stop."""
    import jax

    if getattr(surge.driver, "multihost_disaggregated", False):
        from .remote import follow as run
    else:
        from .multihost import follow as run

    print(f"vsurge: process {jax.process_index()} follows process 0", file=sys.stderr, flush=True)
    try:
        run(surge)
    except Exception as e:  # noqa: BLE001: the leader is gone or the engines differ
        print(f"vsurge: follower stopped: {e}", file=sys.stderr, flush=True)
        os._exit(1)  # an engine thread may still wait in a collective: do not wait for it
    return 0


def exit_after_serving(surge) -> None:
    """A leader that lost a follower cannot finish its stuck collectives: exit without waiting."""
    leader = getattr(surge, "_multihost_leader", None)
    if leader is not None and leader.lost:
        failure = sys.exc_info()[1]  # (called from a finally: the error that ended the server, if any)
        if isinstance(failure, SystemExit) and isinstance(failure.code, str):
            print(failure.code, file=sys.stderr)  # what the interpreter would print on its way out
        elif failure is not None and not isinstance(failure, SystemExit):
            print(f"vsurge: error: {failure}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(1)
