"""The FastAPI application: middleware (body size, API keys), error JSON (OpenAI's, Anthropic's on
/v1/messages), and routes.

Each route is declared once, with who may call it (routes.py: PUBLIC, GUARDED, ADMIN, METRICS; the guard
checks keys by it) and what answers it: the wire formats' in their adapter modules (adapters/*.py: ROUTES), the
server's own in ROUTES below (its methods, handlers.py, as in the seed's vSurgeApiServer), the other files' by
their install_* functions on the same table.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from .errors import APIError, error_response, validation_error
from .guard import Guard
from .adapters import adapter_routes
from .routes import GUARDED, METRICS, PUBLIC, RouteTable
from .cache_slots import install_cache_routes
from .lora_routes import install_lora_routes
from .router import install_model_routes
from .web import install_web_routes


# The server's own routes: (method, path, who may call it, the server's handler method: handlers.py). The wire
# formats' routes are declared by their adapter modules (adapters/: ROUTES), the other files' by their install_*
# functions on the same table.
ROUTES = [
    ("GET", "/v1/models", GUARDED, "available_inference"),
    ("GET", "/v1/models/{model:path}", GUARDED, "model_info"),
    ("POST", "/v1/count_tokens", GUARDED, "count_tokens"),
    ("POST", "/tokenize", GUARDED, "tokenize"),
    ("POST", "/detokenize", GUARDED, "detokenize"),
    ("GET", "/liveness", PUBLIC, "liveness"),
    ("GET", "/readiness", PUBLIC, "readiness"),
    ("GET", "/health", PUBLIC, "health"),
    ("GET", "/metrics", METRICS, "metrics"),
]


def build_app(server) -> FastAPI:
    """`server` is the vSurgeApiServer: it owns the models, readiness, settings and handlers."""
    app = FastAPI(title="vsurge", version="0.1.0",
                  description="OpenAI-compatible serving of Llama-family models with JAX")

    app.add_middleware(Guard, server=server, routes=app.router.routes)
    table = RouteTable(app)

    @app.exception_handler(RequestValidationError)
    async def on_validation(request: Request, exc: RequestValidationError):
        message, param, code = validation_error(exc.errors())
        return error_response(400, message, param, path=request.url.path, code=code)

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, exc: StarletteHTTPException):
        return error_response(exc.status_code, str(exc.detail), path=request.url.path)

    @app.exception_handler(APIError)
    async def on_api_error(request: Request, exc: APIError):
        return error_response(exc.status, exc.message, exc.param, exc.headers, path=request.url.path,
                              code=exc.code)

    for route in adapter_routes():  # the wire formats' routes, each declared by its adapter module
        table.route(route.method, route.path, route.access)(route.endpoint(server))
    for method, path, access, handler in ROUTES:  # FastAPI reads each handler's signature: body model, path params
        table.route(method, path, access)(getattr(server, handler))
    install_cache_routes(table, server)  # named prompt caches over the disk tier (cache_slots.py)
    install_lora_routes(table, server)  # runtime LoRA adapters (lora_routes.py)
    install_model_routes(table, server)  # loading and unloading models (router.py)
    install_web_routes(table, server)  # the chat page, the dashboard and /v1/stats
    return app
