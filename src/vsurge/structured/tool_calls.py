"""Tool calls as OpenAI sends them, built incrementally from a call object's JSON text.

A call object is `{"name": ..., "arguments": {...}}` (Llama 3 writes "parameters").
`ObjectScanner` reads such an object a piece of text at a time and reports its
members; `CallBuilder` turns that into OpenAI chat-completion-chunk pieces:

    {"index": i, "id": "call_<24 alnum>", "type": "function", "function": {"name": n, "arguments": ""}}
    {"index": i, "function": {"arguments": "<fragment>"}}   (as many as needed)

The arguments string is the raw text of the arguments value as the model wrote
it (valid JSON once complete), so the streamed fragments and the whole-text
result are the same string. An arguments value written as a JSON string (a
stringified object) is decoded and sent in one fragment when complete.
"""

from __future__ import annotations

import json
import secrets
import string
from dataclasses import dataclass, field

ARGUMENT_KEYS = ("arguments", "parameters")
_ALNUM = string.ascii_letters + string.digits
_WS = " \t\r\n"


def new_call_id() -> str:
    return "call_" + "".join(secrets.choice(_ALNUM) for _ in range(24))


class ObjectScanner:
    """One JSON object, fed piecewise; reports top-level members as they are read.

    `feed(text)` returns (events, rest): events are ("key", name), ("chunk", key, text)
    (raw text of an object/array value as it arrives), ("value", key, raw) when a member's
    value is complete; rest is the text after the object's closing brace (None while the
    object is open). `failed` turns True when the text is not a JSON object."""

    def __init__(self):
        self.state = "start"
        self.failed = self.done = False
        self.key_raw = ""
        self.key: str | None = None
        self.value = ""  # raw text of the current value so far
        self.kind = ""  # "composite" | "string" | "scalar"
        self.depth = 0  # bracket depth inside a composite value
        self.in_string = self.escape = False

    def feed(self, text: str):
        events: list[tuple] = []
        # where this piece of a composite value starts in `text`
        chunk_start = 0 if self.state == "value" and self.kind == "composite" else None
        i = 0
        while i < len(text):
            if self.failed or self.done:
                break
            c = text[i]
            state = self.state
            if state == "start":
                if c == "{":
                    self.state = "before_key"
                elif c not in _WS:
                    self.failed = True
            elif state == "before_key":
                if c == '"':
                    self.state, self.key_raw = "key", ""
                elif c == "}" and self.key is None:
                    self.done = True
                elif c not in _WS:
                    self.failed = True
            elif state == "key":
                if self.escape:
                    self.escape = False
                    self.key_raw += c
                elif c == "\\":
                    self.escape = True
                    self.key_raw += c
                elif c == '"':
                    self.key = _json_or_none('"' + self.key_raw + '"')
                    self.state = "colon"
                    events.append(("key", self.key))
                else:
                    self.key_raw += c
            elif state == "colon":
                if c == ":":
                    self.state = "before_value"
                elif c not in _WS:
                    self.failed = True
            elif state == "before_value":
                if c not in _WS:
                    self.state, self.value, self.depth = "value", "", 0
                    self.kind = "composite" if c in "{[" else "string" if c == '"' else "scalar"
                    if self.kind == "composite":
                        chunk_start = i
                    continue  # read this character as the value's first
            elif state == "value":
                if self.kind == "scalar" and (c in _WS or c in ",}"):
                    self._end_value(events)
                    continue  # the delimiter belongs to the object
                self.value += c
                if self._value_complete(c):
                    if chunk_start is not None:
                        events.append(("chunk", self.key, text[chunk_start:i + 1]))
                        chunk_start = None
                    self._end_value(events)
            elif state == "after_value":
                if c == ",":
                    self.state = "before_key"
                elif c == "}":
                    self.done = True
                elif c not in _WS:
                    self.failed = True
            i += 1
        if chunk_start is not None and self.state == "value":
            events.append(("chunk", self.key, text[chunk_start:i]))
        return events, (text[i:] if self.done else None)

    def _value_complete(self, c: str) -> bool:
        if self.in_string:
            if self.escape:
                self.escape = False
            elif c == "\\":
                self.escape = True
            elif c == '"':
                self.in_string = False
                return self.kind == "string"
            return False
        if c == '"':
            self.in_string = True
        elif c in "{[":
            self.depth += 1
        elif c in "}]":
            self.depth -= 1
            return self.depth == 0
        return False

    def _end_value(self, events) -> None:
        events.append(("value", self.key, self.value))
        self.state = "after_value"
        self.in_string = self.escape = False


def _json_or_none(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


@dataclass
class CallBuilder:
    """One tool call read from its object's text: OpenAI delta pieces out, the call assembled."""

    index: int
    id: str = field(default_factory=new_call_id)
    name: str | None = None
    arguments: str = ""
    pending: list[str] = field(default_factory=list)  # argument text seen before the name
    extra_keys: list[str] = field(default_factory=list)  # members that are neither name nor arguments
    scanner: ObjectScanner = field(default_factory=ObjectScanner)
    started: bool = False
    saw_arguments: bool = False

    def feed(self, text: str) -> tuple[list[dict], str | None]:
        """-> (tool_call pieces, text after the object or None while it is open)."""
        events, rest = self.scanner.feed(text)
        pieces: list[dict] = []
        for event in events:
            kind, key = event[0], event[1]
            if kind == "key":
                if key not in ("name", "type", *ARGUMENT_KEYS):
                    self.extra_keys.append(str(key))
            elif kind == "chunk" and key in ARGUMENT_KEYS:
                self.saw_arguments = True
                pieces += self._arguments(event[2])
            elif kind == "value" and key == "name":
                self.name = _json_or_none(event[2])
                if isinstance(self.name, str):
                    pieces.append(self._header())
                    pieces += self._arguments("".join(self.pending))
                    self.pending.clear()
            elif kind == "value" and key in ARGUMENT_KEYS and not event[2].startswith(("{", "[")):
                self.saw_arguments = True
                decoded = _json_or_none(event[2])  # a stringified object, or a scalar
                pieces += self._arguments(decoded if isinstance(decoded, str) else event[2])
        return pieces, rest

    def _header(self) -> dict:
        self.started = True
        return {"index": self.index, "id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": ""}}

    def _arguments(self, fragment: str) -> list[dict]:
        if not fragment:
            return []
        if not self.started:
            self.pending.append(fragment)
            return []
        self.arguments += fragment
        return [{"index": self.index, "function": {"arguments": fragment}}]

    def finish(self) -> list[dict]:
        """Close a call whose object had no arguments member: arguments "{}"."""
        if self.started and not self.saw_arguments and self.scanner.done:
            return self._arguments("{}")
        return []

    @property
    def is_call(self) -> bool:
        """Complete, named, with JSON arguments and nothing else: a real call."""
        return (self.scanner.done and isinstance(self.name, str) and not self.extra_keys
                and _json_or_none(self.arguments or "{}") is not None)

    def as_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


class DeltaAssembler:
    """Rebuilds message content and tool calls from streamed deltas, as the openai client does
    (tool calls by index: the first piece's id/type/name, arguments concatenated)."""

    def __init__(self):
        self.content = ""
        self.calls: dict[int, dict] = {}

    def add(self, delta: dict) -> None:
        if delta.get("content"):
            self.content += delta["content"]
        for piece in delta.get("tool_calls") or []:
            call = self.calls.setdefault(piece["index"], {"id": None, "type": "function",
                                                          "function": {"name": "", "arguments": ""}})
            if piece.get("id"):
                call["id"] = piece["id"]
            function = piece.get("function") or {}
            if function.get("name"):
                call["function"]["name"] += function["name"]
            call["function"]["arguments"] += function.get("arguments") or ""

    @property
    def tool_calls(self) -> list[dict]:
        return [self.calls[i] for i in sorted(self.calls)]
