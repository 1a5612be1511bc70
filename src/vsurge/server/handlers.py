"""The OpenAI-compatible handlers, as methods of the server (the seed's vSurgeApiServer has
`chat_completions`, `completions`, `count_tokens`, `available_inference`, `liveness`
and `readiness`); app.py routes HTTP requests to them.

The event loop only parses, validates and formats: generation runs on the
drivers' threads, and tokenization of large inputs runs in a worker pool.
"""

from __future__ import annotations

import asyncio

from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from ..engine.request import DriverNotReadyError, QueueFullError
from ..structured.compiler import compiler_for
from ..structured.errors import ParamError
from ..structured.openai_fields import structured_request
from ..tokenizer.chat_template import ChatTemplateError
from ..tokenizer.compat import chat_prompt_ids
from .errors import APIError, error_response
from .formatting import Formatter
from .generation import ChoiceStreams, collect, event_stream
from .protocol import (UNSUPPORTED_FIELDS, ChatCompletionRequest, CompletionRequest, CountTokenRequest,
                       DetokenizeRequest, TokenizeRequest, messages_as_dicts)

_LARGE_INPUT_CHARS = 4000


async def _off_loop(fn, *args, large: bool, **kwargs):
    return await asyncio.to_thread(fn, *args, **kwargs) if large else fn(*args, **kwargs)


class OpenAIHandlers:
    """Mixed into vSurgeApiServer: self.surges, get(), name_of(), ready, draining, tool_call_parser."""

    tool_call_parser: str = "auto"
    # served name -> GenerationDefaults for the sampling fields a request leaves unset (`vsurge serve
    # --generation-config`); a model without an entry gets OpenAI's defaults
    generation_defaults: dict | None = None

    # ------------------------------------------------------------ helpers
    def surge_for(self, model: str | None):
        surge = self.get(model)
        if surge is None:
            raise APIError(404, f"The model `{model}` does not exist.", "model")
        if self.draining or not surge.ready:
            raise APIError(503, "the model is not ready (starting, compiling or shutting down)", None,
                           {"Retry-After": "1"})
        return surge

    def _defaults(self, surge):
        return (self.generation_defaults or {}).get(self.name_of(surge))

    @staticmethod
    def _refuse_unsupported(body) -> None:
        extra = body.model_extra or {}
        for name in UNSUPPORTED_FIELDS:
            if extra.get(name) not in (None, [], {}):
                raise APIError(501, f"'{name}' is not implemented by vsurge", name)
        if body.stream_options is not None and not body.stream:
            raise APIError(400, "stream_options can only be set when stream is true", "stream_options")

    @staticmethod
    async def _structured(body, surge):
        """The request's constraint and tools (ParamError -> 400 naming the field); the constraint is
        compiled here, so a bad schema fails now and the engine finds the grammar cached."""
        try:
            request = structured_request(body.model_dump(exclude_unset=True))
        except ParamError as exc:
            raise APIError(400, str(exc), exc.param) from None
        if request.constraint is not None:
            try:
                compiler = await asyncio.to_thread(compiler_for, surge.processor, surge.engine.vocab_size)
                await asyncio.to_thread(compiler.compile, request.constraint)
            except ValueError as exc:
                raise APIError(400, str(exc), request.source) from None
        return request

    @staticmethod
    async def _respond(streams: ChoiceStreams, fmt: Formatter, body):
        try:
            streams.start()
        except (QueueFullError, DriverNotReadyError) as exc:
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

    # ------------------------------------------------------------ the seed's handlers
    async def chat_completions(self, request: ChatCompletionRequest):
        """POST /v1/chat/completions."""
        body = request
        self._refuse_unsupported(body)
        surge = self.surge_for(body.model)
        if body.top_logprobs is not None and not body.logprobs:
            raise APIError(400, "top_logprobs requires logprobs to be true", "top_logprobs")
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        structured = await self._structured(body, surge)
        try:
            defaults = self._defaults(surge)
            max_tokens = body.max_completion_tokens or body.max_tokens or (defaults and defaults.max_tokens)
            params = body.sampling_params(max_tokens, logprobs, defaults)
            params = params.replace(structured=structured.constraint)
            messages = messages_as_dicts(body.messages)
            large = sum(len(m["content"] or "") for m in messages) > _LARGE_INPUT_CHARS
            ids = await _off_loop(chat_prompt_ids, surge.processor, messages, tools=structured.template_tools(),
                                  large=large)
        except (ValueError, ChatTemplateError) as exc:
            raise APIError(400, str(exc)) from None
        template = getattr(surge.processor, "chat_template", None)
        new_parser = (lambda: structured.parser(self.tool_call_parser, template)) if structured.tools else None
        fmt = Formatter("chat", self.name_of(surge), surge.processor)
        return await self._respond(ChoiceStreams(surge, [ids], params, new_parser=new_parser), fmt, body)

    async def completions(self, request: CompletionRequest):
        """POST /v1/completions."""
        body = request
        self._refuse_unsupported(body)
        surge = self.surge_for(body.model)
        if body.echo and body.logprobs is not None:
            raise APIError(400, "echo together with logprobs (prompt logprobs) is not supported", "echo")
        if body.model_extra and body.model_extra.get("tools"):
            raise APIError(400, "tools need /v1/chat/completions", "tools")
        structured = await self._structured(body, surge)
        try:
            defaults = self._defaults(surge)
            max_tokens = body.max_tokens or (defaults and defaults.max_tokens) or 16  # 16: OpenAI's default
            params = body.sampling_params(max_tokens, body.logprobs, defaults)
            params = params.replace(structured=structured.constraint)
            prompts = await self._prompt_token_lists(surge, body.prompt)
        except ValueError as exc:
            raise APIError(400, str(exc)) from None
        echo = [surge.processor.decode(ids) for ids in prompts] if body.echo else None
        fmt = Formatter("completion", self.name_of(surge), surge.processor)
        return await self._respond(ChoiceStreams(surge, prompts, params, echo), fmt, body)

    @staticmethod
    async def _prompt_token_lists(surge, prompt) -> list[list[int]]:
        if isinstance(prompt, str):
            prompt = [prompt]
        if isinstance(prompt[0], int):
            return [list(prompt)]
        if isinstance(prompt[0], list):
            return [list(p) for p in prompt]
        if any(p == "" for p in prompt):
            raise ValueError("the prompt is empty")
        large = sum(len(p) for p in prompt) > _LARGE_INPUT_CHARS
        return [await _off_loop(surge.processor.encode, p, large=large) for p in prompt]

    async def available_inference(self):
        """GET /v1/models."""
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": self.started_at, "owned_by": "vsurge",
             "max_model_len": surge.max_length} for name, surge in self.surges.items()]}

    async def count_tokens(self, request: CountTokenRequest):
        """POST /v1/count_tokens."""
        surge = self.surge_for(request.model)
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
        surge = self.surge_for(request.model)
        try:
            if request.messages is not None:
                tokens = chat_prompt_ids(surge.processor, messages_as_dicts(request.messages))
            elif request.prompt is not None:
                tokens = surge.processor.encode(request.prompt, add_special_tokens=request.add_special_tokens)
            else:
                raise APIError(400, "give 'prompt' or 'messages'")
        except (ValueError, ChatTemplateError) as exc:
            raise APIError(400, str(exc)) from None
        return {"tokens": tokens, "count": len(tokens), "max_model_len": surge.max_length}

    async def detokenize(self, request: DetokenizeRequest):
        surge = self.surge_for(request.model)
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
