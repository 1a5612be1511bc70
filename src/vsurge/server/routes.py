"""The route table: every route is declared with who may call it (docs/security.md).

    PUBLIC   anyone: liveness, readiness, health, the web pages and their static files
    GUARDED  `--api-key` (or `--admin-api-key`) when one is set: every API route
    ADMIN    `--admin-api-key` when set, else `--api-key`: loading and unloading models and LoRA adapters,
             saving and restoring named prompt caches (they take memory and read the server's disks)
    METRICS  /metrics: PUBLIC, or GUARDED under `--guard-metrics`

The level is kept on the route object (`route.access`), beside its path and method; server/guard.py
finds the route a request is for and checks the key its level asks for. A route added to the app
without this table (FastAPI's own /openapi.json and /docs) has no level and counts as GUARDED.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from typing import Callable

from starlette.routing import Match

PUBLIC, GUARDED, ADMIN, METRICS = "public", "guarded", "admin", "metrics"
LEVELS = (PUBLIC, GUARDED, ADMIN, METRICS)


class RouteTable:
    """Declares routes on a FastAPI app, each with its access level: `@table.post("/path", GUARDED)`."""

    def __init__(self, app):
        self.app = app

    def route(self, method: str, path: str, access: str, **kwargs):
        if access not in LEVELS:
            raise ValueError(f"unknown access level {access!r} for {method} {path}")

        def declare(endpoint):
            self.app.add_api_route(path, endpoint, methods=[method], **kwargs)
            self.app.router.routes[-1].access = access
            return endpoint

        return declare

    def get(self, path: str, access: str, **kwargs):
        return self.route("GET", path, access, **kwargs)

    def post(self, path: str, access: str, **kwargs):
        return self.route("POST", path, access, **kwargs)

    def delete(self, path: str, access: str, **kwargs):
        return self.route("DELETE", path, access, **kwargs)

    def mount(self, path: str, asgi_app, access: str, name: str) -> None:
        self.app.mount(path, asgi_app, name=name)
        self.app.router.routes[-1].access = access


@dataclasses.dataclass(frozen=True)
class Route:
    """One route an adapter module declares in its ROUTES (server/adapters/): `answer(server, ...)` answers it;
    `name` names its operation in the OpenAPI document."""

    method: str
    path: str
    access: str
    answer: Callable
    name: str

    def endpoint(self, server):
        """`answer` with `server` bound, as FastAPI reads an endpoint: the other parameters' signature, with their
        annotations resolved in the adapter's module (its body models)."""
        hints = typing.get_type_hints(self.answer)
        params = [p.replace(annotation=hints.get(p.name, p.annotation))
                  for p in list(inspect.signature(self.answer).parameters.values())[1:]]
        answer = self.answer

        async def endpoint(**kwargs):
            return await answer(server, **kwargs)

        endpoint.__signature__ = inspect.Signature(params)
        endpoint.__name__, endpoint.__doc__ = self.name, answer.__doc__
        return endpoint


def access_of(routes, scope) -> str:
    """The access level of the route `scope` is for (a path that matches only under another method
    counts too: its 405 is no more open than its route); GUARDED for a path no declared route matches."""
    partial = None
    for route in routes:
        match, _ = route.matches(scope)
        if match == Match.FULL:
            return getattr(route, "access", GUARDED)
        if match == Match.PARTIAL and partial is None:
            partial = getattr(route, "access", GUARDED)
    return partial or GUARDED
