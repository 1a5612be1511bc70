"""LoRA adapters over HTTP: their /metrics series, and vLLM's runtime adapter routes:
POST /v1/load_lora_adapter {lora_name, lora_path} and
POST /v1/unload_lora_adapter {lora_name}; `model` (optional) names the base model when a server has
several (an unloaded one is loaded first, and keeps the adapter across unloads: server/router.py).
Adapters are read in a worker thread (the event loop keeps serving)."""

from __future__ import annotations

import asyncio

from fastapi.responses import PlainTextResponse
from pydantic import BaseModel

from ..lora.adapter import AdapterError
from .errors import APIError


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


def install_lora_routes(app, server) -> None:
    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(body: LoadLoraRequest):
        if body.lora_name in server.surges or (server.router is not None and server.router.knows(body.lora_name)):
            raise APIError(400, f"{body.lora_name!r} is a model's name; give the adapter another", "lora_name")
        surge = await _base(server, body.model)
        try:
            await asyncio.to_thread(surge.load_adapter, body.lora_name, body.lora_path)
        except AdapterError as exc:
            raise APIError(400, str(exc), "lora_path") from None
        if server.router is not None:
            server.router.adapter_loaded(server.name_of(surge), body.lora_name, body.lora_path)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(body: UnloadLoraRequest):
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
