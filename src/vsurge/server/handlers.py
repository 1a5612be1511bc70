"""The OpenAI-compatible handlers, as methods of the server (the seed's vSurgeApiServer has
`chat_completions`, `completions`, `count_tokens`, `available_inference`, `liveness`
and `readiness`); app.py routes HTTP requests to them.

The event loop only parses, validates and formats: generation runs on the
drivers' threads, and tokenization of large inputs runs in a worker pool.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from ..tokenizer.chat_template import ChatTemplateError
from ..tokenizer.compat import chat_prompt_ids
from .adapters import chat, completions
from .adapters.common import generation_failed
from .errors import APIError, error_response
from .formatting import Formatter
from .generation import ChoiceStreams, collect, event_stream
from .protocol import CountTokenRequest, DetokenizeRequest, TokenizeRequest, messages_as_dicts


class OpenAIHandlers:
    """Mixed into vSurgeApiServer: self.surges, get(), name_of(), ready, draining, tool_call_parser."""

    router = None  # server/router.py ModelRouter: models loaded on demand, unloaded when idle (None: all loaded)
    tool_call_parser: str = "auto"
    reasoning_parser: str | None = None  # `--reasoning-parser`: deepseek_r1 | qwen3 | gpt_oss (None: no reasoning split)
    # served name -> GenerationDefaults for the sampling fields a request leaves unset (`vsurge serve
    # --generation-config`); a model without an entry gets OpenAI's defaults
    generation_defaults: dict | None = None
    # served name -> "mean" | "last": how /v1/embeddings pools a model's final hidden states (`--pooling`);
    # a model without an entry: its last token
    pooling: dict | None = None

    # ------------------------------------------------------------ helpers
    async def surge_for(self, model: str | None):
        """The vSurge serving `model` (a model's name or a LoRA adapter's); a known model that is not loaded
        is loaded first (server/router.py: the request waits, bounded). None (not given) is the first model."""
        if model == "":
            raise APIError(400, "model must be a model's name, not an empty string", "model")
        surge = self.get(model)
        if self.router is not None:
            # a model of the router, or an adapter of one (loaded with its model)
            base = model if self.router.knows(model) else self.router.base_of(model)
            if base is not None and (surge is None or self.router.draining(base)):
                await self.router.ensure_loaded(base)
                surge = self.get(model)
        if surge is None:
            raise APIError(404, f"The model `{model}` does not exist.", "model", code="model_not_found")
        if self.router is not None:
            self.router.touch(self.name_of(getattr(surge, "base", surge)))
        if self.draining or not surge.ready:
            raise APIError(503, "the model is not ready (starting, compiling or shutting down)", None,
                           {"Retry-After": "1"})
        return surge

    def defaults_for(self, surge):
        """The sampling defaults of the model serving `surge` (an adapter's are its base model's)."""
        return (self.generation_defaults or {}).get(self.name_of(getattr(surge, "base", surge)))

    def pooling_for(self, surge) -> str:
        return (self.pooling or {}).get(self.name_of(surge), "last")

    @staticmethod
    async def respond(streams: ChoiceStreams, fmt: Formatter, body):
        """Start the streams, then answer as OpenAI chat/completions: whole JSON or server-sent events."""
        streams.start_or_refuse()
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(event_stream(streams, fmt, include_usage), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        try:
            return JSONResponse(await collect(streams, fmt))
        except RuntimeError as exc:  # the engine failed mid-request: say why, with the failure's status
            raise generation_failed(exc) from None

    # ------------------------------------------------------------ the seed's handlers
    async def chat_completions(self, request: "chat.ChatCompletionRequest"):
        """POST /v1/chat/completions."""
        return await chat.respond(self, request)

    async def completions(self, request: "completions.CompletionRequest"):
        """POST /v1/completions."""
        return await completions.respond(self, request)

    async def available_inference(self):
        """GET /v1/models."""
        data = []
        described = self.router.describe() if self.router is not None else []
        states = {e["id"]: e["state"] for e in described}
        for name, surge in self.surges.items():
            data.append({"id": name, "object": "model", "created": self.started_at, "owned_by": "vsurge",
                         "root": name, "parent": None, "max_model_len": surge.max_length,
                         "status": {"value": states.get(name, "loaded")}})
            for adapter in surge.adapter_names:  # LoRA adapters, as vLLM lists them
                found = surge.adapter(adapter)
                data.append({"id": adapter, "object": "model", "created": self.started_at, "owned_by": "vsurge",
                             "root": found.path if found else adapter, "parent": name,
                             "max_model_len": surge.max_length})
        for entry in described:
            name = entry["id"]  # models the router may load on demand (llama.cpp's router lists them)
            if name not in self.surges:
                data.append({"id": name, "object": "model", "created": self.started_at, "owned_by": "vsurge",
                             "root": name, "parent": None, "status": {"value": entry["state"]}})
                data += [{"id": adapter, "object": "model", "created": self.started_at, "owned_by": "vsurge",
                          "root": adapter, "parent": name} for adapter in entry["adapters"]]
        return {"object": "list", "data": data}

    async def model_info(self, model: str):
        """GET /v1/models/{model}: the model object of a served model or adapter (404 for any other)."""
        for entry in (await self.available_inference())["data"]:
            if entry["id"] == model:
                return entry
        raise APIError(404, f"The model `{model}` does not exist.", "model", code="model_not_found")

    async def count_tokens(self, request: CountTokenRequest):
        """POST /v1/count_tokens."""
        surge = await self.surge_for(request.model)
        try:
            if request.messages is not None:
                count = len(chat_prompt_ids(surge.processor, messages_as_dicts(request.messages)))
            elif request.prompt is not None or request.text is not None:
                count = len(surge.processor.encode(request.prompt if request.prompt is not None else request.text))
            else:
                raise APIError(400, "give 'messages', 'prompt' or 'text'")
        except (ValueError, ChatTemplateError) as exc:
            raise APIError(400, str(exc)) from None
        return {"model": self.name_of(surge), "count": count}

    async def liveness(self):
        """GET /liveness: the process is up."""
        return {"status": "alive"}

    async def readiness(self):
        """GET /readiness: every model compiled and running (else 503)."""
        if self.ready:
            return {"status": "ready"}
        return error_response(503, self.not_ready_reason(), headers={"Retry-After": "1"})

    # ------------------------------------------------------------ vLLM-style utility routes
    async def tokenize(self, request: TokenizeRequest):
        surge = await self.surge_for(request.model)
        try:
            if request.messages is not None:
                tokens = chat_prompt_ids(surge.processor, messages_as_dicts(request.messages))
            elif request.prompt is not None:
                tokens = surge.processor.encode(request.prompt, add_special_tokens=request.add_special_tokens is not False)
            else:
                raise APIError(400, "give 'prompt' or 'messages'")
        except (ValueError, ChatTemplateError) as exc:
            raise APIError(400, str(exc)) from None
        return {"tokens": tokens, "count": len(tokens), "max_model_len": surge.max_length}

    async def detokenize(self, request: DetokenizeRequest):
        surge = await self.surge_for(request.model)
        vocab = surge.engine.vocab_size
        bad = [t for t in request.tokens if t >= vocab]
        if bad:
            raise APIError(400, f"token id {bad[0]} is out of range for the vocabulary of size {vocab}", "tokens")
        return {"prompt": surge.processor.decode(request.tokens)}

    async def health(self):
        if self.ready:
            return {"status": "ok", "models": list(self.surges)}
        return error_response(503, self.not_ready_reason(), headers={"Retry-After": "1"})

    async def metrics(self):
        return PlainTextResponse(self.metrics_text(), media_type="text/plain; version=0.0.4")
