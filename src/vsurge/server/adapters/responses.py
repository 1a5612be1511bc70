"""POST /v1/responses (OpenAI's Responses API), GET/DELETE /v1/responses/{id}.

The body -> chat messages (instructions, input items: messages, function_call,
function_call_output; a stored previous response's conversation first) -> the one
GenerationRequest. The output -> typed items (reasoning, message, function_call) and,
streamed, their events: response.created, response.in_progress, then per item
response.output_item.added, response.content_part.added, response.output_text.delta /
response.reasoning_text.delta / response.function_call_arguments.delta, their .done
events and response.output_item.done, and last response.completed (or
response.incomplete when max_output_tokens cut it). Whole answers are the final
response of the same builder, so both agree. top_logprobs (or include
message.output_text.logprobs) puts each output_text token's logprob, with that many
alternatives, in the part's `logprobs` and in the delta and done events.
"""

from __future__ import annotations

import copy
import json
import time
import uuid
from typing import Any, AsyncIterator, Optional, Union

from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import StrictStr

from ...structured.errors import ParamError
from ...structured.openai_fields import chat_constraints, combine, schema_constraint
from ...structured.output_parser import Piece
from ...structured.tools import ToolCallConfig
from ..errors import APIError
from ..generation import ChoiceStreams
from ..chat_images import responses_image_part, text_or_parts
from ..protocol import CONTENT_KINDS, WholeInt
from ..routes import GUARDED, Route
from .common import (generation_failed, GenerationRequest, SamplingFields, as_api_error, compile_constraint, first_set,
                     output_parsers, render_chat, sampling_params, template_variables, unsupported)

UNSUPPORTED_FIELDS = ("background", "conversation", "prompt", "max_tool_calls")
LOGPROBS_INCLUDE = "message.output_text.logprobs"  # include: output_text parts carry their tokens' logprobs
TEXT_PART_TYPES = ("input_text", "output_text", "text", "refusal", "summary_text", "reasoning_text")


class ResponsesRequest(SamplingFields):
    model: Optional[StrictStr] = None
    input: Optional[Union[StrictStr, list[dict[str, Any]]]] = None  # null: a 400, as when it is missing
    instructions: Optional[StrictStr] = None
    max_output_tokens: Optional[WholeInt] = None
    tools: Optional[Any] = None
    tool_choice: Optional[Any] = None
    parallel_tool_calls: Optional[bool] = None
    text: Optional[Any] = None  # {"format": {"type": "text" | "json_object" | "json_schema", ...}}
    reasoning: Optional[Any] = None  # {"effort": ...}: the template's reasoning_effort
    stream: Optional[bool] = None  # None: false
    previous_response_id: Optional[StrictStr] = None
    store: Optional[bool] = None  # None: true
    metadata: Optional[dict[str, StrictStr]] = None
    truncation: Optional[StrictStr] = None
    user: Optional[StrictStr] = None
    top_logprobs: Optional[WholeInt] = None  # 0-20 alternatives per output_text token (logprobs, as chat's)
    include: Optional[list[StrictStr]] = None  # message.output_text.logprobs: logprobs without alternatives too
    chat_template_kwargs: Optional[dict[str, Any]] = None
    structured_outputs: Optional[Any] = None  # vLLM's: {"regex" | "grammar" | "choice" | "json": ...}


def wants_logprobs(body: ResponsesRequest) -> bool:
    """top_logprobs (any value) or include's message.output_text.logprobs asks for the output's logprobs
    (include's other values name outputs of tools vsurge does not run: nothing to add)."""
    return body.top_logprobs is not None or LOGPROBS_INCLUDE in (body.include or ())


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


# ------------------------------------------------------------ request -> chat messages
def _text_of(content, param: str, images: bool = False) -> str | list[dict]:
    """A message's content (a string or a list of text parts) -> its text; images: input_image parts
    are read too (a user message), and the content is then a list of text and image parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ParamError(f"{param} must be a string or a list of content parts", param)
    texts = []  # strings, and image parts (server/chat_images.py) where images are
    for j, part in enumerate(content):
        where = f"{param}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "input_image" and images:
            texts.append(responses_image_part(part, where))
            continue
        if isinstance(kind, str) and kind in CONTENT_KINDS:
            raise ParamError(f"{CONTENT_KINDS[kind]} inputs are not supported by this model", f"{where}.type")
        if kind not in TEXT_PART_TYPES:
            raise ParamError(f"{where}.type {kind!r} is not supported (vsurge serves text models: "
                             f"{', '.join(TEXT_PART_TYPES[:3])})", f"{where}.type")
        text = part.get("text", part.get("refusal"))
        if not isinstance(text, str):
            raise ParamError(f"{where}.text must be a string", f"{where}.text")
        texts.append(text)
    return text_or_parts(texts)


def input_messages(value, param: str = "input", earlier: list[dict] = ()) -> list[dict]:
    """Responses input (a string, or a list of items) -> chat messages; `earlier`: the conversation before
    it (a stored response's), whose function calls its function_call_outputs may answer."""
    if isinstance(value, str):
        if not value:
            raise ParamError(f"{param} must not be empty", param)
        return [{"role": "user", "content": value}]
    if not value:
        raise ParamError(f"{param} must not be empty", param)
    out: list[dict] = []
    calls = {call["id"] for m in earlier for call in m.get("tool_calls") or ()}
    for i, item in enumerate(value):
        where = f"{param}[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise ParamError(f"{where}.role must be user, assistant, system or developer, got {role!r}",
                                 f"{where}.role")
            out.append({"role": "system" if role == "developer" else role,
                        "content": _text_of(item.get("content"), f"{where}.content", images=role == "user")})
        elif kind == "function_call":
            call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments", "{}")
            if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(arguments, str):
                raise ParamError(f"{where} needs string call_id, name and arguments", where)
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            calls.add(call_id)
            if out and out[-1]["role"] == "assistant":  # several calls of one turn: one assistant message
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise ParamError(f"{where}.call_id must be a string", f"{where}.call_id")
            if call_id not in calls:
                raise ParamError(f"{where}.call_id {call_id!r} matches no earlier function_call (in this input or "
                                 "the previous response)", f"{where}.call_id")
            out.append({"role": "tool", "tool_call_id": call_id,
                        "content": _text_of(item.get("output"), f"{where}.output")})
        elif kind == "reasoning":
            continue  # earlier thinking is not shown to the model again
        else:
            raise ParamError(f"{where}.type {kind!r} is not supported (message, function_call, "
                             f"function_call_output, reasoning)", f"{where}.type")
    return out


def _flat(exc: ParamError) -> ParamError:
    """Chat-style tool errors (tools[0].function.name) in Responses' flat spelling (tools[0].name)."""
    return ParamError(str(exc).replace(".function.", ".").replace(".function ", " "),
                      exc.param.replace(".function", "") if exc.param else exc.param)


def tool_config(tools, tool_choice, parallel) -> ToolCallConfig | None:
    if tools is None:
        tools = []
    if not isinstance(tools, list):
        raise ParamError("tools must be a list of tools", "tools")
    chat_tools = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise ParamError(f"tools[{i}] must be an object", f"tools[{i}]")
        if tool.get("type") != "function":
            raise ParamError(f"tools[{i}].type {tool.get('type')!r} is not supported (vsurge runs 'function' tools)",
                             f"tools[{i}].type")
        function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
        chat_tools.append({"type": "function", "function": function})
    try:
        return ToolCallConfig.from_request(chat_tools, tool_choice, parallel)
    except ParamError as exc:
        raise _flat(exc) from None


def text_constraints(text) -> list:
    if text is None:
        return []
    if not isinstance(text, dict):
        raise ParamError("text must be an object with a 'format'", "text")
    fmt = text.get("format")
    if fmt is None:
        return []
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return []
    if kind == "json_object":
        return [("text.format", schema_constraint(None, "text.format"))]
    if kind == "json_schema":
        if fmt.get("name") is not None and not isinstance(fmt.get("name"), str):
            raise ParamError("text.format.name must be a string", "text.format.name")
        return [("text.format", schema_constraint(fmt.get("schema"), "text.format.schema"))]
    raise ParamError(f"text.format.type must be 'text', 'json_object' or 'json_schema', got {kind!r}",
                     "text.format.type")


async def to_request(server, body: ResponsesRequest, surge) -> tuple[GenerationRequest, list[dict]]:
    """-> (the request, the conversation before its output: what a stored response continues)."""
    history: list[dict] = []
    if body.input is None:
        raise APIError(400, "'input' is a required field", "input", code="missing_required_parameter")
    if body.previous_response_id is not None:
        stored = server.response_store.get(body.previous_response_id)
        if stored is None:
            raise APIError(404, f"Previous response with id '{body.previous_response_id}' not found.",
                           "previous_response_id")
        history = list(stored.conversation)
    try:
        if body.n not in (None, 1):
            raise ParamError("n must be 1 for /v1/responses", "n")
        conversation = history + input_messages(body.input, earlier=history)
        tools = tool_config(body.tools, body.tool_choice, body.parallel_tool_calls)
        structured = combine(text_constraints(body.text) + chat_constraints(
            {"structured_outputs": body.structured_outputs}), tools)
        defaults = server.defaults_for(surge)
        params = sampling_params(body, defaults,
                                 renames={"max_tokens": "max_output_tokens", "logprobs": "top_logprobs"},
                                 max_tokens=first_set(body.max_output_tokens, body.max_tokens,
                                                      defaults and defaults.max_tokens),
                                 **({"logprobs": body.top_logprobs or 0} if wants_logprobs(body) else {}),
                                 structured=structured.constraint)
        variables = template_variables(body.chat_template_kwargs)
        if isinstance(body.reasoning, dict) and body.reasoning.get("effort") is not None:
            variables.setdefault("reasoning_effort", body.reasoning["effort"])
            if body.reasoning["effort"] == "none":
                variables.setdefault("enable_thinking", False)
    except ParamError as exc:
        raise as_api_error(exc) from None
    structured = await compile_constraint(structured, surge)
    messages = ([{"role": "system", "content": body.instructions}] if body.instructions else []) + conversation
    text, ids = await render_chat(surge.processor, messages, structured.template_tools(), variables,
                                  server.media_policy)
    return GenerationRequest([ids], params, structured, text), conversation


# ------------------------------------------------------------ output -> items and events
class ResponseBuilder:
    """Output items and stream events of one response, from its pieces (structured/output_parser.py)."""

    def __init__(self, base: dict, decode=None):
        self.response = base  # the Response object; status, output and usage filled as it goes
        self.sequence = 0
        self.open: dict | None = None  # the item being written
        self.reasoning_text = ""
        self.decode = decode  # token ids -> text, when the output's logprobs were asked for
        self.pending: list[dict] = []  # logprobs of tokens not yet in a piece

    def logprobs(self, entries) -> None:
        """A sample's token logprobs (engine entries), for the content pieces that follow: output_text's
        LogProb objects ({token, logprob, bytes, top_logprobs})."""
        for e in entries if self.decode is not None else ():
            token = self.decode([e["token_id"]])
            top = [(self.decode([t]), v) for t, v in e["top_logprobs"] or ()]
            self.pending.append({"token": token, "logprob": e["logprob"], "bytes": list(token.encode("utf-8")),
                                 "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode("utf-8"))}
                                                  for t, v in top]})

    @staticmethod
    def _event_logprobs(logprobs: list[dict]) -> list[dict]:
        """Stream events' logprobs (the spec's ResponseLogProb: no bytes)."""
        return [{"token": lp["token"], "logprob": lp["logprob"],
                 "top_logprobs": [{"token": t["token"], "logprob": t["logprob"]} for t in lp["top_logprobs"]]}
                for lp in logprobs]

    def _take(self) -> list[dict]:
        taken, self.pending = self.pending, []
        return taken

    def event(self, kind: str, **fields) -> dict:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def snapshot(self) -> dict:
        return json.loads(json.dumps(self.response))

    def start(self) -> list[dict]:
        return [self.event("response.created", response=self.snapshot()),
                self.event("response.in_progress", response=self.snapshot())]

    def _index(self) -> int:
        return len(self.response["output"]) - 1

    def _open(self, item: dict, part: dict | None) -> list[dict]:
        events = self._close("completed")
        self.response["output"].append(item)
        self.open = item
        events.append(self.event("response.output_item.added", output_index=self._index(), item=copy.deepcopy(item)))
        if part is not None:
            item["content"].append(part)
            events.append(self.event("response.content_part.added", item_id=item["id"], output_index=self._index(),
                                     content_index=0, part=dict(part)))
        return events

    def _close(self, status: str) -> list[dict]:
        item, self.open = self.open, None
        if item is None:
            return []
        item["status"] = status
        at, events = dict(item_id=item["id"], output_index=self._index()), []  # the open item is the last
        if item["type"] == "message":
            part = item["content"][0]
            events += [self.event("response.output_text.done", content_index=0, text=part["text"],
                                  logprobs=self._event_logprobs(part["logprobs"]), **at),
                       self.event("response.content_part.done", content_index=0, part=part, **at)]
        elif item["type"] == "reasoning":
            part = item["content"][0]
            events += [self.event("response.reasoning_text.done", content_index=0, text=part["text"], **at),
                       self.event("response.content_part.done", content_index=0, part=part, **at)]
        else:
            events.append(self.event("response.function_call_arguments.done", arguments=item["arguments"],
                                     name=item["name"], **at))
        events.append(self.event("response.output_item.done", output_index=at["output_index"], item=item))
        return events

    def add(self, piece: Piece) -> list[dict]:
        events: list[dict] = []
        if piece.kind == "reasoning":
            if self.open is None or self.open["type"] != "reasoning":
                events += self._open({"type": "reasoning", "id": _id("rs"), "summary": [], "content": [],
                                      "status": "in_progress"}, {"type": "reasoning_text", "text": ""})
            self.open["content"][0]["text"] += piece.text
            self.reasoning_text += piece.text
            self._take()  # reasoning tokens: not output_text's
            events.append(self.event("response.reasoning_text.delta", item_id=self.open["id"],
                                     output_index=self._index(), content_index=0, delta=piece.text))
        elif piece.kind == "content":
            if self.open is None or self.open["type"] != "message":
                events += self._open({"type": "message", "id": _id("msg"), "role": "assistant", "status": "in_progress",
                                      "content": []}, {"type": "output_text", "text": "", "annotations": [],
                                                       "logprobs": []})
            self.open["content"][0]["text"] += piece.text
            logprobs = self._take()
            self.open["content"][0]["logprobs"] += logprobs
            events.append(self.event("response.output_text.delta", item_id=self.open["id"], output_index=self._index(),
                                     content_index=0, delta=piece.text, logprobs=self._event_logprobs(logprobs)))
        elif piece.starts_call:
            self._take()
            function = piece.call["function"]
            events += self._open({"type": "function_call", "id": _id("fc"), "call_id": piece.call["id"],
                                  "name": function["name"], "arguments": function.get("arguments", ""),
                                  "status": "in_progress"}, None)
        else:
            self._take()
            fragment = piece.call["function"].get("arguments", "")
            if self.open is not None and self.open["type"] == "function_call" and fragment:
                self.open["arguments"] += fragment
                events.append(self.event("response.function_call_arguments.delta", item_id=self.open["id"],
                                         output_index=self._index(), delta=fragment))
        return events

    def finish(self, finish_reason: str | None, usage: dict) -> list[dict]:
        incomplete = finish_reason == "length"
        events = []
        if self.pending and self.open is not None and self.open["type"] == "message":  # tokens with no text (EOS)
            events += self.add(Piece("content", ""))
        events += self._close("incomplete" if incomplete else "completed")
        if not self.response["output"]:  # an empty answer is still one (empty) message
            events += self._open({"type": "message", "id": _id("msg"), "role": "assistant", "status": "in_progress",
                                  "content": []}, {"type": "output_text", "text": "", "annotations": [],
                                                   "logprobs": []})
            events += self._close("completed")
        self.response.update(status="incomplete" if incomplete else "completed", usage=usage,
                             completed_at=int(time.time()),
                             incomplete_details={"reason": "max_output_tokens"} if incomplete else None)
        kind = "response.incomplete" if incomplete else "response.completed"
        return events + [self.event(kind, response=self.snapshot())]

    def assistant_message(self) -> dict:
        """The output as one chat message (what a follow-up request's conversation holds)."""
        text = "".join(part["text"] for item in self.response["output"] if item["type"] == "message"
                       for part in item["content"])
        calls = [{"id": item["call_id"], "type": "function",
                  "function": {"name": item["name"], "arguments": item["arguments"]}}
                 for item in self.response["output"] if item["type"] == "function_call"]
        message = {"role": "assistant", "content": text}
        if calls:
            message["tool_calls"] = calls
        return message


def _base(body: ResponsesRequest, model: str, params) -> dict:
    return {
        "id": _id("resp"), "object": "response", "created_at": int(time.time()), "status": "in_progress",
        "error": None, "incomplete_details": None, "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens, "model": model, "output": [],
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id,
        "reasoning": {"effort": (body.reasoning or {}).get("effort") if isinstance(body.reasoning, dict) else None,
                      "summary": None},
        "store": body.store is not False, "temperature": params.temperature, "top_p": params.top_p,
        "text": body.text if isinstance(body.text, dict) and body.text.get("format") else {"format": {"type": "text"}},
        "tool_choice": body.tool_choice if body.tool_choice is not None else "auto",
        "tools": body.tools or [], "truncation": body.truncation or "disabled", "top_logprobs": body.top_logprobs,
        "metadata": body.metadata or {},
        # usage arrives with the last event; user only when sent (the spec's Response has neither as null)
        **({"user": body.user} if body.user is not None else {}),
    }


def _usage(prompt_tokens: int, output_tokens: int, reasoning_tokens: int) -> dict:
    return {"input_tokens": prompt_tokens, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": prompt_tokens + output_tokens}


async def _run(streams: ChoiceStreams, builder: ResponseBuilder, request: GenerationRequest,
               new_parser) -> AsyncIterator[dict]:
    """Every event of the response, in order (the last one completes it)."""
    parser = new_parser() if new_parser else None
    for event in builder.start():
        yield event
    final = None
    async for _, sample in streams.updates():
        done = sample.finish_reason is not None
        pieces = parser.feed(sample.text, done) if parser else ([Piece("content", sample.text)] if sample.text else [])
        builder.logprobs(sample.logprobs or ())
        for piece in pieces:
            for event in builder.add(piece):
                yield event
        if done:
            final = sample
    reasoning_tokens = len(streams.surge.processor.encode(builder.reasoning_text)) if builder.reasoning_text else 0
    usage = _usage(request.prompt_tokens, final.num_generated_tokens, reasoning_tokens)
    for event in builder.finish(final.finish_reason, usage):
        yield event


def _sse(event: dict) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"


async def respond(server, body: ResponsesRequest):
    unsupported(body, UNSUPPORTED_FIELDS)
    surge = await server.surge_for(body.model)
    request, conversation = await to_request(server, body, surge)
    new_parser = output_parsers(server, request, surge)
    streams = ChoiceStreams(surge, request.prompts, request.params)
    builder = ResponseBuilder(_base(body, server.name_of(surge), request.params),
                              surge.processor.decode if request.params.logprobs is not None else None)
    streams.start_or_refuse()

    def store() -> None:
        if body.store is not False:
            server.response_store.put(builder.response, conversation + [builder.assistant_message()])

    if body.stream:
        async def events():
            try:
                async for event in _run(streams, builder, request, new_parser):
                    yield _sse(event)
                store()
            except Exception as exc:  # noqa: BLE001: the status line is gone; report in-band
                yield _sse(builder.event("error", code="server_error", message=f"generation failed: {exc}", param=None))

        return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    try:
        async for _ in _run(streams, builder, request, new_parser):
            pass
    except RuntimeError as exc:
        raise generation_failed(exc) from None
    store()
    return JSONResponse(builder.response)


async def retrieve(server, response_id: str):
    stored = server.response_store.get(response_id)
    if stored is None:
        raise APIError(404, f"Response with id '{response_id}' not found.", "response_id")
    return JSONResponse(stored.response)


async def delete(server, response_id: str):
    if not server.response_store.delete(response_id):
        raise APIError(404, f"Response with id '{response_id}' not found.", "response_id")
    return {"id": response_id, "object": "response", "deleted": True}


# the routes this adapter answers (app.py installs every adapter module's ROUTES)
ROUTES = (Route("POST", "/v1/responses", GUARDED, respond, "responses"),
          Route("GET", "/v1/responses/{response_id}", GUARDED, retrieve, "get_response"),
          Route("DELETE", "/v1/responses/{response_id}", GUARDED, delete, "delete_response"))
