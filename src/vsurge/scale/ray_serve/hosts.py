"""A replica that spans hosts (`--replica-hosts N`): vsurge's multi-host mode (scale/multihost.py: one process per
host, process 0 schedules, every process runs the same compiled step) inside one Ray Serve replica.

Serve reserves a placement group per replica, one bundle per host (app.py: `placement_group_bundles`,
STRICT_SPREAD on a cluster). The replica's actor takes bundle 0 and is process 0: it starts one follower actor
in each other bundle with the coordinator's address (its own host, a free port), then builds its own server
like `vsurge serve --coordinator-address A --num-processes N --process-id 0` would. jax.distributed joins the
N processes into one mesh; the followers run `vsurge serve`'s follower loop until the leader stops. The
followers are the replica actor's children: they die with it, and a follower that dies fails the replica's
health check (the leader's requests fail with the lost-follower error meanwhile), so Serve replaces the whole
group.
"""

from __future__ import annotations

import copy
import socket

FOLLOWER_MARK = "VsurgeFollower#"  # a follower actor's name: VsurgeFollower#<replica id>#<process id>


def _with_process(args, coordinator: str, hosts: int, process_id: int):
    mine = copy.copy(args)
    mine.ray = False
    mine.coordinator_address, mine.num_processes, mine.process_id = coordinator, hosts, process_id
    return mine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class HostFollower:
    """Process `process_id` of a replica's multi-host group (a Ray actor in the replica's placement group)."""

    def follow(self, args, coordinator: str, hosts: int, process_id: int) -> int:
        """Join the group and run the leader's steps until it stops: -> the follower's exit status."""
        from ...cli.serve_build import build_server

        return build_server(_with_process(args, coordinator, hosts, process_id))


class HostGroup:
    """The followers of one replica (process 0 is the caller): started before the leader builds its server, since
    jax.distributed.initialize waits for all N processes."""

    def __init__(self, args, hosts: int, cpus: float, tpus: int):
        import ray
        from ray import serve
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        group = ray.util.get_current_placement_group()
        if group is None:
            raise RuntimeError("a replica spanning hosts runs in its placement group (app.py's bundles)")
        self.coordinator = f"{ray.util.get_node_ip_address()}:{free_port()}"
        actor = ray.remote(HostFollower)
        replica = serve.get_replica_context().replica_id.unique_id
        self.followers = [
            actor.options(num_cpus=cpus, resources={"TPU": tpus} if tpus else {}, name=f"{FOLLOWER_MARK}{replica}#{i}",
                          scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i))
            .remote() for i in range(1, hosts)]
        self.running = [f.follow.remote(args, self.coordinator, hosts, i) for i, f in enumerate(self.followers, 1)]
        self.leader_args = _with_process(args, self.coordinator, hosts, 0)

    def lost(self) -> str | None:
        """Why the group cannot serve (a follower ended), or None."""
        import ray

        ended, _ = ray.wait(self.running, num_returns=len(self.running), timeout=0)
        if not ended:
            return None
        try:
            status = ray.get(ended[0])
        except ray.exceptions.RayError as exc:
            return f"a follower process was lost: {exc}"
        return f"a follower process ended (status {status})"

    def stop(self) -> None:
        import ray

        for follower in self.followers:
            ray.kill(follower, no_restart=True)
