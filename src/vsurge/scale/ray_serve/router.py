"""Prefix-aware routing through Ray Serve's request-router API (`ray.serve.request_router.RequestRouter`).

A request whose prompt shares at least `min_shared_blocks` leading blocks (prefixes.py) with prompts a
replica served recently goes to the replica sharing the most, unless that replica is overloaded (`overloaded`:
every decode slot taken and its queue `imbalance` requests longer than the shortest one, or full:
max_ongoing_requests). Otherwise the candidates are ranked by their queues, counting the requests this router
gave each in the last half second (`RecentChoices`): a burst's routing tasks run at once and would all read the
same cached queue lengths (eight openings at once went 2 / 6 on two replicas).
A request for one of several models (Serve's multiplexed model id, set by the ingress) is first narrowed to
the replicas that hold that model (MultiplexMixin).

What a replica holds is what it reports in its routing stats (replica.py: `prefix_blocks`, polled every
request_routing_stats_period_s) and, for the requests sent since its last report, what this router sent it.
"""

from __future__ import annotations

import importlib
import time
import weakref
from collections import Counter, deque
from typing import List, Optional

from ray.serve.request_router import MultiplexMixin, PendingRequest, ReplicaID, RequestRouter, RunningReplica

from .prefixes import RecentPrefixes, block_chain, shared_blocks


_ROUTERS: "weakref.WeakSet[PrefixAwareRouter]" = weakref.WeakSet()  # this process's (the ingress's handles')


def routing_choices() -> Counter:
    """How this process's routers routed requests: "prefix" (to the replica sharing the prompt's prefix) or
    "least_loaded"; the ingress's /metrics shows them."""
    total: Counter = Counter()
    for router in list(_ROUTERS):
        total.update(router.choices)
    return total


class PrefixAwareRouter(MultiplexMixin, RequestRouter):
    def initialize_state(self, min_shared_blocks: int = 4, imbalance: int = 4):
        self.min_shared_blocks = min_shared_blocks
        self.imbalance = imbalance
        self.sent: dict[ReplicaID, RecentPrefixes] = {}  # prompts routed here since the replicas' last report
        self.choices: Counter = Counter()  # "prefix" / "least_loaded": how requests were routed
        self.recent = RecentChoices()
        # Serve may unpickle this class by value, with its own copy of this module's globals: register in the
        # module as imported in this process, where the ingress reads it
        importlib.import_module(__name__)._ROUTERS.add(self)

    async def choose_replicas(self, candidate_replicas: List[RunningReplica],
                              pending_request: Optional[PendingRequest] = None) -> List[List[RunningReplica]]:
        if pending_request is not None and pending_request.metadata.multiplexed_model_id:
            # a request for one of several models: the replicas holding it first (Serve's multiplexing; after
            # its matching timeout, those holding the fewest models, then all), then by prefix and load
            holding = self.apply_multiplex_routing(pending_request=pending_request)
            candidate_replicas = [r for r in candidate_replicas if r.replica_id in holding]
            if not candidate_replicas:
                return []
        chain = block_chain(_prefix_text(pending_request))
        best, best_shared = None, 0
        for replica in candidate_replicas:
            shared = self._shared(replica, chain)
            if shared > best_shared:
                best, best_shared = replica, shared
        if best is not None and best_shared >= self.min_shared_blocks and not self._overloaded(best, candidate_replicas):
            self.choices["prefix"] += 1
            self.recent.add(best.replica_id)
            others = [r for r in candidate_replicas if r is not best]
            return [[best], others] if others else [[best]]
        self.choices["least_loaded"] += 1
        ordered = sorted(candidate_replicas, key=lambda r: self._queue_len(r) + self.recent.count(r.replica_id))
        if ordered:
            self.recent.add(ordered[0].replica_id)
        return [[r] for r in ordered]  # the first that is not full

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result) -> None:
        chain = block_chain(_prefix_text(pending_request))
        if chain:
            self.sent.setdefault(replica_id, RecentPrefixes(capacity=512)).add(chain)

    def on_replica_actor_died(self, replica_id: ReplicaID):
        self.sent.pop(replica_id, None)
        self.recent.forget(replica_id)
        super().on_replica_actor_died(replica_id)

    def _shared(self, replica: RunningReplica, chain: list[str]) -> int:
        if not chain:
            return 0
        reported = shared_blocks(chain, set((replica.routing_stats or {}).get("prefix_blocks", ())))
        sent = self.sent.get(replica.replica_id)
        return max(reported, sent.shared(chain) if sent is not None else 0)

    def _queue_len(self, replica: RunningReplica) -> int:
        cached = self.replica_queue_len_cache.get(replica.replica_id)
        if cached is not None:
            return cached
        return int((replica.routing_stats or {}).get("queue_len", 0))

    def _overloaded(self, replica: RunningReplica, candidates: List[RunningReplica]) -> bool:
        slots = int((replica.routing_stats or {}).get("slots", 0))
        return overloaded(self._queue_len(replica), min(self._queue_len(r) for r in candidates), slots,
                          replica.max_ongoing_requests, self.imbalance)


def overloaded(queue: int, shortest: int, slots: int, max_ongoing: int, imbalance: int) -> bool:
    """Whether a replica holding `queue` requests should not take one more that shares its prefix. While it has a
    free decode slot the request starts at once there, its prefix found: a gap to the shortest queue does not
    count (a burst of one conversation's turns would otherwise spill its later turns onto a replica that
    prefills them whole). With every slot taken it waits, so it goes elsewhere once the gap reaches
    `imbalance`. `slots` 0: not reported yet, only the gap counts."""
    if queue >= max_ongoing:
        return True
    return queue >= slots and queue - shortest >= imbalance


class RecentChoices:
    """The requests this router gave each replica in the last `window` seconds."""

    def __init__(self, window: float = 0.5, clock=time.monotonic):
        self.window, self.clock = window, clock
        self._times: dict = {}  # replica id -> deque of monotonic times

    def add(self, replica_id) -> None:
        self._times.setdefault(replica_id, deque()).append(self.clock())

    def count(self, replica_id) -> int:
        times = self._times.get(replica_id)
        if not times:
            return 0
        cutoff = self.clock() - self.window
        while times and times[0] < cutoff:
            times.popleft()
        return len(times)

    def forget(self, replica_id) -> None:
        self._times.pop(replica_id, None)


def _prefix_text(pending_request: Optional[PendingRequest]) -> str:
    """The ingress passes the prompt text as handle_http's `prefix_text` (ingress.py)."""
    if pending_request is None:
        return ""
    text = pending_request.kwargs.get("prefix_text", "")
    return text if isinstance(text, str) else ""
