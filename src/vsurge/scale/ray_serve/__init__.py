"""vsurge replicas on Ray Serve (issue 62): many `vsurge serve` engines behind one endpoint.

    launch.py     `vsurge serve --ray [--replicas N]`: a local Ray cluster (or --ray-address), the app, HTTP
    app.py        the Serve application: `build_app` (also for `serve run` and Serve config files)
    replica.py    one deployment replica: `vsurge serve`'s own server (cli.serve_build.build_server), its
                  FastAPI app called in-process, routing stats (queue length, prefix hits, recent prefixes)
    ingress.py    the HTTP ingress: every route forwarded to a replica through a Serve handle, streaming
                  included; a replica lost before anything was sent is retried elsewhere
    router.py     prefix-aware routing through Ray Serve's request-router API (`RequestRouter`)
    prefixes.py   the prompt text of a request body, its chained block hashes, a replica's recent ones
    asgi_call.py  one HTTP request through an ASGI app without a socket

Ray is an optional extra (`pip install 'vsurge[ray]'`): nothing here imports it at module level except the
modules that need it (app, launch, replica, ingress, router), and this file never imports them.
"""

from __future__ import annotations

RAY_MISSING = ("--ray needs Ray Serve, which is not installed: pip install 'vsurge[ray]' "
               "(or pip install 'ray[serve]')")


def require_ray() -> None:
    """A clear error instead of an ImportError deep in a stack."""
    try:
        import ray  # noqa: F401
        from ray import serve  # noqa: F401
    except ImportError:
        raise SystemExit(f"vsurge: error: {RAY_MISSING}") from None


# `vsurge serve` flags a replica cannot take yet: each replica is one process serving HTTP through Serve
NOT_WITH_RAY = {"uds": "--uds", "ssl_certfile": "--ssl-certfile", "ssl_keyfile": "--ssl-keyfile",
                "coordinator_address": "--coordinator-address", "num_processes": "--num-processes",
                "distributed": "--distributed", "prefill_devices": "--prefill-devices"}


def unsupported_flags(args) -> list[str]:
    return [flag for name, flag in NOT_WITH_RAY.items() if getattr(args, name, None)]


def add_ray_args(p) -> None:
    g = p.add_argument_group("Ray Serve (replicas on a Ray cluster: docs/scaling.md#ray-serve)")
    g.add_argument("--ray", action="store_true",
                   help="serve through Ray Serve: --replicas copies of this server behind one HTTP endpoint, "
                        "requests routed by shared prompt prefix, then by load")
    g.add_argument("--replicas", type=int, default=1, help="with --ray: how many replicas (default 1)")
    g.add_argument("--min-replicas", type=int, default=None,
                   help="with --ray: autoscale between --min-replicas and --max-replicas on vsurge's load (the "
                        "requests each replica holds against its slots, waiting requests and KV use) instead of "
                        "a fixed --replicas; a replica scaled down finishes its requests first")
    g.add_argument("--max-replicas", type=int, default=None, help="with --ray: see --min-replicas")
    g.add_argument("--ray-address", default=None,
                   help="with --ray: the cluster to join (default: start a local one)")
    g.add_argument("--replica-cpus", type=float, default=1.0,
                   help="with --ray: CPUs Ray reserves per replica (default 1)")
    g.add_argument("--replica-hosts", type=int, default=1,
                   help="with --ray: hosts each replica spans (default 1): one process per host, joined by "
                        "jax.distributed into one mesh (the multi-host mode), each host reserving --replica-cpus "
                        "and --replica-tpus, on distinct nodes")
    g.add_argument("--replica-tpus", type=int, default=0,
                   help="with --ray: TPU chips Ray reserves per replica (its \"TPU\" resource; default 0: none), "
                        "e.g. 4 for a v5e 2x2 host with --tensor-parallel-size 4")
