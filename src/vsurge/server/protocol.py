"""Request bodies shared by the routes: chat messages, and the token utility routes.

Each generation wire format's own body lives with its adapter (adapters/: chat,
completions, responses, messages, embeddings); their sampling fields are generated
from sampling/params.py. Unknown fields are ignored, as OpenAI and vLLM do.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, StrictInt, StrictStr, ValidationInfo,
                      field_validator, model_validator)
from pydantic_core import PydanticCustomError

CONTENT_KINDS = {"image_url": "image", "input_image": "image", "image": "image", "input_audio": "audio",
                 "audio": "audio", "file": "file", "input_file": "file", "document": "file"}


def _path(parts) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "body"


def check_json_values(value) -> None:
    """Every string of a parsed body is valid Unicode and every number finite, else a 400 naming where.
    JSON text may hold lone UTF-16 surrogates (`"\\udcff"`) and Python's parser reads 1e309 as inf and
    NaN/Infinity as numbers: none of them can reach a tokenizer, a sampler or a response body."""
    stack = [(value, ())]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError as exc:
                    raise PydanticCustomError(
                        "invalid_text", "{param} contains a lone UTF-16 surrogate at index {index} (not valid "
                        "Unicode text)", {"param": _path(where), "index": exc.start}) from None
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise PydanticCustomError("invalid_number", "{param} must be a finite number, got {value}",
                                          {"param": _path(where), "value": str(item)})
        elif isinstance(item, dict):
            for key, child in item.items():
                if isinstance(key, str) and not key.isascii():
                    stack.append((key, where))
                stack.append((child, (*where, key)))
        elif isinstance(item, list):
            stack.extend((child, (*where, i)) for i, child in enumerate(item))


class RequestBody(BaseModel):
    """A request body: unknown fields are ignored, as OpenAI, Anthropic and vLLM do; its strings must be
    valid Unicode and its numbers finite (check_json_values), checked once, before its fields."""

    model_config = ConfigDict(extra="allow")

    @model_validator(mode="before")
    @classmethod
    def _valid_json_values(cls, data):
        check_json_values(data)
        return data


def _whole(value):
    """JSON has one number type: 2.0 is the integer 2 (OpenAI's SDKs may send it so); 1.5 is not."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, float):
        raise PydanticCustomError("int_from_float", "must be an integer, got {value}", {"value": value})
    return value


WholeInt = Annotated[StrictInt, BeforeValidator(_whole)]


def _token_id(value):
    value = _whole(value)
    if isinstance(value, int) and not isinstance(value, bool) and value < 0:
        raise PydanticCustomError("token_id", "token ids must be >= 0, got {value}", {"value": value})
    return value


TokenId = Annotated[StrictInt, BeforeValidator(_token_id)]


def refuse_media_parts(content):
    """audio/file content parts: a clear 400 (image parts are read: server/chat_images.py)."""
    if isinstance(content, list):
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            kind = CONTENT_KINDS.get(kind) if isinstance(kind, str) and kind != "image_url" else None
            if kind is not None:
                raise PydanticCustomError("unsupported_content", f"{kind} inputs are not supported by this model")
    return content


class TextPart(BaseModel):
    type: Literal["text"]
    text: StrictStr


class ImagePart(BaseModel):
    """{"type": "image_url", "image_url": {"url": ..., "detail": ...}} (server/chat_images.py reads it)."""

    model_config = ConfigDict(extra="allow")

    type: Literal["image_url"]
    image_url: Union[StrictStr, dict[str, Any]]


# a user's or tool's message says something (null or [] is a 400); a system message's null stays an empty one
CONTENT_REQUIRED = ("user", "tool")


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    # validate_default: a missing content or tool_call_id is checked against the role too
    content: Optional[Union[StrictStr, list[Annotated[Union[TextPart, ImagePart], Field(discriminator="type")]]]] = \
        Field(None, validate_default=True)
    name: Optional[StrictStr] = None
    tool_call_id: Optional[StrictStr] = Field(None, validate_default=True)

    _media = field_validator("content", mode="before")(refuse_media_parts)

    @field_validator("content")
    @classmethod
    def _content_for_the_role(cls, content, info: ValidationInfo):
        role = info.data.get("role")
        if role in CONTENT_REQUIRED and (content is None or content == []):
            raise PydanticCustomError("missing_content", "must be a string or a non-empty list of content parts in "
                                      "a {role} message", {"role": role})
        return content

    @field_validator("tool_call_id")
    @classmethod
    def _tool_call_id_for_tool_messages(cls, tool_call_id, info: ValidationInfo):
        if info.data.get("role") == "tool" and tool_call_id is None:
            raise PydanticCustomError("missing_tool_call_id", "must be given in a tool message: the id of the "
                                      "tool call it answers")
        return tool_call_id


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: Optional[bool] = None  # None: false


class CountTokensRequest(RequestBody):
    model: Optional[StrictStr] = None
    messages: Optional[Annotated[list[ChatMessage], Field(min_length=1)]] = None
    prompt: Optional[StrictStr] = None
    text: Optional[StrictStr] = None


CountTokenRequest = CountTokensRequest  # the seed's name


class TokenizeRequest(RequestBody):
    model: Optional[StrictStr] = None
    prompt: Optional[StrictStr] = None
    messages: Optional[Annotated[list[ChatMessage], Field(min_length=1)]] = None
    add_special_tokens: Optional[bool] = None  # None: true


class DetokenizeRequest(RequestBody):
    model: Optional[StrictStr] = None
    tokens: list[TokenId]


def messages_as_dicts(messages: list[ChatMessage]) -> list[dict]:
    """Chat messages as the template's dicts: text parts joined, or (with images) a list of text and
    image parts (server/chat_images.py)."""
    from .chat_images import openai_image_part

    out = []
    for i, m in enumerate(messages):
        content = m.content
        if isinstance(content, list) and any(isinstance(p, ImagePart) for p in content):
            content = [openai_image_part(p.model_dump(), f"messages[{i}].content[{j}]") if isinstance(p, ImagePart)
                       else {"type": "text", "text": p.text} for j, p in enumerate(content)]
        elif isinstance(content, list):
            content = "".join(part.text for part in content)
        message = {"role": m.role, "content": content or ""}
        extra = {**(m.model_extra or {}), "tool_call_id": m.tool_call_id}
        for key in ("tool_calls", "tool_call_id", "reasoning_content"):  # a tool-calling conversation's history
            if extra.get(key) is not None:
                message[key] = extra[key]
        out.append(message)
    return out

