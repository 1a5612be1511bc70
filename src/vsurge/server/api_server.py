"""vSurgeApiServer: serves one or more vSurge instances over HTTP (the seed's API).

fire() starts uvicorn, on TCP or on a unix domain socket (`uds`, server/unix_socket.py); the models
compile and start in a background thread while /liveness already answers and /readiness says 503. SIGTERM/SIGINT drain:
readiness flips to 503, in-flight requests finish, then the process exits 0. A start-up that fails
(loading, compiling) or an engine that fails later (its device step) is logged and the process exits 1,
so a service manager sees it and restarts the server; it never sits at 503 for good.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

from prometheus_client import CollectorRegistry, generate_latest, start_http_server

from ..structured.reasoning import get_reasoning_parser
from ..structured.tool_parsers import get_tool_parser
from ..lora.view import AdaptedSurge
from ..multimodal import MediaPolicy
from ..vsurge import Surge
from .adapters.response_store import ResponseStore
from .app import build_app
from .handlers import OpenAIHandlers
from .lora_routes import adapter_metrics
from .unix_socket import release_socket_path

log = logging.getLogger(__name__)


async def _abort_idle_connections(state, grace: float = 1.0) -> None:
    """At shutdown uvicorn closes idle keep-alive connections and waits until they are gone; closing a TLS
    one waits for the client's close_notify, up to asyncio's 30 s, and a client that keeps its pool open
    (the openai SDK does) never sends it. Every `grace` seconds, connections with no request in flight are
    dropped; requests in flight are left to finish (draining)."""
    while True:
        await asyncio.sleep(grace)
        for connection in list(state.connections):
            cycle = getattr(connection, "cycle", None)
            if cycle is None or cycle.response_complete:
                connection.transport.abort()


class _EngineRegistries:
    """A prometheus collector that yields every engine's own registry."""

    def __init__(self, server):
        self.server = server

    def collect(self):
        for surge in self.server.surges.values():
            yield from surge.metrics.registry.collect()
        if self.server.router is not None:
            yield from self.server.router.collect()
        yield from adapter_metrics(self.server.surges)


class vSurgeApiServer(OpenAIHandlers):  # noqa: N801 (the seed's name)
    """Serves one or more vSurge instances; its handler methods (chat_completions, completions,
    count_tokens, available_inference, liveness, readiness) are the routes' bodies.

    max_workers: the size of the thread pool that runs the server's blocking work (tokenizing and
    templating large inputs, compiling structured-output grammars, cache-slot files): the default
    executor of the event loop `fire()` serves on. oai_like_processor: the seed's; messages always
    reach the chat template OpenAI-style (docs/seed_api.md), so False only warns. tool_call_parser: how
    `tool_choice="auto"` outputs are parsed (structured/tool_parsers.py, or auto from the chat template);
    reasoning_parser: how reasoning is split from answers (deepseek_r1, qwen3, gpt_oss; None: not at all);
    response_store: where /v1/responses keeps stored responses (a ResponseStore: size cap and TTL);
    media_policy: where image inputs may come from (a MediaPolicy: no URLs or local files by default).
    api_key guards every route but the public ones; admin_api_key (when given) the admin ones (loading and
    unloading models and adapters, named prompt caches), which else take api_key; guard_metrics: /metrics
    takes api_key too (docs/security.md). allow_runtime_lora: POST /v1/load_lora_adapter and
    /v1/unload_lora_adapter answer (else 403); lora_dir: the folder runtime adapters must lie in."""

    def __init__(self, vsurge_map: dict[str, Surge] | Surge | None = None, max_workers: int = 10,
                 oai_like_processor: bool = True, api_key: str | None = None, tool_call_parser: str = "auto",
                 reasoning_parser: str | None = None, response_store: ResponseStore | None = None,
                 media_policy: MediaPolicy | None = None, admin_api_key: str | None = None,
                 guard_metrics: bool = False, allow_runtime_lora: bool = False, lora_dir: str | None = None):
        if vsurge_map is None:
            raise ValueError("vSurgeApiServer needs at least one vSurge")
        if isinstance(vsurge_map, Surge):
            vsurge_map = {vsurge_map.vsurge_name: vsurge_map}
        if not vsurge_map:
            raise ValueError("vSurgeApiServer needs at least one vSurge")
        self.surges: dict[str, Surge] = dict(vsurge_map)
        for name, surge in self.surges.items():
            surge.metrics.rename(name)  # series carry the served name, as /v1/models shows it
        if not isinstance(max_workers, int) or max_workers < 1:
            raise ValueError(f"max_workers must be a positive integer, got {max_workers!r}")
        if oai_like_processor is not True:
            warnings.warn("oai_like_processor=False has no effect: chat messages always reach the template "
                          "OpenAI-style (docs/seed_api.md)", stacklevel=2)
        get_tool_parser(tool_call_parser)  # an unknown name fails here, not at the first request
        if reasoning_parser is not None:
            get_reasoning_parser(reasoning_parser)
        self.tool_call_parser = tool_call_parser
        self.reasoning_parser = reasoning_parser
        self.response_store = response_store or ResponseStore()
        self.media_policy = media_policy or MediaPolicy()  # where image inputs may come from (server/chat_images.py)
        self.max_workers = max_workers
        self.oai_like_processor = oai_like_processor
        self.api_key = api_key
        self.admin_api_key = admin_api_key
        self.guard_metrics = guard_metrics
        self.allow_runtime_lora = allow_runtime_lora or lora_dir is not None  # a folder to load from asks for it
        self.lora_dir = lora_dir
        self.draining = False
        self.started_at = int(time.time())
        self._startup_error: BaseException | None = None
        self._starting = False
        self.registry = CollectorRegistry()
        self.registry.register(_EngineRegistries(self))
        self.executor = ThreadPoolExecutor(max_workers, thread_name_prefix="vsurge-server")
        self.app = build_app(self)
        self.app.router.on_startup.append(self._use_executor)
        self._uvicorn = None
        self.exit_reason: str | None = None  # why fire() exits non-zero (start-up or an engine failed)

    async def _use_executor(self) -> None:
        """Serve with `max_workers` threads for blocking work (asyncio.to_thread runs on them)."""
        asyncio.get_running_loop().set_default_executor(self.executor)

    # ------------------------------------------------------------ models
    def get(self, model: str | None) -> Surge | None:
        """The vSurge serving `model`: a model's name, or a LoRA adapter's (its base, generating with it)."""
        if not model:
            return next(iter(self.surges.values()))
        surge = self.surges.get(model)
        if surge is not None:
            return surge
        for base in self.surges.values():
            if base.adapter(model) is not None:
                return AdaptedSurge(base, model)
        return None

    def adopt(self, name: str, surge: Surge) -> None:
        """A model the router loaded (started already) joins the served ones."""
        surge.metrics.rename(name)
        self.surges[name] = surge

    def name_of(self, surge) -> str:
        """The served name of a vSurge, or the adapter's name for an adapter's view of one."""
        if isinstance(surge, AdaptedSurge):
            return surge.adapter_name
        return next(name for name, s in self.surges.items() if s is surge)

    @property
    def ready(self) -> bool:
        return not self.draining and all(s.ready for s in self.surges.values())

    def not_ready_reason(self) -> str:
        if self.draining:  # after an engine failure, name it: readiness is what a service manager reads
            return f"the server is shutting down: {self.exit_reason}" if self.exit_reason else "the server is shutting down"
        if self._startup_error is not None:
            return f"start-up failed: {self._startup_error}"
        broken = [f"{n}: {s.driver.error}" for n, s in self.surges.items() if getattr(s.driver, "error", None)]
        if broken:
            return "a model failed: " + "; ".join(broken)
        return "the models are still loading or compiling"

    def start_models(self) -> None:
        """Compile and start every model that is not running yet (blocking)."""
        try:
            for name, surge in self.surges.items():
                if not surge.ready:
                    log.info("compiling %s", name)
                    surge.compile()
                    surge.start()
        except BaseException as exc:  # noqa: BLE001: reported by /readiness
            log.exception("start-up failed")
            self._startup_error = exc

    def stop_models(self, timeout: float = 30.0) -> None:
        self.draining = True
        for surge in self.surges.values():
            surge.stop(timeout)

    def metrics_text(self) -> bytes:
        return generate_latest(self.registry)

    # ------------------------------------------------------------ serving
    def fire(self, host: str = "0.0.0.0", port: int = 11556, metrics_port: int | None = None, log_level: str = "info",
             ssl_keyfile: str | None = None, ssl_certfile: str | None = None, on_ready=None,
             uds: str | None = None) -> None:
        """Serve until SIGINT/SIGTERM. uds: serve on this unix socket path instead of host:port (claimed with
        unix_socket.claim_socket_path; its file is removed at shutdown). metrics_port: the separate Prometheus
        port, default port + 1 (off with uds); -1 disables it."""
        import uvicorn

        if metrics_port is None:
            metrics_port = -1 if uds else port + 1
        if metrics_port != -1:
            start_http_server(metrics_port, addr=host, registry=self.registry)
        server_ref = self

        class DrainingServer(uvicorn.Server):
            def handle_exit(self, sig, frame):
                server_ref.draining = True  # readiness -> 503 while uvicorn waits for in-flight requests
                super().handle_exit(sig, frame)
                # uvicorn re-raises the signal after draining (exit 143); a drained server exits 0
                self._captured_signals.clear()

            async def shutdown(self, sockets=None):
                closing = asyncio.create_task(_abort_idle_connections(self.server_state))
                try:
                    await super().shutdown(sockets)
                finally:
                    closing.cancel()

        config = uvicorn.Config(self.app, host=host, port=port, log_level=log_level, ssl_keyfile=ssl_keyfile,
                                ssl_certfile=ssl_certfile, timeout_graceful_shutdown=None, access_log=False,
                                uds=uds)
        self._uvicorn = DrainingServer(config)

        def start_then_watch():
            self.start_models()
            if self._startup_error is not None:
                return self._exit_failed(f"start-up failed: {self._startup_error!r}")
            if on_ready is not None:
                on_ready()
            self._watch_engines()

        threading.Thread(target=start_then_watch, name="vsurge-startup", daemon=True).start()
        try:
            self._uvicorn.run()
        finally:
            if uds:
                release_socket_path(uds)
            self.stop_models()
        if self.exit_reason is not None:  # a service manager sees the failure (and restarts the server)
            raise SystemExit(f"vsurge: error: {self.exit_reason}")

    def _watch_engines(self, period: float = 0.5) -> None:
        """A model whose engine failed (its device step raised, or a step got stuck) does not come back:
        the server exits non-zero rather than answering 503 for good."""
        while not self._uvicorn.should_exit:
            broken = [f"{n}: {s.driver.error}" for n, s in list(self.surges.items())
                      if getattr(s.driver, "error", None) is not None]
            if broken:
                return self._exit_failed("a model's engine failed: " + "; ".join(broken))
            time.sleep(period)

    def _exit_failed(self, reason: str) -> None:
        log.error("%s; the server exits with status 1", reason)
        self.exit_reason = reason
        self.draining = True
        self._uvicorn.should_exit = True
