"""Request body fields (OpenAI's and vLLM's) -> the output constraint and the tool-call setup.

Pure functions over the request's JSON dict (no web framework). Fields read:

- response_format: {"type": "text"} (none), {"type": "json_object"},
  {"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}};
- vLLM's guided_json, guided_regex, guided_choice, guided_grammar;
- vLLM's structured_outputs: {"json" | "regex" | "choice" | "grammar" | "json_object": ...};
- tools, tool_choice, parallel_tool_calls (tools.py).

At most one constraint may be given. Every problem raises ParamError (a
ValueError: HTTP 400) whose `param` names the field.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ParamError
from .spec import KINDS, StructuredOutput
from .tool_parsers import ToolParser
from .tools import ToolCallConfig

# every body field this module reads (the wire models declare them)
STRUCTURED_FIELDS = ("response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
                     "guided_json_object", "structured_outputs", "tools", "tool_choice", "parallel_tool_calls")
GUIDED_FIELDS = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
                 "guided_grammar": "grammar"}
# vLLM options that tune its own back-ends: accepted and not used (guided_decoding_backend and
# guided_whitespace_pattern are likewise never read). See docs/structured_outputs.md.
IGNORED_STRUCTURED_OPTIONS = {"disable_fallback", "disable_any_whitespace", "disable_additional_properties",
                              "whitespace_pattern", "backend"}


@dataclass
class StructuredRequest:
    """constraint: what `SamplingParams.structured` gets (the request's own, or the one that
    forces tool calls); source: the field it came from; tools: None without tools."""

    constraint: StructuredOutput | None = None
    source: str | None = None
    tools: ToolCallConfig | None = None

    def template_tools(self) -> list[dict] | None:
        """`tools=` for `apply_chat_template`."""
        return self.tools.template_tools() if self.tools else None

    def parser(self, tool_parser: str = "auto", chat_template: str | None = None) -> ToolParser | None:
        """A fresh tool-call parser for one choice's text, or None when the text is plain content."""
        if self.tools is None:
            return None
        if self.source is not None and not self.tools.forced:
            return None  # the request's own constraint shapes the text: it holds no calls
        return self.tools.parser(tool_parser, chat_template)


def structured_request(body: dict) -> StructuredRequest:
    """A chat/completions request body -> StructuredRequest; ParamError naming the field."""
    tools = ToolCallConfig.from_request(body.get("tools"), body.get("tool_choice"), body.get("parallel_tool_calls"))
    return combine(chat_constraints(body), tools)


def chat_constraints(body: dict) -> list[tuple[str, StructuredOutput]]:
    """(field, constraint) of every structured-output field a chat/completions body sets."""
    found: list[tuple[str, StructuredOutput]] = []
    response_format = _response_format(body.get("response_format"))
    if response_format is not None:
        found.append(("response_format", response_format))
    for name, kind in GUIDED_FIELDS.items():
        if body.get(name) is not None:
            found.append((name, _constraint({kind: body[name]}, name)))
    if body.get("guided_json_object"):  # vLLM's older spelling of json_object
        found.append(("guided_json_object", StructuredOutput(json_object=True)))
    outputs = body.get("structured_outputs")
    if outputs is not None:
        found.append(("structured_outputs", _structured_outputs(outputs)))
    return found


def combine(found: list[tuple[str, StructuredOutput]], tools: ToolCallConfig | None) -> StructuredRequest:
    """At most one constraint, and the tools; a forced tool choice is itself the constraint."""
    if len(found) > 1:
        names = " and ".join(name for name, _ in found)
        raise ParamError(f"give one structured output constraint, not several: got {names}", found[1][0])
    if tools is not None and tools.forced:
        if found:
            raise ParamError(f"tool_choice {tools.choice.name or tools.choice.mode!r} forces the output to be "
                             f"tool calls: it cannot be combined with {found[0][0]}", "tool_choice")
        return StructuredRequest(tools.constraint(), "tool_choice", tools)
    if found:
        return StructuredRequest(found[0][1], found[0][0], tools)
    return StructuredRequest(None, None, tools)


def schema_constraint(schema, param: str) -> StructuredOutput:
    """A JSON schema (None: any JSON object) -> its constraint; ParamError naming `param`."""
    if schema is None:
        return StructuredOutput(json_object=True)
    return _constraint({"json": schema}, param)


def _constraint(fields: dict, param: str) -> StructuredOutput:
    try:
        return StructuredOutput(**fields)
    except ValueError as e:
        raise ParamError(f"{param}: {e}", param) from None


def _response_format(value) -> StructuredOutput | None:
    param = "response_format"
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ParamError(f"{param} must be an object with a 'type'", param)
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput(json_object=True)
    if kind != "json_schema":
        raise ParamError(f"{param}.type must be 'text', 'json_object' or 'json_schema', got {kind!r}",
                         f"{param}.type")
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise ParamError(f"{param}.json_schema must be an object with 'name' and 'schema'", f"{param}.json_schema")
    name = spec.get("name")
    if name is not None and not isinstance(name, str):
        raise ParamError(f"{param}.json_schema.name must be a string", f"{param}.json_schema.name")
    schema = spec.get("schema")
    if schema is None:  # OpenAI makes it optional: then any JSON object
        return StructuredOutput(json_object=True)
    # "strict" is always honoured: the output always follows the schema.
    return _constraint({"json": schema}, f"{param}.json_schema.schema")


def _structured_outputs(value) -> StructuredOutput:
    param = "structured_outputs"
    if not isinstance(value, dict):
        raise ParamError(f"{param} must be an object with one of {', '.join(KINDS)}", param)
    unknown = set(value) - set(KINDS) - IGNORED_STRUCTURED_OPTIONS
    if unknown:
        raise ParamError(f"{param} has unknown field(s) {', '.join(sorted(unknown))} (known: {', '.join(KINDS)})",
                         f"{param}.{sorted(unknown)[0]}")
    fields = {k: v for k, v in value.items() if k in KINDS and v is not None and v is not False}
    if len(fields) == 1:
        kind = next(iter(fields))
        return _constraint(fields, f"{param}.{kind}")
    return _constraint(fields, param)
