"""The request guard: body size and API keys, checked before a request reaches its route.

Who may call a route is declared with the route (server/routes.py): PUBLIC routes take no key;
GUARDED ones take `--api-key` (or the admin key); ADMIN ones take `--admin-api-key` when it is set,
else `--api-key` (one key then guards everything); /metrics is PUBLIC unless `--guard-metrics`.
A refusal is 401 (no key, or a wrong one) or 403 (the plain key on an admin route), in the error
JSON of the API the path belongs to (errors.py).

A plain ASGI middleware rather than FastAPI's `@app.middleware("http")` (BaseHTTPMiddleware), which
wraps every request and every streamed chunk in extra tasks and memory streams.
"""

from __future__ import annotations

import hmac

from starlette.datastructures import Headers

from .errors import error_response
from .routes import ADMIN, GUARDED, METRICS, PUBLIC, access_of

MAX_BODY_BYTES = 64 * 1024 * 1024  # images travel as base64 in the body (OpenAI takes 50 MB per request)
HOW = "send 'Authorization: Bearer <key>' or 'x-api-key: <key>'"


def authorized(headers: Headers, api_key: str) -> bool:
    """`Authorization: Bearer KEY` (OpenAI) or `x-api-key: KEY` (Anthropic). Constant-time
    comparisons: the time taken never tells how much of a guess was right."""
    bearer = headers.get("authorization", "").encode("utf-8", "surrogateescape")
    key = headers.get("x-api-key", "").encode("utf-8", "surrogateescape")
    return hmac.compare_digest(bearer, f"Bearer {api_key}".encode()) | hmac.compare_digest(key, api_key.encode())


def key_refusal(access: str, headers: Headers, api_key: str | None, admin_key: str | None,
                guard_metrics: bool) -> tuple[int, str] | None:
    """(status, message) when a request for a route of level `access` may not pass; None when it may."""
    if access == METRICS:
        access = GUARDED if guard_metrics else PUBLIC
    if access == PUBLIC:
        return None
    if admin_key is not None and authorized(headers, admin_key):
        return None  # the admin key opens every route
    if access == ADMIN and admin_key is not None:
        if api_key is not None and authorized(headers, api_key):
            return 403, "this route needs the admin API key (--admin-api-key), not the API key"
        return 401, f"invalid or missing admin API key ({HOW})"
    key = api_key if api_key is not None else (admin_key if access == ADMIN else None)
    if key is None or authorized(headers, key):
        return None
    return 401, f"invalid or missing API key ({HOW})"


class Guard:
    """Rejects a too-large body (413) and a request without the key its route asks for (401/403), in
    the error JSON of the API the path belongs to; passes everything else through untouched.
    `routes`: the app's route list (read per request: routes added after the guard count)."""

    def __init__(self, app, server, routes):
        self.app, self.server, self.routes = app, server, routes

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            rejection = self._rejection(scope)
            if rejection is not None:
                return await rejection(scope, receive, send)
        await self.app(scope, receive, send)

    def _rejection(self, scope):
        path, headers = scope["path"], Headers(scope=scope)
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
            return error_response(413, f"the request body is larger than {MAX_BODY_BYTES} bytes", path=path)
        server = self.server
        api_key, admin_key = server.api_key, getattr(server, "admin_api_key", None)
        if api_key is None and admin_key is None:
            return None
        refusal = key_refusal(access_of(self.routes, scope), headers, api_key, admin_key,
                              getattr(server, "guard_metrics", False))
        if refusal is None:
            return None
        status, message = refusal
        return error_response(status, message, path=path)
