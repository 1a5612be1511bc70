"""vLLM's runtime adapter routes: POST /v1/load_lora_adapter {lora_name, lora_path} and
POST /v1/unload_lora_adapter {lora_name}; `model` (optional) names the base model when a server has
several. Adapters are read in a worker thread (the event loop keeps serving)."""

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


def _base(server, model: str | None):
    if model is not None:
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
        surge = _base(server, body.model)
        if body.lora_name in server.surges:
            raise APIError(400, f"{body.lora_name!r} is a model's name; give the adapter another", "lora_name")
        try:
            await asyncio.to_thread(surge.load_adapter, body.lora_name, body.lora_path)
        except AdapterError as exc:
            raise APIError(400, str(exc), "lora_path") from None
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(body: UnloadLoraRequest):
        surge = _base(server, body.model)
        if not surge.unload_adapter(body.lora_name):
            raise APIError(404, f"no LoRA adapter named {body.lora_name!r} is loaded", "lora_name",
                           code="model_not_found")
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")
