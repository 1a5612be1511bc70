"""The FastAPI application: middleware (body size, API keys), error JSON (OpenAI's, Anthropic's on
/v1/messages), and routes.

Each route is declared once, with who may call it (routes.py: PUBLIC, GUARDED, ADMIN, METRICS; the
guard checks keys by it). The handlers are methods of the server (handlers.py), as in the seed's
vSurgeApiServer; the other files' routes are declared by their install_* functions on the same table.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from .errors import APIError, error_response, validation_error
from .guard import Guard
from .routes import GUARDED, METRICS, PUBLIC, RouteTable
from .adapters.chat import ChatCompletionRequest
from .adapters.completions import CompletionRequest
from .adapters.embeddings import EmbeddingRequest
from .adapters.messages import MessagesCountTokensRequest
from .adapters.messages import MessagesRequest
from .adapters.responses import ResponsesRequest
from .protocol import CountTokensRequest, DetokenizeRequest, TokenizeRequest
from .cache_slots import install_cache_routes
from .lora_routes import install_lora_routes
from .router import install_model_routes
from .web import install_web_routes


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

    @table.post("/v1/chat/completions", GUARDED)
    async def chat_completions(body: ChatCompletionRequest):
        return await server.chat_completions(body)

    @table.post("/v1/completions", GUARDED)
    async def completions(body: CompletionRequest):
        return await server.completions(body)

    @table.post("/v1/responses", GUARDED)
    async def responses(body: ResponsesRequest):
        return await server.responses(body)

    @table.get("/v1/responses/{response_id}", GUARDED)
    async def get_response(response_id: str):
        return await server.get_response(response_id)

    @table.delete("/v1/responses/{response_id}", GUARDED)
    async def delete_response(response_id: str):
        return await server.delete_response(response_id)

    @table.post("/v1/messages", GUARDED)
    async def messages(body: MessagesRequest):
        return await server.messages(body)

    @table.post("/v1/messages/count_tokens", GUARDED)
    async def messages_count_tokens(body: MessagesCountTokensRequest):
        return await server.messages_count_tokens(body)

    @table.post("/v1/embeddings", GUARDED)
    async def embeddings(body: EmbeddingRequest):
        return await server.embeddings(body)

    @table.get("/v1/models", GUARDED)
    async def models():
        return await server.available_inference()

    @table.get("/v1/models/{model:path}", GUARDED)
    async def model(model: str):
        return await server.model_info(model)

    @table.post("/v1/count_tokens", GUARDED)
    async def count_tokens(body: CountTokensRequest):
        return await server.count_tokens(body)

    @table.post("/tokenize", GUARDED)
    async def tokenize(body: TokenizeRequest):
        return await server.tokenize(body)

    @table.post("/detokenize", GUARDED)
    async def detokenize(body: DetokenizeRequest):
        return await server.detokenize(body)

    @table.get("/liveness", PUBLIC)
    async def liveness():
        return await server.liveness()

    @table.get("/readiness", PUBLIC)
    async def readiness():
        return await server.readiness()

    @table.get("/health", PUBLIC)
    async def health():
        return await server.health()

    @table.get("/metrics", METRICS)
    async def metrics():
        return await server.metrics()

    install_cache_routes(table, server)  # named prompt caches over the disk tier (cache_slots.py)
    install_lora_routes(table, server)  # runtime LoRA adapters (lora_routes.py)
    install_model_routes(table, server)  # loading and unloading models (router.py)
    install_web_routes(table, server)  # the chat page, the dashboard and /v1/stats
    return app
