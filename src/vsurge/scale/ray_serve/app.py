"""The Ray Serve application: an ingress deployment in front of a deployment of vsurge replicas.

    vsurge serve --ray --replicas 2 --model M ...                      (launch.py)
    serve run vsurge.scale.ray_serve.app:build_app serve_args="--model M" replicas=2
    a Serve config file: import_path vsurge.scale.ray_serve.app:build_app, args {serve_args, replicas, ...}
    (deploy/ray/: a Serve config and KubeRay RayService manifests for CPU nodes and GKE TPU v5e)
"""

from __future__ import annotations

import copy
import shlex

from ray import serve
from ray.serve.config import RequestRouterConfig

from . import unsupported_flags
from .ingress import VsurgeIngress
from .replica import VsurgeReplica
from .router import PrefixAwareRouter

APP_NAME = "vsurge"
REPLICA_DEPLOYMENT = "VsurgeReplica"
INGRESS_DEPLOYMENT = "VsurgeIngress"
# Requests one replica takes at once: its engine batches them (continuous batching) and queues the rest, so
# this is far above Serve's default of 5; the router prefers shorter queues well before it.
MAX_ONGOING_PER_REPLICA = 64


# Serve's own default (its RequestRouterConfig's), named so the baseline is the router users get without ours
DEFAULT_ROUTER = RequestRouterConfig().request_router_class

# what build_app reads from a Serve config's `args` (deploy/ray/*.yaml are checked against it)
BUILD_ARGS = ("serve_args", "replicas", "replica_cpus", "replica_tpus", "replica_hosts", "min_replicas",
              "max_replicas")
DRAIN_TIMEOUT_S = 300.0  # a replica scaled down or deleted finishes the requests it holds, at most this long


def vsurge_application(args, replicas: int = 1, replica_cpus: float = 1.0, stats_period_s: float = 1.0,
                       min_shared_blocks: int = 4, imbalance: int = 4, replica_tpus: int = 0,
                       prefix_routing: bool = True, autoscaling: dict | None = None, replica_hosts: int = 1,
                       hosts_strategy: str = "STRICT_SPREAD"):
    """args: `vsurge serve`'s parsed flags, the same for every replica. replica_tpus: chips of Ray's "TPU"
    resource each replica reserves (a TPU host's chips: KubeRay's TPU worker groups advertise them).
    prefix_routing=False leaves Serve's default router (power of two choices by queue length): the baseline
    benchmarks/ray_serve.py measures the prefix-aware one against. autoscaling: Serve's autoscaling_config
    (autoscale.autoscaling_config: vsurge's load policy between min and max replicas) instead of `replicas`.
    replica_hosts: hosts (processes) each replica spans, one placement-group bundle of replica_cpus and
    replica_tpus each, placed by hosts_strategy (STRICT_SPREAD: one per node; PACK puts them on one machine)."""
    if replica_hosts < 1:
        raise ValueError(f"replica_hosts must be at least 1, got {replica_hosts}")
    args = copy.copy(args)  # what each replica reads of its own shape (hosts.py starts its followers alike)
    args.replica_hosts, args.replica_cpus, args.replica_tpus = replica_hosts, replica_cpus, replica_tpus
    actor = {"num_cpus": replica_cpus, **({"resources": {"TPU": replica_tpus}} if replica_tpus else {})}
    bundle = {"CPU": replica_cpus, **({"TPU": replica_tpus} if replica_tpus else {})}
    spanning = {"placement_group_bundles": [bundle] * replica_hosts,
                "placement_group_strategy": hosts_strategy} if replica_hosts > 1 else {}
    routing = RequestRouterConfig(
        request_router_class=PrefixAwareRouter if prefix_routing else DEFAULT_ROUTER,
        request_router_kwargs={"min_shared_blocks": min_shared_blocks, "imbalance": imbalance} if prefix_routing else {},
        request_routing_stats_period_s=stats_period_s, request_routing_stats_timeout_s=10.0)
    count = {"autoscaling_config": autoscaling} if autoscaling else {"num_replicas": replicas}
    replica = serve.deployment(
        VsurgeReplica, name=REPLICA_DEPLOYMENT, **count, **spanning,
        ray_actor_options=actor, max_ongoing_requests=MAX_ONGOING_PER_REPLICA,
        health_check_period_s=2.0, health_check_timeout_s=30.0, request_router_config=routing,
        graceful_shutdown_wait_loop_s=1.0, graceful_shutdown_timeout_s=DRAIN_TIMEOUT_S)
    ingress = serve.deployment(VsurgeIngress, name=INGRESS_DEPLOYMENT, ray_actor_options={"num_cpus": 0},
                               max_ongoing_requests=4096)
    return ingress.bind(replica.bind(args), multiplexed=serves_several_models(args))


def serves_several_models(args) -> bool:
    """Whether the replicas load models on demand (several --model, --models-dir, --models-config): then each
    request names its model to Serve's multiplexing, which routes it to a replica holding that model."""
    from ...cli import served_models

    return served_models.several(args, served_models.model_specs(args))


def build_app(config: dict):
    """Serve's application builder (`serve run`, config files): serve_args is `vsurge serve`'s flags as one
    string or a list; replicas, replica_cpus, replica_tpus as in `vsurge serve --ray`."""
    from ...cli.arguments import build_parser

    unknown = sorted(set(config) - set(BUILD_ARGS))
    if unknown:
        raise ValueError(f"vsurge's Serve application takes args {', '.join(BUILD_ARGS)}; got {', '.join(unknown)}")
    given = config.get("serve_args", "")
    argv = shlex.split(given) if isinstance(given, str) else [str(a) for a in given]
    args = build_parser().parse_args(["serve", *argv])
    given = unsupported_flags(args)
    if given:
        raise ValueError(f"serve_args: {', '.join(given)} cannot be used on Ray Serve yet")
    for name in ("min_replicas", "max_replicas"):
        if name in config:
            setattr(args, name, int(config[name]))
    return vsurge_application(args, replicas=int(config.get("replicas", args.replicas)),
                              replica_cpus=float(config.get("replica_cpus", args.replica_cpus)),
                              replica_tpus=int(config.get("replica_tpus", args.replica_tpus)),
                              replica_hosts=int(config.get("replica_hosts", args.replica_hosts)),
                              autoscaling=autoscaling_of(args))


def autoscaling_of(args) -> dict | None:
    """Serve's autoscaling_config for --min-replicas / --max-replicas (None: a fixed --replicas)."""
    from .autoscale import autoscaling_config

    low, high = getattr(args, "min_replicas", None), getattr(args, "max_replicas", None)
    if low is None and high is None:
        return None
    return autoscaling_config(low if low is not None else 1, high if high is not None else max(low, 1))
