"""The FastAPI application: OpenAI-compatible routes, health, metrics, errors.

The event loop only parses, validates and formats: generation runs on the
drivers' threads, and tokenization of large inputs runs in a worker pool.
"""

from __future__ import annotations

import asyncio

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..engine.request import DriverNotReadyError, QueueFullError
from ..tokenizer.chat_template import ChatTemplateError
from ..tokenizer.compat import chat_prompt_ids
from .errors import APIError, error_response, validation_message
from .formatting import Formatter
from .generation import ChoiceStreams, collect, event_stream
from .protocol import (UNSUPPORTED_FIELDS, ChatCompletionRequest, CompletionRequest, CountTokensRequest,
                       DetokenizeRequest, TokenizeRequest, messages_as_dicts)
from .web import install_web_routes

MAX_BODY_BYTES = 8 * 1024 * 1024
_LARGE_INPUT_CHARS = 4000


def build_app(server) -> FastAPI:
    """`server` is the vSurgeApiServer: it owns the models, readiness and settings."""
    app = FastAPI(title="vsurge", version="0.1.0",
                  description="OpenAI-compatible serving of Llama-family models with JAX")

    # ------------------------------------------------------------ middleware & errors
    @app.middleware("http")
    async def guard(request: Request, call_next):
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
            return error_response(413, f"the request body is larger than {MAX_BODY_BYTES} bytes")
        if request.url.path.startswith("/v1/") and server.api_key is not None:
            if request.headers.get("authorization", "") != f"Bearer {server.api_key}":
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

    # ------------------------------------------------------------ helpers
    def surge_for(model: str | None):
        surge = server.get(model)
        if surge is None:
            raise APIError(404, f"The model `{model}` does not exist.", "model")
        if server.draining or not surge.ready:
            raise APIError(503, "the model is not ready (starting, compiling or shutting down)", None,
                           {"Retry-After": "1"})
        return surge

    def refuse_unsupported(body) -> None:
        extra = body.model_extra or {}
        for name in UNSUPPORTED_FIELDS:
            if extra.get(name) not in (None, [], {}):
                raise APIError(501, f"'{name}' is not implemented by vsurge", name)

    async def off_loop(fn, *args, large: bool):
        return await asyncio.to_thread(fn, *args) if large else fn(*args)

    async def run(streams: ChoiceStreams, fmt: Formatter, body):
        try:
            streams.start()
        except QueueFullError as exc:
            raise APIError(503, str(exc), None, {"Retry-After": "1"}) from None
        except DriverNotReadyError as exc:
            raise APIError(503, str(exc), None, {"Retry-After": "1"}) from None
        except (ValueError, TypeError) as exc:
            raise APIError(400, str(exc)) from None
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(event_stream(streams, fmt, include_usage), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        try:
            return JSONResponse(await collect(streams, fmt))
        except RuntimeError as exc:  # the engine failed mid-request (e.g. a lost multi-host follower): say why
            raise APIError(503 if isinstance(exc, DriverNotReadyError) else 500, f"generation failed: {exc}") from None

    def check_stream_options(body) -> None:
        if body.stream_options is not None and not body.stream:
            raise APIError(400, "stream_options can only be set when stream is true", "stream_options")

    # ------------------------------------------------------------ OpenAI routes
    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest):
        refuse_unsupported(body)
        check_stream_options(body)
        surge = surge_for(body.model)
        if body.top_logprobs is not None and not body.logprobs:
            raise APIError(400, "top_logprobs requires logprobs to be true", "top_logprobs")
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        try:
            params = body.sampling_params(body.max_completion_tokens or body.max_tokens, logprobs)
            messages = messages_as_dicts(body.messages)
            large = sum(len(m["content"]) for m in messages) > _LARGE_INPUT_CHARS
            ids = await off_loop(chat_prompt_ids, surge.processor, messages, large=large)
        except (ValueError, ChatTemplateError) as exc:
            raise APIError(400, str(exc)) from None
        fmt = Formatter("chat", server.name_of(surge), surge.processor)
        return await run(ChoiceStreams(surge, [ids], params), fmt, body)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest):
        refuse_unsupported(body)
        check_stream_options(body)
        surge = surge_for(body.model)
        if body.echo and body.logprobs is not None:
            raise APIError(400, "echo together with logprobs (prompt logprobs) is not supported", "echo")
        try:
            params = body.sampling_params(body.max_tokens if body.max_tokens is not None else 16, body.logprobs)
            prompts = await prompt_token_lists(surge, body.prompt)
        except ValueError as exc:
            raise APIError(400, str(exc)) from None
        echo = [surge.processor.decode(ids) for ids in prompts] if body.echo else None
        fmt = Formatter("completion", server.name_of(surge), surge.processor)
        return await run(ChoiceStreams(surge, prompts, params, echo), fmt, body)

    async def prompt_token_lists(surge, prompt) -> list[list[int]]:
        if isinstance(prompt, str):
            prompt = [prompt]
        if isinstance(prompt[0], int):
            return [list(prompt)]
        if isinstance(prompt[0], list):
            return [list(p) for p in prompt]
        if any(p == "" for p in prompt):
            raise ValueError("the prompt is empty")
        large = sum(len(p) for p in prompt) > _LARGE_INPUT_CHARS
        return [await off_loop(surge.processor.encode, p, large=large) for p in prompt]

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": server.started_at, "owned_by": "vsurge",
             "max_model_len": surge.max_length} for name, surge in server.surges.items()]}

    @app.post("/v1/count_tokens")
    async def count_tokens(body: CountTokensRequest):
        surge = surge_for(body.model)
        try:
            if body.messages is not None:
                count = len(chat_prompt_ids(surge.processor, messages_as_dicts(body.messages)))
            elif body.prompt is not None or body.text is not None:
                count = len(surge.processor.encode(body.prompt if body.prompt is not None else body.text))
            else:
                raise APIError(400, "give 'messages', 'prompt' or 'text'")
        except (ValueError, ChatTemplateError) as exc:
            raise APIError(400, str(exc)) from None
        return {"model": server.name_of(surge), "count": count}

    # ------------------------------------------------------------ vLLM-style utility routes
    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest):
        surge = surge_for(body.model)
        try:
            if body.messages is not None:
                tokens = chat_prompt_ids(surge.processor, messages_as_dicts(body.messages))
            elif body.prompt is not None:
                tokens = surge.processor.encode(body.prompt, add_special_tokens=body.add_special_tokens)
            else:
                raise APIError(400, "give 'prompt' or 'messages'")
        except (ValueError, ChatTemplateError) as exc:
            raise APIError(400, str(exc)) from None
        return {"tokens": tokens, "count": len(tokens), "max_model_len": surge.max_length}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest):
        surge = surge_for(body.model)
        vocab = surge.processor.vocab_size if hasattr(surge.processor, "vocab_size") else None
        bad = [t for t in body.tokens if vocab is not None and t >= vocab]
        if bad:
            raise APIError(400, f"token id {bad[0]} is out of range for the vocabulary of size {vocab}", "tokens")
        return {"prompt": surge.processor.decode(body.tokens)}

    # ------------------------------------------------------------ health
    @app.get("/liveness")
    async def liveness():
        return {"status": "alive"}

    @app.get("/readiness")
    async def readiness():
        if server.ready:
            return {"status": "ready"}
        return error_response(503, server.not_ready_reason(), headers={"Retry-After": "1"})

    @app.get("/health")
    async def health():
        if server.ready:
            return {"status": "ok", "models": list(server.surges)}
        return error_response(503, server.not_ready_reason(), headers={"Retry-After": "1"})

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(server.metrics_text(), media_type="text/plain; version=0.0.4")

    install_web_routes(app, server)  # the chat page, the dashboard and /v1/stats
    return app
