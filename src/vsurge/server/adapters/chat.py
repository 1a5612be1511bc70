"""POST /v1/chat/completions (OpenAI): the body -> GenerationRequest; output through generation.py."""

from __future__ import annotations

from typing import Annotated, Any, Optional

from pydantic import Field, StrictStr

from ...structured.errors import ParamError
from ...structured.openai_fields import STRUCTURED_FIELDS, structured_request
from ..errors import APIError
from ..formatting import Formatter
from ..generation import ChoiceStreams
from ..protocol import ChatMessage, StreamOptions, WholeInt, messages_as_dicts
from ..routes import GUARDED, Route
from .common import (GenerationRequest, SamplingFields, as_api_error, compile_constraint, first_set,
                     output_parsers, render_chat, sampling_params, template_variables, unsupported)

# Fields clients may send that vsurge does not implement: a clear 400 naming the field beats silently
# ignoring them (common.unsupported; values that mean the default, e.g. best_of 1, pass).
UNSUPPORTED_FIELDS = ("functions", "function_call", "suffix", "prediction", "audio", "modalities", "best_of")


class StructuredFields(SamplingFields):
    """Structured outputs and tools, read by structured/openai_fields.py (it checks their values)."""

    response_format: Optional[Any] = None
    guided_json: Optional[Any] = None
    guided_regex: Optional[Any] = None
    guided_choice: Optional[Any] = None
    guided_grammar: Optional[Any] = None
    guided_json_object: Optional[Any] = None
    structured_outputs: Optional[Any] = None
    tools: Optional[Any] = None
    tool_choice: Optional[Any] = None
    parallel_tool_calls: Optional[Any] = None

    def structured(self):
        """-> StructuredRequest (ParamError naming the field)."""
        return structured_request({name: getattr(self, name) for name in STRUCTURED_FIELDS})


class ChatCompletionRequest(StructuredFields):
    model: Optional[StrictStr] = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Optional[WholeInt] = None
    logprobs: Optional[bool] = None  # None: false
    top_logprobs: Optional[WholeInt] = None
    add_generation_prompt: Optional[bool] = None  # None: true (not read: templates always get true)
    stream: Optional[bool] = None  # None: false
    stream_options: Optional[StreamOptions] = None
    user: Optional[StrictStr] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None  # vLLM's: more template variables (enable_thinking)


def check_stream_options(body) -> None:
    if body.stream_options is not None and not body.stream:
        raise APIError(400, "stream_options can only be set when stream is true", "stream_options")


async def to_request(server, body: ChatCompletionRequest, surge) -> GenerationRequest:
    if body.top_logprobs is not None and not body.logprobs:
        raise APIError(400, "top_logprobs requires logprobs to be true", "top_logprobs")
    try:
        structured = body.structured()
        defaults = server.defaults_for(surge)
        params = sampling_params(body, defaults, renames={"logprobs": "top_logprobs"},
                                 max_tokens=first_set(body.max_completion_tokens, body.max_tokens,
                                                      defaults and defaults.max_tokens),
                                 logprobs=(body.top_logprobs or 0) if body.logprobs else None,
                                 structured=structured.constraint)
        variables = template_variables(body.chat_template_kwargs)
        messages = messages_as_dicts(body.messages)
    except ParamError as exc:
        raise as_api_error(exc) from None
    structured = await compile_constraint(structured, surge)
    text, ids = await render_chat(surge.processor, messages, structured.template_tools(), variables,
                                  server.media_policy)
    return GenerationRequest([ids], params, structured, text)


async def respond(server, body: ChatCompletionRequest):
    unsupported(body, UNSUPPORTED_FIELDS)
    check_stream_options(body)
    surge = await server.surge_for(body.model)
    request = await to_request(server, body, surge)
    new_parser = output_parsers(server, request, surge)
    streams = ChoiceStreams(surge, request.prompts, request.params, new_parser=new_parser)
    fmt = Formatter("chat", server.name_of(surge), surge.processor)
    return await server.respond(streams, fmt, body)


# the routes this adapter answers (app.py installs every adapter module's ROUTES)
ROUTES = (Route("POST", "/v1/chat/completions", GUARDED, respond, "chat_completions"),)
