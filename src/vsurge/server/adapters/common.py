"""What every wire format's adapter shares: the sampling fields of a body, the one internal
request, chat-template rendering, and each choice's output parser.

A body is parsed once, by FastAPI into the wire format's pydantic model (its sampling
fields generated from sampling/params.py); the adapter maps that model onto a
`GenerationRequest` (token ids + SamplingParams + structured output and tools), and
maps the engine's updates back onto its wire format's events.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Optional

from pydantic import BaseModel, StrictInt, create_model

from ...engine.request import DriverNotReadyError
from ...sampling.defaults import OPENAI_DEFAULTS
from ...sampling.params import SamplingParams, wire_fields
from ...structured.errors import ParamError
from ...structured.openai_fields import StructuredRequest
from ...structured.output_parser import OutputParser
from ...structured.reasoning import get_reasoning_parser
from ...tokenizer.chat_template import ChatTemplateError
from ...tokenizer.compat import render_chat_prompt
from ...tokenizer.vision_chat import image_parts
from ...multimodal import MediaPolicy
from ..errors import APIError
from ..chat_images import render_with_images
from ..protocol import RequestBody, WholeInt

LARGE_INPUT_CHARS = 4000  # longer inputs are tokenized off the event loop
# template variables a request may not set: the renderer's own
RESERVED_TEMPLATE_VARIABLES = ("messages", "tools", "add_generation_prompt", "bos_token", "eos_token",
                               "pad_token", "unk_token")


class WireModel(RequestBody):
    """A request body: unknown fields are ignored, as OpenAI, Anthropic and vLLM do; every field a
    client may leave out is Optional (an explicit null is the field left unset, as OpenAI's spec
    marks them nullable); strings and numbers are checked body-wide (protocol.check_json_values)."""


# Every SamplingParams field that HTTP bodies carry under its own name (None: unset), for every
# wire format; their values are checked once, by SamplingParams (vLLM's messages, 400 naming the field).
# Integer fields take JSON's whole floats (`n: 1.0`) too.
SamplingFields = create_model("SamplingFields", __base__=WireModel,
                              **{name: (Optional[WholeInt if kind is StrictInt else kind], None)
                                 for name, kind in wire_fields().items()})


def sampling_params(body: BaseModel, defaults, renames: dict[str, str] | None = None, prompt_logprobs: bool = False,
                    **overrides) -> SamplingParams:
    """The body's sampling fields (and `overrides`, the adapter's own spellings such as max_output_tokens)
    over `defaults` (None: OpenAI's) for the fields left unset. ParamError (400) names the wire field:
    `renames` maps SamplingParams names back to the wire's (stop -> stop_sequences). prompt_logprobs:
    the wire format serves them (completions); elsewhere asking for them is a 400."""
    values = {name: getattr(body, name, None) for name in wire_fields()}
    values.update(overrides)
    if values.get("prompt_logprobs") is not None and not prompt_logprobs:
        raise ParamError("prompt_logprobs are served by /v1/completions", "prompt_logprobs")
    try:
        return (defaults or OPENAI_DEFAULTS).sampling_params(**values)
    except ParamError as exc:
        param = (renames or {}).get(exc.param, exc.param)
        message = str(exc)
        if param != exc.param and message.startswith(exc.param):
            message = param + message[len(exc.param):]
        raise ParamError(message, param) from None


@dataclass
class GenerationRequest:
    """The one internal request every wire format maps onto."""

    prompts: list[list[int]]  # token ids, one list per prompt
    params: SamplingParams
    structured: StructuredRequest = field(default_factory=StructuredRequest)
    prompt_text: str = ""  # the rendered chat prompt (reasoning parsers read whether it opened <think>)
    chat: bool = True  # chat output: reasoning and tool calls are parsed out of the text

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)


def first_set(*values):
    """The first value that is not None (0 counts: `max_tokens: 0` must reach the check that refuses it)."""
    return next((v for v in values if v is not None), None)


def template_variables(value, param: str = "chat_template_kwargs") -> dict:
    """vLLM's chat_template_kwargs (e.g. {"enable_thinking": false}): extra variables for the template."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ParamError(f"{param} must be an object", param)
    reserved = [k for k in value if k in RESERVED_TEMPLATE_VARIABLES]
    if reserved:
        raise ParamError(f"{param} may not set {reserved[0]!r}", f"{param}.{reserved[0]}")
    return dict(value)


async def render_chat(processor, messages: list[dict], tools: list[dict] | None = None,
                      variables: dict | None = None, media_policy=None) -> tuple[str, list[int]]:
    """(prompt text, token ids) of chat messages through the template; ChatTemplateError -> 400. Messages
    holding image parts (server/chat_images.py) -> (text, MultimodalPrompt), fetched as `media_policy` allows."""
    if image_parts(messages):
        return await render_with_images(processor, messages, tools, variables or {}, media_policy or MediaPolicy())
    large = sum(len(m.get("content") or "") for m in messages if isinstance(m.get("content"), str)) > LARGE_INPUT_CHARS
    try:
        if large:
            return await asyncio.to_thread(render_chat_prompt, processor, messages, tools, **(variables or {}))
        return render_chat_prompt(processor, messages, tools, **(variables or {}))
    except ChatTemplateError as exc:
        raise APIError(400, str(exc), "messages") from None


def output_parsers(server, request: GenerationRequest, surge) -> Callable[[], OutputParser] | None:
    """A factory of fresh OutputParsers for the request's choices (None: the text is plain content).
    Call it before the request's params are used: a parser that reads special tokens (GPT-OSS's
    channels) makes the request's text keep them."""
    reasoning = server.reasoning_parser if request.chat else None
    tools = request.structured.tools is not None and request.chat
    if not reasoning and not tools:
        return None
    template = getattr(surge.processor, "chat_template", None)
    reasoning_cls = get_reasoning_parser(reasoning) if reasoning else None
    if reasoning_cls is not None and reasoning_cls.keeps_special_tokens:
        request.params = dataclasses.replace(request.params, skip_special_tokens=False)

    def new() -> OutputParser:
        tool_parser = request.structured.parser(server.tool_call_parser, template) if tools else None
        return OutputParser(reasoning_cls(request.prompt_text) if reasoning_cls else None, tool_parser)

    return new


def as_api_error(exc: ValueError) -> APIError:
    return APIError(400, str(exc), getattr(exc, "param", None))


def generation_failed(exc: RuntimeError) -> APIError:
    """The engine failed mid-request: 503 while it is not ready (a lost multi-host follower, shutting down),
    else the failure's own status (engine/faults.RequestFailed: 400 naming its field, or 500)."""
    status = 503 if isinstance(exc, DriverNotReadyError) else getattr(exc, "status", 500)
    return APIError(status, f"generation failed: {exc}", getattr(exc, "param", None))


# values of unsupported fields that ask for nothing beyond the default: accepted
DEFAULT_MEANING = {"best_of": (1,), "modalities": (["text"],), "function_call": ("none", "auto")}
UNSUPPORTED_HINTS = {"functions": " (send tools)", "function_call": " (send tools and tool_choice)",
                     "audio": " (this model answers in text)", "modalities": " (this model answers in text)",
                     "best_of": " (send n)"}


def unsupported(body: BaseModel, names: tuple[str, ...]) -> None:
    """400 (invalid_request_error, code unsupported_parameter, param naming the field) for fields a
    client may send that vsurge does not implement: clearer than ignoring them, and not a 5xx (that
    OpenAI's SDKs would retry). Values that mean the default (`best_of: 1`, `modalities: ["text"]`)
    are accepted."""
    extra = body.model_extra or {}
    for name in names:
        value = extra.get(name, getattr(body, name, None) if name in type(body).model_fields else None)
        if value in (None, [], {}, False) or any(value == d and type(value) is not bool
                                                 for d in DEFAULT_MEANING.get(name, ())):
            continue
        raise APIError(400, f"'{name}' is not supported by vsurge{UNSUPPORTED_HINTS.get(name, '')}", name,
                       code="unsupported_parameter")


def prompt_items(value, param: str) -> list:
    """OpenAI's prompt/input forms -> a list of strings or a list of token-id lists; ParamError with
    the message that says what is wrong (empty, a negative id, mixed forms)."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise ParamError(f"{param} must be a string, a list of strings, a list of token ids or a list of "
                         f"token-id lists", param)
    if not value:
        raise ParamError(f"{param} must not be empty", param)
    if all(isinstance(v, str) for v in value):
        return list(value)
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return [_token_ids(value, param)]
    if all(isinstance(v, list) for v in value):
        for i, ids in enumerate(value):
            if not ids:
                raise ParamError(f"{param}[{i}] must not be empty", param)
        return [_token_ids(ids, param) for ids in value]
    raise ParamError(f"{param} must be a string, a list of strings, a list of token ids or a list of token-id "
                     f"lists (not a mix)", param)


def _token_ids(values: list, param: str) -> list[int]:
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer()):
            raise ParamError(f"token ids must be integers, got {v!r}", param)
        if v < 0:
            raise ParamError(f"token ids must be >= 0, got {v}", param)
    return [int(v) for v in values]



async def compile_constraint(structured: StructuredRequest, surge) -> StructuredRequest:
    """Compile the request's constraint now (off the loop), so a bad schema is a 400 naming its field
    and the engine finds the grammar cached."""
    if structured.constraint is not None:
        from ...structured.compiler import compiler_for

        try:
            compiler = await asyncio.to_thread(compiler_for, surge.processor, surge.engine.vocab_size)
            await asyncio.to_thread(compiler.compile, structured.constraint)
        except ValueError as exc:
            raise APIError(400, str(exc), structured.source) from None
    return structured
