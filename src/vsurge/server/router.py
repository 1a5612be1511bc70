"""Several models in one server: which are loaded, loading on demand, unloading by LRU and when idle.

The server's `surges` holds the loaded models (what every handler, /metrics and the web page see); the
router knows every model it may serve (`--model NAME=PATH` repeated, `--models-dir`) and how to build
each (a callable that loads, compiles and starts a vSurge). A request for a model that is not loaded
waits while it loads (start-up from the compilation cache): first, when `--max-loaded-models` are
loaded, the least recently used one with nothing in flight is stopped and dropped (waiting while
every loaded model has requests in flight, bounded by `load_timeout`). `--sleep-idle-seconds N`
drops a model nobody asked for in N seconds; its next request wakes it. A model that fails to load
fails the requests waiting for it with the loader's error (and later ones, for RETRY_FAILED_AFTER
seconds, without trying again; /models/load tries at once); the others keep serving. Below the server
nothing knows there are several models: each is its own vSurge with its own engine.

`--models-memory-budget GiB` bounds what the loaded models hold (weights, KV pool and recurrent
states, as /v1/stats counts them): before a load, idle models are unloaded, least recently used first,
until the loaded ones and the new one fit (the new one counted at its last load's size, or its weight
files' before its first); a model whose own size is above the budget is refused with that reason.

Each model keeps its LoRA adapters (`--lora` for the first model, a --models-config entry's "lora",
and those loaded at run time for it): an unloaded model's adapters come back with it, and a request
naming an adapter of an unloaded model loads that model.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import time
from pathlib import Path
from typing import Callable

from pydantic import BaseModel

from .errors import APIError
from .routes import ADMIN

log = logging.getLogger(__name__)

LOADED, LOADING, UNLOADED, FAILED = "loaded", "loading", "unloaded", "failed"
RETRY_FAILED_AFTER = 30.0  # seconds a model that failed to load answers with its error before it is tried again
DRAIN_HOLD = 0.5  # seconds a busy model refuses new requests after another model asked it to make way
HANDOUT_GRACE = 0.5  # seconds a model handed to a request counts as busy before the request reaches its driver


@dataclasses.dataclass(eq=False)
class ModelEntry:
    name: str
    path: str
    # (programs kept from its last load, its adapters) -> a started vSurge (blocking)
    build: Callable[[list | None, dict], object]
    state: str = UNLOADED
    error: str | None = None
    last_used: float = 0.0  # monotonic time of its last request (or its load)
    handed_at: float = -1e9  # monotonic time a request handler last took it
    loaded_at: float = -1e9  # monotonic time its last load finished
    failed_at: float = -1e9  # monotonic time its last load failed
    draining_until: float = -1e9  # another model waits for it to finish its requests: new ones wait their turn
    loads: int = 0
    load_seconds: float | None = None  # the last load's time, start to serving
    task: asyncio.Task | None = None
    # the compiled programs of its engines, kept when it is unloaded: reloading it skips tracing and compiling
    # them (the executables take the weights and state as arguments, they hold neither)
    programs: list[dict] | None = None
    adapters: dict[str, str] = dataclasses.field(default_factory=dict)  # its LoRA adapters: name -> path
    memory_bytes: int | None = None  # what it held when last loaded (weights + KV pool + states)


def models_in_dir(folder: str) -> list[tuple[str, str]]:
    """(name, path) of every model in `folder`, as llama.cpp's router finds them: each HF directory (a
    config.json) named by the directory, each .gguf file (not a multimodal projector) by its stem."""
    root = Path(folder)
    if not root.is_dir():
        raise ValueError(f"--models-dir {folder}: not a directory")
    found = []
    for item in sorted(root.iterdir()):
        if item.is_dir() and (item / "config.json").is_file():
            found.append((item.name, str(item)))
        elif item.suffix == ".gguf" and not item.name.startswith("mmproj"):
            found.append((item.stem, str(item)))
    return found


class ModelRouter:
    def __init__(self, server, max_loaded: int | None = None, sleep_idle_seconds: float | None = None,
                 load_timeout: float = 600.0, memory_budget: int | None = None, footprint=None):
        self.server = server
        self.entries: dict[str, ModelEntry] = {}
        self.max_loaded = max_loaded
        self.memory_budget = memory_budget  # bytes the loaded models may hold together (None: no bound)
        self.footprint = footprint or surge_memory  # a loaded vSurge -> its bytes
        self.sleep_idle_seconds = sleep_idle_seconds
        self.load_timeout = load_timeout
        self._lock: asyncio.Lock | None = None  # made on the serving loop
        self._idle_task: asyncio.Task | None = None

    # ------------------------------------------------------------ what it serves
    def add(self, name: str, path: str, build: Callable, loaded=None, adapters: dict | None = None) -> None:
        """A model the server may serve; `loaded`: its vSurge when it is running already; `adapters`: the
        LoRA adapters it serves (name -> path; a loaded one has them already)."""
        if name in self.entries:
            raise ValueError(f"two models are named {name!r}")
        entry = ModelEntry(name, path, build, last_used=time.monotonic(), adapters=dict(adapters or {}))
        if loaded is not None:
            entry.state = LOADED
            entry.memory_bytes = self.footprint(loaded)
            self.server.surges[name] = loaded
        self.entries[name] = entry

    def knows(self, name: str | None) -> bool:
        return name in self.entries

    def base_of(self, adapter: str | None) -> str | None:
        """The model serving LoRA adapter `adapter` (loaded or not), or None."""
        return next((e.name for e in self.entries.values() if adapter in e.adapters), None)

    def adapter_loaded(self, model: str, name: str, path: str) -> None:
        """An adapter was loaded for `model` at run time: it comes back with the model after an unload."""
        self.entries[model].adapters[name] = path

    def adapter_unloaded(self, model: str, name: str) -> bool:
        return self.entries[model].adapters.pop(name, None) is not None

    def draining(self, name: str) -> bool:
        return time.monotonic() < self.entries[name].draining_until

    def touch(self, name: str) -> None:
        entry = self.entries.get(name)
        if entry is not None:
            entry.last_used = entry.handed_at = time.monotonic()

    def describe(self) -> list[dict]:
        """Per model: name, state, path, loads and the last load's seconds (for /v1/models and /v1/stats)."""
        return [{"id": e.name, "state": e.state, "path": e.path, "loads": e.loads, "load_seconds": e.load_seconds,
                 "memory_bytes": e.memory_bytes, "adapters": sorted(e.adapters),
                 **({"error": e.error} if e.error else {})} for e in self.entries.values()]

    def collect(self):
        """/metrics series of the catalog: each model's state (1 for the state it is in), loads and memory."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        state = GaugeMetricFamily("vsurge:model_state", "1 for the state each model is in (loaded, loading, "
                                  "unloaded, failed)", labels=["model_name", "state"])
        loads = CounterMetricFamily("vsurge:model_loads", "times each model was loaded", labels=["model_name"])
        memory = GaugeMetricFamily("vsurge:model_memory_bytes", "weights + KV pool + states a model holds when "
                                   "loaded (as of its last load)", labels=["model_name"])
        for e in self.entries.values():
            for kind in (LOADED, LOADING, UNLOADED, FAILED):
                state.add_metric([e.name, kind], float(e.state == kind))
            loads.add_metric([e.name], e.loads)
            if e.memory_bytes is not None:
                memory.add_metric([e.name], e.memory_bytes)
        yield from (state, loads, memory)

    # ------------------------------------------------------------ loading and unloading
    def _loop_lock(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
            if self.sleep_idle_seconds and self._idle_task is None:
                self._idle_task = asyncio.get_running_loop().create_task(self._sleep_idle())
        return self._lock

    def _in_flight(self, name: str, making_room: bool = True) -> int:
        """Requests its driver holds, or 1 when a handler took it in the last HANDOUT_GRACE seconds (it may
        not have submitted yet: unloading it then would fail that request) or, when making room for another
        model, it finished loading that recently (the requests that waited for it have not taken it yet)."""
        surge = self.server.surges.get(name)
        if surge is None:
            return 0
        entry, now = self.entries[name], time.monotonic()
        recent = max(entry.handed_at, entry.loaded_at if making_room else -1e9)
        return surge.driver.num_live or int(now - recent < HANDOUT_GRACE)

    async def ensure_loaded(self, name: str, retry_failed: bool = False) -> None:
        """Return once `name` is loaded (loading it, and making room, if needed); APIError 503 when it failed
        to load or room could not be made within load_timeout. The lock is held only to decide, never while
        waiting, and the requests that waited for a load are served by it."""
        entry = self.entries[name]
        if entry.state == FAILED and not retry_failed and time.monotonic() - entry.failed_at < RETRY_FAILED_AFTER:
            # (not tried again on every request: under --max-loaded-models each try unloads a good model)
            raise APIError(503, f"model {name!r} failed to load: {entry.error}", "model",
                           {"Retry-After": str(int(RETRY_FAILED_AFTER))})
        deadline = time.monotonic() + self.load_timeout
        while True:
            if entry.state == LOADED and not self.draining(name):
                return
            task = None
            if entry.state != LOADED:
                async with self._loop_lock():
                    if entry.state != LOADED:
                        if entry.task is None or entry.task.done():
                            if await self._make_room(name):
                                entry.task = asyncio.get_running_loop().create_task(self._load(entry))
                        task = entry.task if entry.task is not None and not entry.task.done() else None
            if task is not None:
                await asyncio.wait_for(asyncio.shield(task), max(1.0, deadline - time.monotonic()))
                if entry.state == FAILED:
                    raise APIError(503, f"model {name!r} failed to load: {entry.error}", "model")
                if entry.state == LOADED:
                    return  # (served by the load it waited for, even if another model asks it to make way now)
                continue
            if time.monotonic() > deadline:
                raise APIError(503, f"model {name!r} cannot be loaded now: the loaded models keep requests in "
                                    "flight; retry later", "model", {"Retry-After": "5"})
            await asyncio.sleep(0.05)  # its turn: another model finishes its requests first

    async def _make_room(self, name: str) -> bool:
        """Unload least recently used idle models until one more fits under max_loaded and the memory budget
        -> True; False when every other loaded model is busy: the least recently used of them then takes no
        new requests for DRAIN_HOLD seconds (renewed while this model waits), so that it drains."""
        need = self._expected_bytes(self.entries[name])
        if self.memory_budget is not None and need > self.memory_budget:
            raise APIError(503, f"model {name!r} needs {need / 2**30:.2f} GiB, more than the "
                                f"--models-memory-budget of {self.memory_budget / 2**30:.2f} GiB", "model")
        while self.max_loaded is not None or self.memory_budget is not None:
            loaded = [e for e in self.entries.values() if e.state in (LOADED, LOADING) and e.name != name]
            held = sum(self._expected_bytes(e) for e in loaded)
            if ((self.max_loaded is None or len(loaded) < self.max_loaded)
                    and (self.memory_budget is None or held + need <= self.memory_budget)):
                return True
            idle = sorted((e for e in loaded if e.state == LOADED and self._in_flight(e.name) == 0),
                          key=lambda e: e.last_used)
            if not idle:
                running = [e for e in loaded if e.state == LOADED]
                if running:
                    min(running, key=lambda e: e.last_used).draining_until = time.monotonic() + DRAIN_HOLD
                return False
            await self._unload(idle[0])
        return True

    def _expected_bytes(self, entry: ModelEntry) -> int:
        """What `entry` holds loaded: its last load's footprint, else its weight files' size."""
        return entry.memory_bytes if entry.memory_bytes is not None else weight_file_bytes(entry.path)

    async def _load(self, entry: ModelEntry) -> None:
        entry.state, entry.error = LOADING, None
        start = time.perf_counter()
        log.info("loading model %s (%s)", entry.name, entry.path)
        try:
            surge = await asyncio.to_thread(entry.build, entry.programs, dict(entry.adapters))
        except BaseException as exc:  # noqa: BLE001: a model that fails to load fails only its own requests
            log.exception("model %s failed to load", entry.name)
            entry.state, entry.error, entry.failed_at = FAILED, str(exc) or type(exc).__name__, time.monotonic()
            return
        self.server.adopt(entry.name, surge)
        entry.adapters = {n: p for n, p in entry.adapters.items() if surge.adapter(n) is not None}  # (unreadable now)
        entry.memory_bytes = self.footprint(surge)
        entry.state, entry.loads = LOADED, entry.loads + 1
        entry.load_seconds = time.perf_counter() - start
        entry.last_used = entry.loaded_at = time.monotonic()
        log.info("model %s loaded in %.1f s (%.2f GiB)", entry.name, entry.load_seconds, entry.memory_bytes / 2**30)
        if self.memory_budget is not None:
            async with self._loop_lock():
                await self._trim(entry)

    async def _trim(self, keep: ModelEntry) -> None:
        """After a load measured above its estimate: unload idle models, least recently used first, while the
        loaded ones hold more than the budget (a model with requests in flight stays)."""
        while True:
            loaded = [e for e in self.entries.values() if e.state == LOADED]
            if sum(self._expected_bytes(e) for e in loaded) <= self.memory_budget:
                return
            idle = sorted((e for e in loaded if e is not keep and self._in_flight(e.name) == 0),
                          key=lambda e: e.last_used)
            if not idle:
                log.warning("the loaded models hold more than --models-memory-budget; the busy ones stay loaded")
                return
            await self._unload(idle[0])

    async def _unload(self, entry: ModelEntry) -> None:
        surge = self.server.surges.pop(entry.name, None)
        entry.state, entry.draining_until = UNLOADED, -1e9
        if surge is not None:
            log.info("unloading model %s", entry.name)
            entry.programs = [dict(engine._compiled) for engine in surge.driver.engines]
            await asyncio.to_thread(surge.stop, 30.0)
            del surge
            gc.collect()  # the weights and KV pool go with the last references

    async def load(self, name: str) -> None:
        """POST /models/load (a model that failed to load is tried again at once)."""
        if name not in self.entries:
            raise APIError(404, f"The model `{name}` does not exist.", "model", code="model_not_found")
        await self.ensure_loaded(name, retry_failed=True)

    async def unload(self, name: str) -> None:
        """POST /models/unload: refused (409) while it has requests in flight."""
        entry = self.entries.get(name)
        if entry is None:
            raise APIError(404, f"The model `{name}` does not exist.", "model", code="model_not_found")
        async with self._loop_lock():
            if entry.state != LOADED:
                return
            busy = self._in_flight(name, making_room=False)
            if busy:
                raise APIError(409, f"model {name!r} has {busy} requests in flight", "model")
            await self._unload(entry)

    async def _sleep_idle(self) -> None:
        """Unload models nobody asked for in sleep_idle_seconds (checked every second)."""
        while True:
            await asyncio.sleep(min(1.0, self.sleep_idle_seconds / 4))
            now = time.monotonic()
            async with self._loop_lock():
                for entry in list(self.entries.values()):
                    if (entry.state == LOADED and now - entry.last_used >= self.sleep_idle_seconds
                            and self._in_flight(entry.name) == 0):
                        await self._unload(entry)


def surge_memory(surge) -> int:
    """Bytes a loaded model holds: weights, KV pool and recurrent states (as /v1/stats counts them)."""
    from .stats import memory_fields

    fields = memory_fields(surge)
    return fields["weight_bytes"] + fields["kv_cache_bytes"] + fields["state_cache_bytes"]


def weight_file_bytes(path: str) -> int:
    """The size of a model's weight files (a .gguf file, or an HF directory's safetensors/bin files): what
    the router expects a model to hold before its first load tells it (the KV pool comes on top)."""
    item = Path(path)
    if item.is_file():
        return item.stat().st_size
    if item.is_dir():
        return sum(f.stat().st_size for f in item.iterdir() if f.suffix in (".safetensors", ".bin", ".gguf"))
    return 0


class ModelRequest(BaseModel):
    model: str


def install_model_routes(table, server) -> None:
    """llama.cpp's router routes: POST /models/load and /models/unload {"model": NAME}."""
    def router():
        if server.router is None:
            raise APIError(400, "this server serves a fixed set of models (start it with several --model or "
                                "--models-dir to load and unload them)", "model")
        return server.router

    @table.post("/models/load", ADMIN)
    async def load_model(body: ModelRequest):
        await router().load(body.model)
        return {"success": True, "model": body.model}

    @table.post("/models/unload", ADMIN)
    async def unload_model(body: ModelRequest):
        await router().unload(body.model)
        return {"success": True, "model": body.model}
