"""The FastAPI application: middleware (body size, API key), error JSON (OpenAI's, Anthropic's on
/v1/messages), and routes.

Each route is one line: the handlers are methods of the server (handlers.py),
as in the seed's vSurgeApiServer.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from .errors import APIError, error_response, validation_error
from .guard import Guard
from .adapters.chat import ChatCompletionRequest
from .adapters.completions import CompletionRequest
from .adapters.embeddings import EmbeddingRequest
from .adapters.messages import CountTokensRequest as MessagesCountTokensRequest
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

    app.add_middleware(Guard, server=server)

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

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest):
        return await server.chat_completions(body)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest):
        return await server.completions(body)

    @app.post("/v1/responses")
    async def responses(body: ResponsesRequest):
        return await server.responses(body)

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str):
        return await server.get_response(response_id)

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str):
        return await server.delete_response(response_id)

    @app.post("/v1/messages")
    async def messages(body: MessagesRequest):
        return await server.messages(body)

    @app.post("/v1/messages/count_tokens")
    async def messages_count_tokens(body: MessagesCountTokensRequest):
        return await server.messages_count_tokens(body)

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest):
        return await server.embeddings(body)

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

    install_cache_routes(app, server)  # named prompt caches over the disk tier (cache_slots.py)
    install_lora_routes(app, server)  # runtime LoRA adapters (lora_routes.py)
    install_model_routes(app, server)  # loading and unloading models (router.py)
    install_web_routes(app, server)  # the chat page, the dashboard and /v1/stats
    return app
