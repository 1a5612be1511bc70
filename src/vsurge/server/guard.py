"""The request guard: body size and API key, checked before a request reaches its route.

A plain ASGI middleware rather than FastAPI's `@app.middleware("http")` (BaseHTTPMiddleware), which
wraps every request and every streamed chunk in extra tasks and memory streams.
"""

from __future__ import annotations

import hmac

from starlette.datastructures import Headers

from .errors import error_response

MAX_BODY_BYTES = 64 * 1024 * 1024  # images travel as base64 in the body (OpenAI takes 50 MB per request)


def authorized(headers: Headers, api_key: str) -> bool:
    """`Authorization: Bearer KEY` (OpenAI) or `x-api-key: KEY` (Anthropic). Constant-time
    comparisons: the time taken never tells how much of a guess was right."""
    bearer = headers.get("authorization", "").encode("utf-8", "surrogateescape")
    key = headers.get("x-api-key", "").encode("utf-8", "surrogateescape")
    return hmac.compare_digest(bearer, f"Bearer {api_key}".encode()) | hmac.compare_digest(key, api_key.encode())


class Guard:
    """Rejects a too-large body (413) and, under /v1/, a missing or wrong API key (401), in the error
    JSON of the API the path belongs to; passes everything else through untouched."""

    def __init__(self, app, server):
        self.app, self.server = app, server

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
        api_key = self.server.api_key
        if path.startswith("/v1/") and api_key is not None and not authorized(headers, api_key):
            return error_response(401, "invalid or missing API key (send 'Authorization: Bearer <key>' or "
                                       "'x-api-key: <key>')", path=path)
        return None
