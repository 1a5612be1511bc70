"""StructuredOutput: what a request's output must match, validated the moment it is built.

Exactly one kind per request (vLLM's `structured_outputs` fields):
json (a JSON schema), regex, choice (a list of strings), grammar (Lark, or
GBNF which is converted to Lark: llguidance's syntax), json_object (any JSON
object). Every problem is a ValueError naming it; the server turns them into
HTTP 400.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from .schema_check import check_schema

KINDS = ("json", "regex", "choice", "grammar", "json_object")

# JSON is written the way Python's json.dumps writes it, `{"a": 1, "b": [1, 2]}`, with at most
# one optional space in each gap (`{ "a": 1 }` passes). Bounded whitespace stops small models
# looping on newlines and spaces. Not zero optional spaces: llguidance 1.9's masks then miss
# some valid tokens (`"}` after an enum value in an array of objects; tests check masks are
# complete). A schema's own "x-guidance" object overrides these (llguidance reads it).
JSON_FORMAT = {"whitespace_flexible": True, "whitespace_pattern": "[ ]?", "item_separator": ", ",
               "key_separator": ": "}

JSON_OBJECT_SCHEMA = {"type": "object"}

# Keywords whose value is one subschema, or a list / name->schema map of them.
_ONE = ("items", "additionalProperties", "additionalItems", "contains", "not", "propertyNames",
        "unevaluatedItems", "unevaluatedProperties", "if", "then", "else")
_LIST = ("anyOf", "oneOf", "prefixItems")
_MAP = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
_OPEN_KEYS = ("additionalProperties", "patternProperties", "unevaluatedProperties")


@dataclass
class StructuredOutput:
    """The constraint on one request's output. Give exactly one field.

    json: a JSON schema (dict, or its JSON text); regex: a pattern the whole output
    matches (Rust `regex` syntax, anchors optional); choice: the output is one of these
    strings; grammar: a Lark (or GBNF) grammar; json_object: any JSON object.
    """

    json: dict | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool = False

    def __post_init__(self):
        given = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            what = "none was given" if not given else f"got {', '.join(given)}"
            raise ValueError(f"structured output needs exactly one of {', '.join(KINDS)}; {what}")
        if isinstance(self.json, str):
            try:
                self.json = json.loads(self.json)
            except json.JSONDecodeError as e:
                raise ValueError(f"the JSON schema is not valid JSON: {e}") from None
        if self.json is not None and not isinstance(self.json, dict):
            raise ValueError(f"the JSON schema must be a JSON object, got {type(self.json).__name__}")
        if self.json is not None:
            check_schema(self.json)  # schemas no finite output satisfies (schema_check.py)
        if self.regex is not None and not isinstance(self.regex, str):
            raise ValueError("regex must be a string")
        if self.grammar is not None and (not isinstance(self.grammar, str) or not self.grammar.strip()):
            raise ValueError("grammar must be a non-empty string")
        if self.json_object is not True and self.json_object is not False:
            raise ValueError("json_object must be true or false")
        if self.choice is not None:
            if not isinstance(self.choice, (list, tuple)) or not all(isinstance(c, str) for c in self.choice):
                raise ValueError("choice must be a list of strings")
            if not self.choice:
                raise ValueError("choice must list at least one string")
            self.choice = list(dict.fromkeys(self.choice))
        check_grammar(self.kind, self.key[1])

    # ------------------------------------------------------------ identity
    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    @property
    def key(self) -> tuple[str, str]:
        """(kind, canonical text): equal constraints have equal keys (the compile cache key)."""
        kind = self.kind
        if kind == "json":
            # not sorted: the order of "properties" is the order the output is written in
            return kind, json.dumps(self.json, ensure_ascii=False)
        if kind == "choice":
            return kind, json.dumps(self.choice, ensure_ascii=False)
        if kind == "json_object":
            return kind, ""
        return kind, getattr(self, kind)

    def grammar_text(self) -> str:
        """The llguidance grammar (a JSON string) this constraint compiles to."""
        return grammar_text(*self.key)

    @classmethod
    def coerce(cls, value: "StructuredOutput | dict | None") -> "StructuredOutput | None":
        """Accept a StructuredOutput, a dict of its fields (vLLM's `structured_outputs` body), or None."""
        if value is None or isinstance(value, StructuredOutput):
            return value
        if isinstance(value, dict):
            unknown = set(value) - set(KINDS)
            if unknown:
                raise ValueError(f"unknown structured output field(s): {', '.join(sorted(unknown))} "
                                 f"(known: {', '.join(KINDS)})")
            return cls(**value)
        raise ValueError(f"structured must be a StructuredOutput or a dict, got {type(value).__name__}")


# ---------------------------------------------------------------- grammar text

@lru_cache(maxsize=512)
def grammar_text(kind: str, text: str) -> str:
    import llguidance

    if kind in ("json", "json_object"):
        schema = JSON_OBJECT_SCHEMA if kind == "json_object" else close_objects(json.loads(text))
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_FORMAT)
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(text)
    if kind == "choice":
        return llguidance.grammar_from("choice", json.loads(text))
    try:
        return llguidance.grammar_from("grammar", text)  # Lark as is, GBNF converted
    except ValueError as e:
        raise ValueError(f"invalid grammar: {e}") from None


def close_objects(schema: Any) -> Any:
    """A copy of `schema` where objects that list `properties` but say nothing about others
    get `additionalProperties: false`.

    JSON Schema allows undeclared keys by default; a small model given that freedom
    invents keys. xgrammar's strict mode and outlines (vLLM's other back-ends) do the
    same. Objects directly under allOf stay open, or their intersection would refuse
    each other's keys. Write `additionalProperties: true` to allow extra keys."""
    schema = copy.deepcopy(schema)
    _close(schema, closable=True)
    return schema


def _close(node: Any, closable: bool) -> None:
    if not isinstance(node, dict):
        return
    if closable and isinstance(node.get("properties"), dict) and not any(k in node for k in _OPEN_KEYS):
        node["additionalProperties"] = False
    for key in _ONE:
        if isinstance(node.get(key), dict):
            _close(node[key], True)
        elif key == "items" and isinstance(node.get(key), list):  # draft-4 tuple form
            for sub in node[key]:
                _close(sub, True)
    for key in _LIST:
        for sub in node.get(key) or []:
            _close(sub, True)
    for sub in node.get("allOf") or []:
        _close(sub, False)
    for key in _MAP:
        if isinstance(node.get(key), dict):
            for sub in node[key].values():
                _close(sub, True)


# ---------------------------------------------------------------- validation

_NAMES = {"json": "JSON schema", "json_object": "JSON schema", "regex": "regex", "choice": "choice list",
          "grammar": "grammar"}


@lru_cache(maxsize=512)
def check_grammar(kind: str, text: str) -> None:
    """Raise ValueError naming the problem when the constraint cannot compile, or when
    nothing at all can be generated under it (a regex that matches nothing)."""
    import llguidance

    name = _NAMES[kind]
    grammar = grammar_text(kind, text)
    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if failed:
        raise ValueError(f"invalid {name}: {_first_line(messages[0])}")
    # A byte-level vocabulary shows whether any first byte (or the end) is possible.
    matcher = llguidance.LLMatcher(_byte_tokenizer(), grammar, log_level=0)
    if not matcher.is_error():
        matcher.compute_bitmask()
    if matcher.is_error():
        raise ValueError(f"the {name} cannot match anything: no output satisfies it")


def _first_line(message: str) -> str:
    return message.strip().split("\n<state>")[0].strip()


class _Bytes:
    """A 257-token vocabulary: the 256 bytes and an end token (llguidance's TokenizerWrapper API)."""

    eos_token_id, bos_token_id = 256, None
    tokens = [bytes([b]) for b in range(256)] + [b"<end>"]
    special_token_ids = [256]

    def __call__(self, text):
        return list(text if isinstance(text, bytes) else text.encode("utf-8"))


@lru_cache(maxsize=1)
def _byte_tokenizer():
    import llguidance

    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes()))
