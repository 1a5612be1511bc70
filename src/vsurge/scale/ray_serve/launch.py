"""`vsurge serve --ray`: the Serve application (app.py) on a Ray cluster, HTTP on --host/--port, until
SIGINT/SIGTERM. Then it drains: the ingress answers new requests 503 and lets those in flight finish (streams
to their last chunk), the application is deleted (its replicas stop), and Serve is shut down when this process
started the cluster (a cluster joined with --ray-address keeps its Serve and other applications); exit 0."""

from __future__ import annotations

import logging
import signal
import sys
import threading

from . import require_ray, unsupported_flags

log = logging.getLogger(__name__)


def serve_on_ray(args) -> int:
    require_ray()
    if args.replicas < 1 or args.replica_hosts < 1:
        raise SystemExit(f"vsurge: error: --replicas and --replica-hosts must be at least 1, got {args.replicas} "
                         f"and {args.replica_hosts}")
    given = unsupported_flags(args)
    if given:
        raise SystemExit(f"vsurge: error: {', '.join(given)} cannot be used with --ray yet")
    import ray
    from ray import serve

    from .app import APP_NAME, DRAIN_TIMEOUT_S, INGRESS_DEPLOYMENT, autoscaling_of, vsurge_application

    ray.init(address=args.ray_address)
    serve.start(http_options={"host": args.host, "port": args.port})
    print(f"Starting {args.replicas} vsurge replica(s) on Ray Serve (each loads and compiles the model) ...",
          file=sys.stderr, flush=True)
    try:
        autoscaling = autoscaling_of(args)
    except ValueError as e:
        raise SystemExit(f"vsurge: error: --min-replicas / --max-replicas: {e}") from None
    serve.run(vsurge_application(args, replicas=args.replicas, replica_cpus=args.replica_cpus,
                                 replica_tpus=args.replica_tpus, replica_hosts=args.replica_hosts,
                                 # a local cluster is one machine: a replica's processes share it
                                 hosts_strategy="STRICT_SPREAD" if args.ray_address else "PACK",
                                 autoscaling=autoscaling), name=APP_NAME,
              route_prefix="/", blocking=False)
    count = (f"{autoscaling['min_replicas']}-{autoscaling['max_replicas']} replicas, autoscaled" if autoscaling
             else f"{args.replicas} replica(s)")
    print(f"vsurge: serving on Ray Serve at http://{args.host}:{args.port}/v1 ({count})", file=sys.stderr, flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    print("vsurge: draining: new requests get 503, those in flight finish", file=sys.stderr, flush=True)
    ingress = serve.get_deployment_handle(INGRESS_DEPLOYMENT, app_name=APP_NAME)
    left = ingress.drain.remote(DRAIN_TIMEOUT_S).result(timeout_s=DRAIN_TIMEOUT_S + 30)
    if left:
        log.warning("%d request(s) still in flight after %.0f s of draining: cut", left, DRAIN_TIMEOUT_S)
    serve.delete(APP_NAME)  # its replicas stop (nothing is in flight any more)
    if args.ray_address is None:  # the cluster is this process's own
        serve.shutdown()
    ray.shutdown()
    return 0
