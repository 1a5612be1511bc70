"""`vsurge serve --ray`: the Serve application (app.py) on a Ray cluster, HTTP on --host/--port, until
SIGINT/SIGTERM."""

from __future__ import annotations

import signal
import sys
import threading

from . import require_ray, unsupported_flags

# Flags of a single server that a Ray deployment does not take (yet): named in the error, not ignored.
def serve_on_ray(args) -> int:
    require_ray()
    if args.replicas < 1:
        raise SystemExit(f"vsurge: error: --replicas must be at least 1, got {args.replicas}")
    given = unsupported_flags(args)
    if given:
        raise SystemExit(f"vsurge: error: {', '.join(given)} cannot be used with --ray yet")
    import ray
    from ray import serve

    from .app import APP_NAME, autoscaling_of, vsurge_application

    ray.init(address=args.ray_address)
    serve.start(http_options={"host": args.host, "port": args.port})
    print(f"Starting {args.replicas} vsurge replica(s) on Ray Serve (each loads and compiles the model) ...",
          file=sys.stderr, flush=True)
    try:
        autoscaling = autoscaling_of(args)
    except ValueError as e:
        raise SystemExit(f"vsurge: error: --min-replicas / --max-replicas: {e}") from None
    serve.run(vsurge_application(args, replicas=args.replicas, replica_cpus=args.replica_cpus,
                                 replica_tpus=args.replica_tpus, autoscaling=autoscaling), name=APP_NAME,
              route_prefix="/", blocking=False)
    count = (f"{autoscaling['min_replicas']}-{autoscaling['max_replicas']} replicas, autoscaled" if autoscaling
             else f"{args.replicas} replica(s)")
    print(f"vsurge: serving on Ray Serve at http://{args.host}:{args.port}/v1 ({count})", file=sys.stderr, flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    serve.delete(APP_NAME)  # replicas finish their requests (Serve's graceful shutdown), then stop
    serve.shutdown()
    ray.shutdown()
    return 0
