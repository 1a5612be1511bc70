"""Request bodies shared by the routes: chat messages, and the token utility routes.

Each generation wire format's own body lives with its adapter (adapters/: chat,
completions, responses, messages, embeddings); their sampling fields are generated
from sampling_params.py. Unknown fields are ignored, as OpenAI and vLLM do.
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictStr


class TextPart(BaseModel):
    type: Literal["text"]
    text: StrictStr


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Optional[Union[StrictStr, list[TextPart]]] = None
    name: Optional[StrictStr] = None


class StreamOptions(BaseModel):
    include_usage: bool = False


class CountTokensRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: Optional[StrictStr] = None
    messages: Optional[Annotated[list[ChatMessage], Field(min_length=1)]] = None
    prompt: Optional[StrictStr] = None
    text: Optional[StrictStr] = None


CountTokenRequest = CountTokensRequest  # the seed's name


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: Optional[StrictStr] = None
    prompt: Optional[StrictStr] = None
    messages: Optional[Annotated[list[ChatMessage], Field(min_length=1)]] = None
    add_special_tokens: bool = True


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: Optional[StrictStr] = None
    tokens: list[Annotated[int, Field(ge=0)]]


def messages_as_dicts(messages: list[ChatMessage]) -> list[dict]:
    out = []
    for m in messages:
        content = m.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        message = {"role": m.role, "content": content or ""}
        extra = m.model_extra or {}
        for key in ("tool_calls", "tool_call_id", "reasoning_content"):  # a tool-calling conversation's history
            if extra.get(key) is not None:
                message[key] = extra[key]
        out.append(message)
    return out


_MOVED = {"ChatCompletionRequest": ".adapters.chat", "CompletionRequest": ".adapters.completions",
          "UNSUPPORTED_FIELDS": ".adapters.chat"}


def __getattr__(name):  # the generation bodies moved to their adapters; old imports keep working
    if name in _MOVED:
        from importlib import import_module

        return getattr(import_module(_MOVED[name], __package__), name)
    raise AttributeError(name)
