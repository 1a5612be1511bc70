"""LoRA adapters over HTTP: their /metrics series, and vLLM's runtime adapter routes:
POST /v1/load_lora_adapter {lora_name, lora_path} and
POST /v1/unload_lora_adapter {lora_name}; `model` (optional) names the base model when a server has
several (an unloaded one is loaded first, and keeps the adapter across unloads: server/router.py).
Adapters are read in a worker thread (the event loop keeps serving).

Both routes are ADMIN routes (server/routes.py) and answer only when the server was asked for runtime
loading (`--allow-runtime-lora` or `--enable-lora`; vLLM keeps it behind an opt-in too): `--lora` and
`--max-loras` alone serve the adapters named at start. With `--lora-dir DIR` a `lora_path` is read
relative to DIR and must resolve inside it (no `..`, no symbolic link out of it)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from fastapi.responses import PlainTextResponse
from pydantic import BaseModel

from ..lora.adapter import AdapterError
from .errors import APIError
from .routes import ADMIN


class LoadLoraRequest(BaseModel):
    lora_name: str
    lora_path: str
    model: str | None = None


class UnloadLoraRequest(BaseModel):
    lora_name: str
    model: str | None = None


def adapter_metrics(surges: dict):
    """/metrics series of each model's adapter slots: the adapters on the device with their running requests,
    and how many times an adapter was copied to the device (a slot miss)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    running = GaugeMetricFamily("vsurge:lora_adapter_running_requests", "requests running with each LoRA "
                                "adapter in a device slot", labels=["model_name", "adapter"])
    loads = CounterMetricFamily("vsurge:lora_adapter_slot_loads", "LoRA adapters copied into a device slot",
                                labels=["model_name"])
    serving = {name: surge for name, surge in surges.items() if surge.serves_adapters}
    for name, surge in serving.items():
        for adapter, count in surge.resident_adapters().items():
            running.add_metric([name, adapter], count)
        loads.add_metric([name], surge.adapter_slot_loads)
    if serving:
        yield from (running, loads)


async def _base(server, model: str | None):
    if model is not None:
        if server.router is not None and server.router.knows(model):
            await server.router.ensure_loaded(model)
        surge = server.surges.get(model)
        if surge is None:
            raise APIError(404, f"The model `{model}` does not exist.", "model", code="model_not_found")
        return surge
    for surge in server.surges.values():
        if surge.serves_adapters:
            return surge
    raise APIError(400, "this server serves no LoRA adapters: start it with --enable-lora, --lora or --max-loras",
                   "lora_name")


def _check_runtime_loading(server) -> None:
    if not server.allow_runtime_lora:
        raise APIError(403, "runtime LoRA adapter loading is off: start the server with --allow-runtime-lora "
                            "(or --enable-lora), and --lora-dir DIR to keep adapters to one folder", "lora_path")


def adapter_path(lora_path: str, lora_dir: str | None) -> str:
    """The folder to read: `lora_path` itself, or under `--lora-dir` the path it resolves to there (relative
    paths are read from the folder), refused when it resolves outside it."""
    if lora_dir is None:
        return lora_path
    root = Path(lora_dir).resolve()
    if "\0" in lora_path:
        raise APIError(400, "'lora_path' holds a NUL character", "lora_path")
    resolved = (root / lora_path).resolve()  # follows every symbolic link and `..`
    if resolved != root and not resolved.is_relative_to(root):
        raise APIError(400, f"lora_path {lora_path!r} is outside the server's --lora-dir", "lora_path")
    return str(resolved)


async def load_runtime_adapter(server, name: str, lora_path: str, model: str | None) -> None:
    """Read adapter `name` from `lora_path` (under --lora-dir when set) and serve it over `model` (None: the
    first model serving adapters), as POST /v1/load_lora_adapter does; raises APIError (4xx) naming what is
    wrong. A Ray Serve replica calls it too: loading on demand an adapter the cluster was asked to load."""
    if name in server.surges or (server.router is not None and server.router.knows(name)):
        raise APIError(400, f"{name!r} is a model's name; give the adapter another", "lora_name")
    path = adapter_path(lora_path, server.lora_dir)
    surge = await _base(server, model)
    try:
        await asyncio.to_thread(surge.load_adapter, name, path)
    except (AdapterError, ValueError, OSError) as exc:  # any unreadable adapter is the request's fault
        raise APIError(400, str(exc), "lora_path") from None
    if server.router is not None:
        server.router.adapter_loaded(server.name_of(surge), name, path)


def forget_adapter(server, name: str) -> bool:
    """Stop serving adapter `name` on every loaded model and drop it from the router's record (requests in
    flight with it finish); False when no model served it."""
    dropped = [surge.unload_adapter(name) for surge in server.surges.values() if surge.serves_adapters]
    recorded = False
    if server.router is not None:
        base = server.router.base_of(name)
        recorded = base is not None and server.router.adapter_unloaded(base, name)
    return any(dropped) or recorded


def install_lora_routes(table, server) -> None:
    @table.post("/v1/load_lora_adapter", ADMIN)
    async def load_lora_adapter(body: LoadLoraRequest):
        _check_runtime_loading(server)
        await load_runtime_adapter(server, body.lora_name, body.lora_path, body.model)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @table.post("/v1/unload_lora_adapter", ADMIN)
    async def unload_lora_adapter(body: UnloadLoraRequest):
        _check_runtime_loading(server)
        router = server.router
        base = body.model or (router.base_of(body.lora_name) if router is not None else None)
        if router is not None and base is not None and base not in server.surges and router.knows(base):
            if router.adapter_unloaded(base, body.lora_name):  # (its model is not loaded: only forgotten)
                return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")
        surge = await _base(server, base)
        if router is not None:
            router.adapter_unloaded(server.name_of(surge), body.lora_name)
        if not surge.unload_adapter(body.lora_name):
            raise APIError(404, f"no LoRA adapter named {body.lora_name!r} is loaded", "lora_name",
                           code="model_not_found")
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")
