"""What the ingress adds to `/metrics` on Ray Serve: the router's choices and every replica's own counters, so
the prefix-aware routing's effect shows in one scrape (the rest of `/metrics` is the replica that answered it:
its engine's series, as `vsurge serve` exposes them)."""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger(__name__)

REPLICA_ACTOR_MARK = "#VsurgeReplica#"  # Serve's replica actors are named SERVE_REPLICA::<app>#<deployment>#<id>
# routing stats key -> (series, help)
REPLICA_SERIES = {
    "requests": ("vsurge:replica_requests_total", "Requests a replica took"),
    "prefix_hits": ("vsurge:replica_prefix_hits_total", "Requests whose prompt shared a recent prompt's prefix there"),
    "prompt_tokens": ("vsurge:replica_prompt_tokens_total", "Prompt tokens a replica's engines were given"),
    "prefix_cache_hit_tokens": ("vsurge:replica_prefix_cache_hit_tokens_total",
                                "Of them, tokens found in the replica's prefix cache"),
}


def replica_actors() -> list[tuple[str, object]]:
    """(actor name, actor handle) of every live vsurge replica in the cluster (a replica gone meanwhile is left
    out). Its actor's `record_routing_stats` is Serve's call of the replica's own."""
    import ray

    found = []
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if REPLICA_ACTOR_MARK in actor["name"]:
            try:
                found.append((actor["name"], ray.get_actor(actor["name"], namespace=actor["namespace"])))
            except ValueError:  # gone since it was listed
                continue
    return found


async def replica_stats(timeout: float = 5.0) -> dict[str, dict]:
    """Each live replica's routing stats (replica.py record_routing_stats), by its replica id."""

    async def one(name, handle):
        try:
            return name.rsplit("#", 1)[-1], await asyncio.wait_for(handle.record_routing_stats.remote(), timeout)
        except Exception as exc:  # noqa: BLE001: a replica starting or gone is left out of this scrape
            log.debug("no stats from %s: %r", name, exc)
            return None

    return dict(found for found in await asyncio.gather(*(one(*a) for a in replica_actors())) if found)


def exposition(choices: dict, replicas: dict[str, dict]) -> bytes:
    """Prometheus text of the router's choices and the replicas' counters."""
    lines = ["# HELP vsurge:router_requests_total Requests the prefix-aware router placed, by how",
             "# TYPE vsurge:router_requests_total counter"]
    lines += [f'vsurge:router_requests_total{{choice="{choice}"}} {choices.get(choice, 0)}'
              for choice in ("prefix", "least_loaded")]
    for key, (series, help_text) in REPLICA_SERIES.items():
        lines += [f"# HELP {series} {help_text}", f"# TYPE {series} counter"]
        lines += [f'{series}{{replica="{rid}"}} {stats.get(key, 0)}' for rid, stats in sorted(replicas.items())]
    return ("\n".join(lines) + "\n").encode()
