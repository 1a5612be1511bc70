"""Autoscaling the replicas on vsurge's own load signal, through Ray Serve's custom autoscaling policy.

Each replica reports (VsurgeReplica.record_autoscaling_stats) the requests it holds, how many of them wait for a
slot, its decode slots and its KV pool's use. The policy wants enough replicas that the requests held fill
`target` of their slots, and one more while requests wait on a replica whose KV pool is nearly full (its
slots are not the limit then: memory is). Serve clamps the answer to min/max replicas and applies the
upscale / downscale delays; a replica scaled down stops taking requests and finishes the ones it holds
(Serve's graceful shutdown, `graceful_shutdown_timeout_s`), so no stream is cut.
"""

from __future__ import annotations

import math

POLICY = "vsurge.scale.ray_serve.autoscale:VsurgeLoadPolicy"
KV_NEARLY_FULL = 0.9


class VsurgeLoadPolicy:
    """Serve's policy class (AutoscalingPolicy.policy_function): `__call__(ctx) -> (replicas, state)`."""

    def __init__(self, target: float = 0.75):
        if not 0 < target <= 1:
            raise ValueError(f"target is the fraction of a replica's slots to fill, in (0, 1]; got {target}")
        self.target = target

    def __call__(self, ctx):
        metrics = ctx.aggregated_metrics or {}
        held = sum(metrics.get("held", {}).values())
        slots = metrics.get("slots", {})
        per_replica = max(1.0, sum(slots.values()) / len(slots)) if slots else 1.0
        wanted = math.ceil(held / (per_replica * self.target)) if held > 0 else 0
        kv = metrics.get("kv_usage", {})
        if any(metrics.get("waiting", {}).get(r, 0) > 0 and kv.get(r, 0) >= KV_NEARLY_FULL for r in kv):
            wanted = max(wanted, ctx.current_num_replicas + 1)
        return max(wanted, 1), {}


def autoscaling_config(min_replicas: int, max_replicas: int, upscale_delay_s: float = 10.0,
                       downscale_delay_s: float = 60.0, look_back_period_s: float = 10.0) -> dict:
    """Serve's autoscaling_config for the replica deployment (`--min-replicas A --max-replicas B`)."""
    if not 1 <= min_replicas <= max_replicas:
        raise ValueError(f"replicas must satisfy 1 <= min <= max; got min {min_replicas}, max {max_replicas}")
    return {"min_replicas": min_replicas, "initial_replicas": min_replicas, "max_replicas": max_replicas,
            "upscale_delay_s": upscale_delay_s, "downscale_delay_s": downscale_delay_s,
            "look_back_period_s": look_back_period_s, "policy": {"policy_function": POLICY}}
