"""The Ray Serve application: an ingress deployment in front of a deployment of vsurge replicas.

    vsurge serve --ray --replicas 2 --model M ...                      (launch.py)
    serve run vsurge.scale.ray_serve.app:build_app serve_args="--model M" replicas=2
    a Serve config file: import_path vsurge.scale.ray_serve.app:build_app, args {serve_args, replicas}
"""

from __future__ import annotations

import shlex

from ray import serve
from ray.serve.config import RequestRouterConfig

from .ingress import VsurgeIngress
from .replica import VsurgeReplica
from .router import PrefixAwareRouter

APP_NAME = "vsurge"
REPLICA_DEPLOYMENT = "VsurgeReplica"
INGRESS_DEPLOYMENT = "VsurgeIngress"
# Requests one replica takes at once: its engine batches them (continuous batching) and queues the rest, so
# this is far above Serve's default of 5; the router prefers shorter queues well before it.
MAX_ONGOING_PER_REPLICA = 64


def vsurge_application(args, replicas: int = 1, replica_cpus: float = 1.0, stats_period_s: float = 1.0,
                       min_shared_blocks: int = 4, imbalance: int = 4):
    """args: `vsurge serve`'s parsed flags, the same for every replica."""
    replica = serve.deployment(
        VsurgeReplica, name=REPLICA_DEPLOYMENT, num_replicas=replicas,
        ray_actor_options={"num_cpus": replica_cpus}, max_ongoing_requests=MAX_ONGOING_PER_REPLICA,
        health_check_period_s=2.0, health_check_timeout_s=30.0,
        request_router_config=RequestRouterConfig(
            request_router_class=PrefixAwareRouter,
            request_router_kwargs={"min_shared_blocks": min_shared_blocks, "imbalance": imbalance},
            request_routing_stats_period_s=stats_period_s, request_routing_stats_timeout_s=10.0))
    ingress = serve.deployment(VsurgeIngress, name=INGRESS_DEPLOYMENT, ray_actor_options={"num_cpus": 0},
                               max_ongoing_requests=4096)
    return ingress.bind(replica.bind(args))


def build_app(config: dict):
    """Serve's application builder (`serve run`, config files): serve_args is `vsurge serve`'s flags as one
    string or a list; replicas, replica_cpus as in `vsurge serve --ray`."""
    from ...cli.arguments import build_parser

    given = config.get("serve_args", "")
    argv = shlex.split(given) if isinstance(given, str) else [str(a) for a in given]
    args = build_parser().parse_args(["serve", *argv])
    return vsurge_application(args, replicas=int(config.get("replicas", args.replicas)),
                              replica_cpus=float(config.get("replica_cpus", args.replica_cpus)))
