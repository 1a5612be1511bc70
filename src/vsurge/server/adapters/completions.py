"""POST /v1/completions (OpenAI's legacy API): prompts -> GenerationRequest; output through generation.py.

`echo` puts the prompt before each choice's text; with `logprobs` too, the prompt's tokens
get log-probabilities (the first has none), as OpenAI's API did. vLLM's `prompt_logprobs`
returns them beside the choice instead.
"""

from __future__ import annotations

from typing import Annotated, Optional, Union

from pydantic import Field, StrictInt, StrictStr

from ...structured.errors import ParamError
from ..errors import APIError
from ..formatting import Formatter
from ..generation import ChoiceStreams
from ..protocol import StreamOptions
from .chat import UNSUPPORTED_FIELDS, StructuredFields, check_stream_options
from .common import (LARGE_INPUT_CHARS, GenerationRequest, as_api_error, compile_constraint, first_set,
                     sampling_params, unsupported)

OPENAI_MAX_TOKENS = 16  # OpenAI's default for completions
TokenIds = list[Annotated[int, Field(ge=0)]]


class CompletionRequest(StructuredFields):
    model: Optional[StrictStr] = None
    prompt: Union[StrictStr, Annotated[list[StrictStr], Field(min_length=1)],
                  Annotated[TokenIds, Field(min_length=1)],
                  Annotated[list[Annotated[TokenIds, Field(min_length=1)]], Field(min_length=1)]]
    logprobs: Optional[StrictInt] = None
    echo: bool = False
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    user: Optional[StrictStr] = None


async def prompt_token_lists(surge, prompt) -> list[list[int]]:
    import asyncio

    if isinstance(prompt, str):
        prompt = [prompt]
    if isinstance(prompt[0], int):
        return [list(prompt)]
    if isinstance(prompt[0], list):
        return [list(p) for p in prompt]
    if any(p == "" for p in prompt):
        raise APIError(400, "the prompt is empty", "prompt")
    if sum(len(p) for p in prompt) > LARGE_INPUT_CHARS:
        return [await asyncio.to_thread(surge.processor.encode, p) for p in prompt]
    return [surge.processor.encode(p) for p in prompt]


async def to_request(server, body: CompletionRequest, surge) -> GenerationRequest:
    if body.tools:
        raise APIError(400, "tools need /v1/chat/completions", "tools")
    try:
        structured = body.structured()
        defaults = server.defaults_for(surge)
        params = sampling_params(body, defaults, prompt_logprobs=True,
                                 max_tokens=first_set(body.max_tokens, defaults and defaults.max_tokens,
                                                      OPENAI_MAX_TOKENS),
                                 logprobs=body.logprobs, structured=structured.constraint)
    except ParamError as exc:
        raise as_api_error(exc) from None
    structured = await compile_constraint(structured, surge)
    return GenerationRequest(await prompt_token_lists(surge, body.prompt), params, structured, chat=False)


async def respond(server, body: CompletionRequest):
    unsupported(body, UNSUPPORTED_FIELDS)
    check_stream_options(body)
    surge = server.surge_for(body.model)
    request = await to_request(server, body, surge)
    echo = [surge.processor.decode(ids) for ids in request.prompts] if body.echo else None
    fmt = Formatter("completion", server.name_of(surge), surge.processor)
    params, echo_logprobs, prompt_logprobs = request.params, None, None
    if params.prompt_logprobs is not None or (body.echo and params.logprobs is not None):
        try:  # the prompts' own log-probabilities: one batched pass before generating
            scores = await surge.encode(request.prompts, "score")
        except (ValueError, TypeError) as exc:
            raise APIError(400, str(exc), "prompt") from None
        except RuntimeError as exc:
            raise APIError(503, f"prompt logprobs failed: {exc}") from None
        if body.echo and params.logprobs is not None:
            echo_logprobs = [fmt.prompt_entries(ids, sc, params.logprobs) for ids, sc in zip(request.prompts, scores)]
        if params.prompt_logprobs is not None:
            prompt_logprobs = [fmt.prompt_logprobs(ids, sc, params.prompt_logprobs)
                               for ids, sc in zip(request.prompts, scores)]
    streams = ChoiceStreams(surge, request.prompts, params, echo, echo_logprobs=echo_logprobs,
                            prompt_logprobs=prompt_logprobs)
    return await server.respond(streams, fmt, body)
