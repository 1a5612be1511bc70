"""The FastAPI application: middleware (body size, API key), OpenAI error JSON, and routes.

Each route is one line: the handlers are methods of the server (handlers.py),
as in the seed's vSurgeApiServer.
"""

from __future__ import annotations

import hmac

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from .errors import APIError, error_response, validation_message
from .protocol import (ChatCompletionRequest, CompletionRequest, CountTokensRequest, DetokenizeRequest,
                       TokenizeRequest)
from .web import install_web_routes

MAX_BODY_BYTES = 8 * 1024 * 1024


def _authorized(header: str, api_key: str) -> bool:
    """Constant-time comparison: the time taken never tells how much of a guess was right."""
    return hmac.compare_digest(header.encode("utf-8", "surrogateescape"), f"Bearer {api_key}".encode())


def build_app(server) -> FastAPI:
    """`server` is the vSurgeApiServer: it owns the models, readiness, settings and handlers."""
    app = FastAPI(title="vsurge", version="0.1.0",
                  description="OpenAI-compatible serving of Llama-family models with JAX")

    @app.middleware("http")
    async def guard(request: Request, call_next):
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
            return error_response(413, f"the request body is larger than {MAX_BODY_BYTES} bytes")
        if request.url.path.startswith("/v1/") and server.api_key is not None:
            if not _authorized(request.headers.get("authorization", ""), server.api_key):
                return error_response(401, "invalid or missing API key (send 'Authorization: Bearer <key>')")
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def on_validation(_, exc: RequestValidationError):
        message, param = validation_message(exc.errors())
        return error_response(400, message, param)

    @app.exception_handler(StarletteHTTPException)
    async def on_http(_, exc: StarletteHTTPException):
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(APIError)
    async def on_api_error(_, exc: APIError):
        return error_response(exc.status, exc.message, exc.param, exc.headers)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest):
        return await server.chat_completions(body)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest):
        return await server.completions(body)

    @app.get("/v1/models")
    async def models():
        return await server.available_inference()

    @app.post("/v1/count_tokens")
    async def count_tokens(body: CountTokensRequest):
        return await server.count_tokens(body)

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest):
        return await server.tokenize(body)

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest):
        return await server.detokenize(body)

    @app.get("/liveness")
    async def liveness():
        return await server.liveness()

    @app.get("/readiness")
    async def readiness():
        return await server.readiness()

    @app.get("/health")
    async def health():
        return await server.health()

    @app.get("/metrics")
    async def metrics():
        return await server.metrics()

    install_web_routes(app, server)  # the chat page, the dashboard and /v1/stats
    return app
