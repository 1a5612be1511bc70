"""The anthropic SDK's pydantic types as a strict check of Messages bodies and stream events: the SDK
accepts fields it does not define silently (model_extra); these checks refuse them, at any depth."""

from __future__ import annotations

import json

import httpx
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import BaseModel, TypeAdapter

MESSAGE = TypeAdapter(Message)
EVENT = TypeAdapter(RawMessageStreamEvent)


def strict(value) -> None:
    """No field the SDK's types do not define, at any depth."""
    if isinstance(value, BaseModel):
        assert not value.model_extra, f"{type(value).__name__} has fields the SDK does not define: {value.model_extra}"
        for name in type(value).model_fields:
            strict(getattr(value, name))
    elif isinstance(value, list):
        for item in value:
            strict(item)


def check_message(body: dict) -> Message:
    message = MESSAGE.validate_python(body)
    strict(message)
    return message


def check_event(event: dict) -> None:
    if event == {"type": "ping"}:  # Anthropic's keep-alive, not in the SDK's event union
        return
    strict(EVENT.validate_python(event))


def stream_events(base: str, body: dict) -> tuple[list[dict], httpx.Headers]:
    """POST /v1/messages streamed: each event's data (its `event:` name must match), checked; the headers."""
    events, name = [], None
    with httpx.stream("POST", base + "/v1/messages", json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200, r.read()
        headers = r.headers
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                event = json.loads(line[6:])
                assert event["type"] == name, (name, event)
                check_event(event)
                events.append(event)
    assert events[0]["type"] == "message_start" and events[-1]["type"] == "message_stop"
    return events, headers
