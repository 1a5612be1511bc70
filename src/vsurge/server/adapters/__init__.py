"""One adapter per wire format: its request body -> the one internal request, and the engine's
updates -> its wire events.

    chat.py         POST /v1/chat/completions   (OpenAI)
    completions.py  POST /v1/completions        (OpenAI, legacy)
    responses.py    POST /v1/responses          (OpenAI Responses; response_store.py keeps them)
    messages.py     POST /v1/messages           (Anthropic Messages)
    embeddings.py   POST /v1/embeddings         (OpenAI)

common.py holds what they share: the sampling fields every body carries (generated from
sampling/params.py), `GenerationRequest` (token ids + SamplingParams + structured output
and tools) and each choice's OutputParser (reasoning, content, tool calls).

Each wire format's module declares the routes it answers in `ROUTES` (server/routes.Route); app.py installs
every module's here, so a new endpoint is its adapter module (and its test).
"""

import importlib
import pkgutil


def adapter_routes() -> list:
    """Every adapter module's ROUTES (server/routes.Route), in module order."""
    routes = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        routes.extend(getattr(importlib.import_module(f"{__name__}.{info.name}"), "ROUTES", ()))
    return routes
