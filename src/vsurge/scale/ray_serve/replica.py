"""One vsurge replica of the Ray Serve deployment: `vsurge serve`'s own server, built by its own code
(cli.serve_build.build_server) from the same flags, compiled before Serve puts it in rotation; requests arrive
from the ingress as plain records and run through the server's FastAPI app in this process."""

from __future__ import annotations

import asyncio
import logging

from ray import serve

from ...server.errors import APIError, error_response
from .adapters import UNLOAD_PATH, ReplicaAdapters, adapter_request
from .asgi_call import call_app, is_event_stream
from .prefixes import RecentPrefixes, block_chain

log = logging.getLogger(__name__)

MIN_SHARED_BLOCKS = 4  # a request counts as a prefix hit when it shares this many blocks (~256 chars)
# Serve's record of the models a replica holds (multiplexing) never evicts first: vsurge's own LRU does
# (--max-loaded-models), and a model it unloaded is loaded again by the next request routed here for it
SERVE_MODEL_RECORD = 1024


class HeldModel:
    """What Serve's multiplexing keeps per model a replica holds; dropped by its LRU, the model is unloaded
    (unless requests still use it: vsurge's router then unloads it when it needs the room)."""

    def __init__(self, router, name: str):
        self.router, self.name = router, name

    async def __del__(self):
        try:
            await self.router.unload(self.name)
        except Exception as exc:  # noqa: BLE001: busy (409) or already gone
            log.info("model %s stays loaded: %r", self.name, exc)


class HeldAdapter:
    """What Serve's multiplexing keeps per run-time LoRA adapter a replica holds; dropped by its LRU (over
    SERVE_MODEL_RECORD adapters and models), the adapter is dropped here (Serve calls __del__ in a thread)."""

    def __init__(self, adapters: ReplicaAdapters, name: str):
        self.adapters, self.name, self.live = adapters, name, True

    def __del__(self):
        if self.live:  # (not when the replica dropped it itself: replica.forget_in_serve)
            self.live = False
            self.adapters.forget(self.name)


class VsurgeReplica:
    """The deployment's class (app.py wraps it with serve.deployment): args is `vsurge serve`'s Namespace."""

    def __init__(self, args):
        from ...cli.serve_build import build_server

        self.hosts = None  # a replica spanning hosts: its followers (hosts.py); this actor is process 0
        if getattr(args, "replica_hosts", 1) > 1:
            from .hosts import HostGroup

            self.hosts = HostGroup(args, args.replica_hosts, args.replica_cpus, args.replica_tpus)
            args = self.hosts.leader_args
        args.ray = False
        built = build_server(args)
        if isinstance(built, int):
            raise RuntimeError("a Ray Serve replica cannot be a multi-host follower")
        self.server, self.surge = built
        self.adapters = ReplicaAdapters(self.server, self.forget_in_serve)  # LoRA adapters loaded at run time
        self.server.start_models()  # blocking: Serve sends no request before __init__ returns
        if self.server._startup_error is not None:
            raise RuntimeError(f"start-up failed: {self.server._startup_error!r}")
        self.in_flight = 0
        self.streaming = 0  # of in_flight: responses being streamed (server-sent events)
        self.requests = 0
        self.prefix_hits = 0
        self.recent = RecentPrefixes()
        self._loops_with_executor: set[int] = set()

    @serve.multiplexed(max_num_models_per_replica=SERVE_MODEL_RECORD)
    async def hold_model(self, name: str) -> HeldModel | HeldAdapter:
        """Load model or run-time LoRA adapter `name` here (a model through vsurge's router, as a request for it
        would; an adapter from the ingress's record) and tell Serve this replica holds it, so its router sends
        the next requests for `name` here."""
        if self._knows_model(name):
            await self.server.router.ensure_loaded(name)
            return HeldModel(self.server.router, name)
        await self.adapters.ensure(name)
        return HeldAdapter(self.adapters, name)

    def forget_in_serve(self, name: str) -> None:
        """Serve no longer counts `name` among this replica's models (its multiplexing has no public call for
        one id: its record is the wrapper serve.multiplexed keeps on this object)."""
        wrapper = getattr(self, "__serve_multiplex_wrapper", None)
        held = wrapper.models.pop(name, None) if wrapper is not None else None
        if held is not None:
            held.live = False
            wrapper._push_multiplexed_replica_info = True

    def _knows_model(self, name: str) -> bool:
        return getattr(self.server, "router", None) is not None and self.server.router.knows(name)

    async def handle_http(self, request: dict, prefix_text: str = "", adapters: dict | None = None):
        """Streams the response to one HTTP request (asgi_call.request_record): its head, then its body.
        prefix_text: the request's prompt text (the router read it too): counted against recent prompts.
        adapters: the ingress's record of run-time LoRA adapters (adapters.AdapterRecord.snapshot)."""
        loop = asyncio.get_running_loop()
        if id(loop) not in self._loops_with_executor:  # what the server's startup hook does under uvicorn
            loop.set_default_executor(self.server.executor)
            self._loops_with_executor.add(id(loop))
        if adapters is not None:
            self.adapters.sync(adapters)
        try:
            await self._hold_what_is_named(request)
        except APIError as exc:  # a recorded adapter unreadable here (its folder is gone) or unloaded meanwhile
            answer = error_response(exc.status, exc.message, exc.param, path=request["path"], code=exc.code)
            yield {"status": answer.status_code, "headers": answer.raw_headers}
            yield answer.body
            return
        chain = block_chain(prefix_text)
        self.requests += 1
        if chain and self.recent.shared(chain) >= MIN_SHARED_BLOCKS:
            self.prefix_hits += 1
        self.recent.add(chain)
        self.in_flight += 1
        streamed = False
        try:
            if request["method"] == "GET" and request["path"] == "/v1/models":  # + the cluster's run-time adapters
                head, *body = [piece async for piece in call_app(self.server.app, request)]
                yield head
                yield self.adapters.listed(b"".join(body)) if head["status"] == 200 else b"".join(body)
                return
            async for piece in call_app(self.server.app, request):
                if isinstance(piece, dict):
                    loaded = self.adapters.answered(request["path"], request["body"], piece["status"])
                    if loaded is not None:  # loaded here through the route: Serve sends its requests here
                        await self.hold_model(loaded)
                    if is_event_stream(piece):
                        streamed = True
                        self.streaming += 1
                yield piece
        finally:
            self.in_flight -= 1
            self.streaming -= streamed

    async def _hold_what_is_named(self, request: dict) -> None:
        """The model or adapter the request names (the ingress's multiplexed model id), loaded here; an unload
        of a recorded adapter, or a request for its card, loads it first if it is not here, so the route answers
        as on its holder."""
        name = serve.get_multiplexed_model_id()
        if name and (self._knows_model(name) or self.adapters.recorded(name)):
            await self.hold_model(name)
            if not self._knows_model(name):
                await self.adapters.ensure(name)  # (Serve may remember it from before a drop)
        if request["path"] == UNLOAD_PATH:
            named = adapter_request(request["body"])
            if named is not None and self.adapters.recorded(named[0]):
                await self.adapters.ensure(named[0])
        elif request["method"] == "GET" and request["path"].startswith("/v1/models/"):  # one model's card
            card = request["path"].removeprefix("/v1/models/")
            if self.adapters.recorded(card):
                await self.adapters.ensure(card)

    def record_routing_stats(self) -> dict:
        """What the router sees of this replica (Ray Serve polls it: request_routing_stats_period_s)."""
        router = getattr(self.server, "router", None)
        loaded = sorted(name for name, e in router.entries.items() if e.state == "loaded") if router else []
        return {"queue_len": self.in_flight, "slots": self._slots(), "streaming": self.streaming,
                "requests": self.requests, "prefix_hits": self.prefix_hits, "prefix_blocks": self.recent.hashes(),
                "models": loaded, "adapters": sorted(self.adapters.loaded), "processes": _process_count(),
                **self.token_counts()}

    def record_autoscaling_stats(self) -> dict[str, float]:
        """What vsurge's autoscaling policy reads (autoscale.py; Serve pushes it to its controller): requests
        held, of them waiting for a slot, decode slots, and the fullest KV pool's use."""
        surges = list(self.server.surges.values())
        return {"held": float(self.in_flight),
                "waiting": float(sum(s.metrics.value("vsurge:num_requests_waiting") for s in surges)),
                "slots": float(self._slots()),
                "kv_usage": float(max((s.metrics.value("vsurge:kv_cache_usage_perc") for s in surges), default=0.0))}

    def _slots(self) -> int:
        """Decode slots over this replica's models: how many requests it runs at once."""
        return sum(e.max_concurrent_decodes for s in self.server.surges.values() for e in s.driver.decode_engines)

    def token_counts(self) -> dict:
        """Prompt tokens this replica's engines were given and, of them, found in their prefix caches (summed
        over its models): what a router's placement saves shows as the gap (benchmarks/ray_serve.py)."""
        surges = list(self.server.surges.values())
        return {"prompt_tokens": int(sum(s.metrics.value("vsurge:prompt_tokens_total") for s in surges)),
                "prefix_cache_hit_tokens": int(sum(s.metrics.value("vsurge:prefix_cache_hits_total") for s in surges))}

    def check_health(self) -> None:
        """Serve calls this periodically: an engine whose device step failed takes the replica out of
        rotation, and Serve starts a new one."""
        broken = [f"{n}: {s.driver.error}" for n, s in self.server.surges.items()
                  if getattr(s.driver, "error", None) is not None]
        lost = self.hosts.lost() if self.hosts is not None else None
        if lost:
            broken.append(lost)
        if broken or self.server.draining:
            raise RuntimeError("engine failed: " + "; ".join(broken) if broken else "the server is draining")

    def __del__(self):
        hosts = getattr(self, "hosts", None)
        server = getattr(self, "server", None)
        # (a leader that lost a follower cannot finish its engines' collectives: its process just ends)
        if server is not None and (hosts is None or not hosts.lost()):
            server.stop_models(timeout=5.0)
        if hosts is not None:
            hosts.stop()


def _process_count() -> int:
    """The processes of this replica's JAX runtime (more than 1: it spans hosts, hosts.py)."""
    import jax

    return jax.process_count()
