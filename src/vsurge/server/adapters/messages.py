"""POST /v1/messages and /v1/messages/count_tokens (Anthropic's Messages API).

The body -> chat messages (`system`; content blocks text, tool_use, tool_result; thinking
blocks of earlier turns are not shown again) -> the one GenerationRequest. Tools carry an
`input_schema`; tool_choice auto / any (a call is forced) / tool (that one) / none.
The output -> content blocks (thinking, text, tool_use) and, streamed, Anthropic's
sequence: message_start, then per block content_block_start, content_block_delta
(thinking_delta / text_delta / input_json_delta) and content_block_stop, then
message_delta (stop_reason, stop_sequence, output usage) and message_stop. stop_reason
is end_turn, max_tokens, stop_sequence or tool_use. Errors are Anthropic's JSON
(`{"type": "error", "error": {"type", "message"}}`, errors.py).

The newest SDKs send `thinking` (enabled / adaptive / between_tools / disabled: the template's
enable_thinking; thinking blocks come from the server's --reasoning-parser) and `output_config`
(`format`: structured output; `effort`: the template's reasoning_effort where it reads one);
what the model cannot honour is named in the response's x-vsurge-ignored header.
temperature, top_p and top_k stay accepted in the body (older SDKs' arguments, newer ones' extra_body).
"""

from __future__ import annotations

import json
import uuid
from typing import Any, AsyncIterator, Optional, Union

from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import StrictStr

from ...structured.errors import ParamError
from ...structured.openai_fields import chat_constraints, combine, schema_constraint
from ...structured.output_parser import Piece
from ...structured.tools import ToolCallConfig
from ..errors import APIError, anthropic_error_body
from ..generation import ChoiceStreams
from ..chat_images import anthropic_image_block, text_or_parts
from ..protocol import CONTENT_KINDS, WholeInt
from ..routes import GUARDED, Route
from .common import (generation_failed, GenerationRequest, SamplingFields, WireModel, as_api_error, compile_constraint, output_parsers,
                     render_chat, sampling_params, template_variables)

ROLES = ("user", "assistant")


class MessagesRequest(SamplingFields):
    model: Optional[StrictStr] = None
    max_tokens: WholeInt  # required, as in Anthropic's API
    messages: list[dict[str, Any]]
    system: Optional[Union[StrictStr, list[dict[str, Any]]]] = None
    stop_sequences: Optional[list[StrictStr]] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[dict[str, Any]] = None
    thinking: Optional[dict[str, Any]] = None  # {"type": "enabled" | "disabled"}: the template's enable_thinking
    output_config: Optional[dict[str, Any]] = None  # {"format": {"type": "json_schema", "schema"}}: structured output
    structured_outputs: Optional[Any] = None  # vLLM's: {"regex" | "grammar" | "choice" | "json": ...}
    stream: Optional[bool] = None  # None: false
    metadata: Optional[dict[str, Any]] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None


class MessagesCountTokensRequest(WireModel):
    model: Optional[StrictStr] = None
    messages: list[dict[str, Any]]
    system: Optional[Union[StrictStr, list[dict[str, Any]]]] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[dict[str, Any]] = None
    thinking: Optional[dict[str, Any]] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None


# ------------------------------------------------------------ request -> chat messages
def _text(blocks, param: str) -> str:
    """A string, or a list of text blocks -> the text."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise ParamError(f"{param} must be a string or a list of text blocks", param)
    texts = []
    for j, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if isinstance(kind, str) and kind in CONTENT_KINDS:
            raise ParamError(f"{CONTENT_KINDS[kind]} inputs are not supported by this model", f"{param}[{j}].type")
        if kind != "text" or not isinstance(block.get("text"), str):
            raise ParamError(f"{param}[{j}] must be a text block {{'type': 'text', 'text': ...}}", f"{param}[{j}]")
        texts.append(block["text"])
    return "".join(texts)


def chat_messages(system, messages, param: str = "messages") -> list[dict]:
    out: list[dict] = [{"role": "system", "content": _text(system, "system")}] if system else []
    if not messages:
        raise ParamError(f"{param} must hold at least one message", param)
    tool_uses: set[str] = set()  # ids of the tool_use blocks so far: each tool_result answers one
    for i, message in enumerate(messages):
        where = f"{param}[{i}]"
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ROLES:
            raise ParamError(f"{where}.role must be 'user' or 'assistant', got {role!r}", f"{where}.role")
        content = message.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise ParamError(f"{where}.content must be a string or a list of content blocks", f"{where}.content")
        if not content and not (role == "assistant" and i == len(messages) - 1):  # Anthropic's rule
            raise ParamError(f"{where}.content must not be empty (only a final assistant message may be)",
                             f"{where}.content")
        text, calls = [], []  # text: strings, and image parts (server/chat_images.py) where images are
        for j, block in enumerate(content):
            at = f"{where}.content[{j}]"
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text" and isinstance(block.get("text"), str):
                text.append(block["text"])
            elif kind == "image" and role == "user":
                text.append(anthropic_image_block(block, at))
            elif kind == "tool_use" and role == "assistant":
                if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str) \
                        or not isinstance(block.get("input", {}), dict):
                    raise ParamError(f"{at} needs a string id and name and an object input", at)
                tool_uses.add(block["id"])
                calls.append({"id": block["id"], "type": "function",
                              "function": {"name": block["name"], "arguments": json.dumps(block.get("input", {}))}})
            elif kind == "tool_result" and role == "user":
                if not isinstance(block.get("tool_use_id"), str):
                    raise ParamError(f"{at}.tool_use_id must be a string", f"{at}.tool_use_id")
                if block["tool_use_id"] not in tool_uses:
                    raise ParamError(f"{at}.tool_use_id {block['tool_use_id']!r} answers no earlier tool_use block",
                                     f"{at}.tool_use_id")
                result = _text(block.get("content", ""), f"{at}.content")
                if block.get("is_error"):
                    result = f"Error: {result}"
                out.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": result})
            elif kind in ("thinking", "redacted_thinking") and role == "assistant":
                continue  # earlier thinking is not shown to the model again
            elif isinstance(kind, str) and kind in CONTENT_KINDS:
                raise ParamError(f"{CONTENT_KINDS[kind]} inputs are not supported by this model", f"{at}.type")
            else:
                raise ParamError(f"{at}.type {kind!r} is not supported in a {role} message (text, tool_use, "
                                 f"tool_result, thinking)", f"{at}.type")
        if text or calls or not content:
            entry = {"role": role, "content": text_or_parts(text)}
            if calls:
                entry["tool_calls"] = calls
            out.append(entry)
    return out


def tool_config(tools, tool_choice) -> ToolCallConfig | None:
    chat_tools = []
    for i, tool in enumerate(tools or []):
        if not isinstance(tool, dict):
            raise ParamError(f"tools[{i}] must be an object", f"tools[{i}]")
        if tool.get("type", "custom") != "custom":
            raise ParamError(f"tools[{i}].type {tool.get('type')!r} is not supported (vsurge runs client tools "
                             "with an input_schema)", f"tools[{i}].type")
        function = {"name": tool.get("name"), "parameters": tool.get("input_schema")}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        chat_tools.append({"type": "function", "function": function})
    choice, parallel = None, None
    if tool_choice is not None:
        kind = tool_choice.get("type")
        if kind not in ("auto", "any", "tool", "none"):
            raise ParamError(f"tool_choice.type must be auto, any, tool or none, got {kind!r}", "tool_choice.type")
        choice = {"auto": "auto", "any": "required", "none": "none"}.get(kind) or \
            {"type": "function", "function": {"name": tool_choice.get("name")}}
        if tool_choice.get("disable_parallel_tool_use") is not None:
            parallel = not tool_choice["disable_parallel_tool_use"]
    try:
        return ToolCallConfig.from_request(chat_tools, choice, parallel)
    except ParamError as exc:  # the chat spelling -> Anthropic's
        message = str(exc).replace(".function.parameters", ".input_schema").replace(".function.", ".")
        param = (exc.param or "").replace(".function.parameters", ".input_schema").replace(".function", "")
        raise ParamError(message, param or None) from None


def output_constraints(config) -> list:
    """output_config.format (Anthropic's structured outputs) -> [(field, constraint)]."""
    fmt = config.get("format") if isinstance(config, dict) else None
    if fmt is None:
        return []
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise ParamError("output_config.format.type must be 'json_schema'", "output_config.format.type")
    return [("output_config.format", schema_constraint(fmt.get("schema"), "output_config.format.schema"))]


THINKING_TYPES = ("enabled", "disabled", "adaptive", "between_tools")
EFFORTS = ("low", "medium", "high", "xhigh", "max")  # output_config.effort; templates know low, medium, high


def _template(surge) -> str:
    template = getattr(surge.processor, "chat_template", None)
    return template if isinstance(template, str) else ""


def _variables(body, template: str = "") -> dict:
    """Template variables: chat_template_kwargs, `thinking` as enable_thinking (on unless disabled),
    output_config.effort as reasoning_effort where the template reads one (GPT-OSS's)."""
    variables = template_variables(body.chat_template_kwargs)
    thinking = body.thinking
    if thinking is not None:
        kind = thinking.get("type")
        if kind not in THINKING_TYPES:
            raise ParamError(f"thinking.type must be one of {', '.join(THINKING_TYPES)}, got {kind!r}", "thinking.type")
        variables.setdefault("enable_thinking", kind != "disabled")
    effort = _effort(body)
    if effort is not None and "reasoning_effort" in template:
        variables.setdefault("reasoning_effort", {"xhigh": "high", "max": "high"}.get(effort, effort))
    return variables


def _effort(body) -> str | None:
    config = getattr(body, "output_config", None)
    effort = config.get("effort") if isinstance(config, dict) else None
    if effort is not None and effort not in EFFORTS:
        raise ParamError(f"output_config.effort must be one of {', '.join(EFFORTS)}, got {effort!r}",
                         "output_config.effort")
    return effort


def ignored_fields(body, template: str) -> list[str]:
    """The fields of the body this model cannot honour (sent back in the x-vsurge-ignored header):
    an effort or a thinking switch its chat template does not read, a thinking budget (not enforced:
    max_tokens bounds thinking and answer together), thinking display "omitted" (thinking is shown)."""
    ignored = []
    if _effort(body) is not None and "reasoning_effort" not in template:
        ignored.append("output_config.effort")
    thinking = body.thinking or {}
    if thinking and "enable_thinking" not in template:
        ignored.append("thinking")
    if thinking.get("budget_tokens") is not None:
        ignored.append("thinking.budget_tokens")
    if thinking.get("display") == "omitted":
        ignored.append("thinking.display")
    return ignored


async def prompt(server, body, surge, structured=None) -> tuple[str, list[int], object]:
    try:
        messages = chat_messages(body.system, body.messages)
        tools = tool_config(body.tools, body.tool_choice)
        variables = _variables(body, _template(surge))
    except ParamError as exc:
        raise as_api_error(exc) from None
    structured = structured or combine([], tools)
    text, ids = await render_chat(surge.processor, messages, structured.template_tools(), variables,
                                  server.media_policy)
    return text, ids, structured


async def to_request(server, body: MessagesRequest, surge) -> GenerationRequest:
    try:
        if body.n not in (None, 1):
            raise ParamError("n must be 1 for /v1/messages", "n")
        constraints = output_constraints(body.output_config) + chat_constraints(
            {"structured_outputs": body.structured_outputs})
        structured = combine(constraints, tool_config(body.tools, body.tool_choice))
        params = sampling_params(body, server.defaults_for(surge), renames={"stop": "stop_sequences"},
                                 stop=body.stop_sequences if body.stop_sequences is not None else body.stop,
                                 structured=structured.constraint)
    except ParamError as exc:
        raise as_api_error(exc) from None
    structured = await compile_constraint(structured, surge)
    text, ids, structured = await prompt(server, body, surge, structured)
    return GenerationRequest([ids], params, structured, text)


# ------------------------------------------------------------ output -> blocks and events
def _stop_reason(sample, calls: bool) -> tuple[str, str | None]:
    if sample.finish_reason == "length":
        return "max_tokens", None
    if calls:
        return "tool_use", None
    if isinstance(sample.stop_reason, str):
        return "stop_sequence", sample.stop_reason
    return "end_turn", None


class MessageBuilder:
    """Content blocks and stream events of one message, from its pieces (structured/output_parser.py)."""

    def __init__(self, message: dict):
        self.message = message
        self.open: dict | None = None
        self.arguments = ""  # the open tool_use block's input JSON so far

    def start(self) -> list[dict]:
        return [{"type": "message_start", "message": json.loads(json.dumps(self.message))}, {"type": "ping"}]

    @property
    def _index(self) -> int:
        return len(self.message["content"]) - 1

    def _open(self, block: dict) -> list[dict]:
        events = self._close()
        self.message["content"].append(block)
        self.open = block
        return events + [{"type": "content_block_start", "index": self._index, "content_block": dict(block)}]

    def _close(self) -> list[dict]:
        block, self.open = self.open, None
        if block is None:
            return []
        if block["type"] == "tool_use":
            try:
                block["input"] = json.loads(self.arguments) if self.arguments.strip() else {}
            except json.JSONDecodeError:
                block["input"] = {}
        return [{"type": "content_block_stop", "index": self._index}]

    def add(self, piece: Piece) -> list[dict]:
        if piece.kind in ("reasoning", "content"):
            kind, field, delta = ("thinking", "thinking", "thinking_delta") if piece.kind == "reasoning" \
                else ("text", "text", "text_delta")
            events = []
            if self.open is None or self.open["type"] != kind:
                events += self._open({"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking"
                                     else {"type": "text", "text": ""})
            self.open[field] += piece.text
            return events + [{"type": "content_block_delta", "index": self._index,
                              "delta": {"type": delta, field: piece.text}}]
        if piece.starts_call:
            self.arguments = ""
            return self._open({"type": "tool_use", "id": "toolu_" + piece.call["id"].removeprefix("call_"),
                               "name": piece.call["function"]["name"], "input": {}})
        fragment = piece.call["function"].get("arguments", "")
        if self.open is None or self.open["type"] != "tool_use" or not fragment:
            return []
        self.arguments += fragment
        return [{"type": "content_block_delta", "index": self._index,
                 "delta": {"type": "input_json_delta", "partial_json": fragment}}]

    def finish(self, sample) -> list[dict]:
        events = self._close()
        calls = any(block["type"] == "tool_use" for block in self.message["content"])
        reason, sequence = _stop_reason(sample, calls)
        self.message.update(stop_reason=reason, stop_sequence=sequence)
        self.message["usage"]["output_tokens"] = sample.num_generated_tokens
        return events + [{"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                          "usage": {"output_tokens": sample.num_generated_tokens}},
                         {"type": "message_stop"}]


async def _run(streams: ChoiceStreams, builder: MessageBuilder, new_parser) -> AsyncIterator[dict]:
    parser = new_parser() if new_parser else None
    for event in builder.start():
        yield event
    async for _, sample in streams.updates():
        done = sample.finish_reason is not None
        pieces = parser.feed(sample.text, done) if parser else ([Piece("content", sample.text)] if sample.text else [])
        for piece in pieces:
            for event in builder.add(piece):
                yield event
        if done:
            for event in builder.finish(sample):
                yield event


def _sse(event: dict) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"


async def respond(server, body: MessagesRequest):
    surge = await server.surge_for(body.model)
    request = await to_request(server, body, surge)
    new_parser = output_parsers(server, request, surge)
    streams = ChoiceStreams(surge, request.prompts, request.params)
    builder = MessageBuilder({"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant",
                              "model": server.name_of(surge), "content": [], "stop_reason": None,
                              "stop_sequence": None,
                              "usage": {"input_tokens": request.prompt_tokens, "output_tokens": 0,
                                        "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}})
    ignored = ignored_fields(body, _template(surge))
    headers = {"x-vsurge-ignored": ", ".join(ignored)} if ignored else {}
    streams.start_or_refuse()
    if body.stream:
        async def events():
            try:
                async for event in _run(streams, builder, new_parser):
                    yield _sse(event)
            except Exception as exc:  # noqa: BLE001: the status line is gone; report in-band
                yield _sse(anthropic_error_body(500, f"generation failed: {exc}"))

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", **headers})
    try:
        async for _ in _run(streams, builder, new_parser):
            pass
    except RuntimeError as exc:
        raise generation_failed(exc) from None
    return JSONResponse(builder.message, headers=headers)


async def count_tokens(server, body: MessagesCountTokensRequest):
    surge = await server.surge_for(body.model)
    _, ids, _ = await prompt(server, body, surge)
    return {"input_tokens": len(ids)}


# the routes this adapter answers (app.py installs every adapter module's ROUTES)
ROUTES = (Route("POST", "/v1/messages", GUARDED, respond, "messages"),
          Route("POST", "/v1/messages/count_tokens", GUARDED, count_tokens, "messages_count_tokens"))
