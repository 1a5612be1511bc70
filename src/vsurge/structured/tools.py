"""OpenAI tools and tool_choice: validation, the constraint that forces calls, the output parser.

tool_choice decides how calls come out:

- "none": no tools are shown to the model, no parsing;
- "auto" (the default with tools): the model writes freely; the template's tool-call
  parser (tool_parsers.py) finds calls in its text;
- "required": a grammar forces `[{"name": <one of the tools>, "arguments": <its schema>}, ...]`
  (one or more calls; exactly one when parallel_tool_calls is false), as vLLM does;
- {"type": "function", "function": {"name": N}}: a grammar forces N's arguments object.

Responses with calls carry `message.tool_calls` and finish_reason "tool_calls".
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field

from .errors import ParamError
from .spec import StructuredOutput
from .tool_parsers import NamedCallParser, RequiredCallsParser, ToolParser, get_tool_parser

TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # OpenAI's rule for function names
EMPTY_PARAMETERS = {"type": "object", "properties": {}}
CHOICE_MODES = ("none", "auto", "required")


@dataclass
class Tool:
    name: str
    parameters: dict = field(default_factory=lambda: dict(EMPTY_PARAMETERS))  # a JSON schema
    description: str | None = None
    strict: bool | None = None

    def as_openai(self) -> dict:
        """The OpenAI tool object (what chat templates receive as `tools`)."""
        function = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = self.parameters
        return {"type": "function", "function": function}


def validate_tools(tools, param: str = "tools") -> list[Tool]:
    """OpenAI `tools` -> Tools; ParamError naming the bad field."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise ParamError(f"{param} must be a list of tools", param)
    out: list[Tool] = []
    for i, tool in enumerate(tools):
        where = f"{param}[{i}]"
        if not isinstance(tool, dict):
            raise ParamError(f"{where} must be an object", where)
        if tool.get("type", "function") != "function":
            raise ParamError(f"{where}.type must be 'function', got {tool.get('type')!r}", f"{where}.type")
        function = tool.get("function")
        if not isinstance(function, dict):
            raise ParamError(f"{where}.function must be an object", f"{where}.function")
        name = function.get("name")
        if not isinstance(name, str) or not TOOL_NAME.match(name):
            raise ParamError(f"{where}.function.name must be 1-64 letters, digits, '_' or '-', got {name!r}",
                             f"{where}.function.name")
        if any(t.name == name for t in out):
            raise ParamError(f"{where}.function.name {name!r} is given twice", f"{where}.function.name")
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise ParamError(f"{where}.function.description must be a string", f"{where}.function.description")
        parameters = function.get("parameters")
        if parameters is None:
            parameters = dict(EMPTY_PARAMETERS)
        try:
            StructuredOutput(json=parameters)
        except ValueError as e:
            raise ParamError(f"{where}.function.parameters is not a usable JSON schema: {e}",
                             f"{where}.function.parameters") from None
        out.append(Tool(name, parameters, description, function.get("strict")))
    return out


@dataclass
class ToolChoice:
    mode: str  # "none" | "auto" | "required" | "function"
    name: str | None = None  # the function, when mode == "function"


def parse_tool_choice(value, tools: list[Tool], param: str = "tool_choice") -> ToolChoice:
    if value is None:
        return ToolChoice("auto" if tools else "none")
    if isinstance(value, str):
        if value not in CHOICE_MODES:
            raise ParamError(f"{param} must be one of {', '.join(CHOICE_MODES)} or a function, got {value!r}", param)
        if value != "none" and not tools:
            raise ParamError(f"{param} {value!r} needs 'tools'", param)
        return ToolChoice(value)
    if isinstance(value, dict) and value.get("type") == "function":
        function = value.get("function")
        name = function.get("name") if isinstance(function, dict) else value.get("name")
        if not isinstance(name, str):
            raise ParamError(f"{param}.function.name is missing", f"{param}.function.name")
        if not any(t.name == name for t in tools):
            known = ", ".join(t.name for t in tools) or "no tools were given"
            raise ParamError(f"{param} names the function {name!r}, which is not among the tools ({known})",
                             f"{param}.function.name")
        return ToolChoice("function", name)
    raise ParamError(f"{param} must be 'none', 'auto', 'required' or "
                     "{'type': 'function', 'function': {'name': ...}}", param)


@dataclass
class ToolCallConfig:
    """What a request's tools fields mean for prompting, decoding and parsing."""

    tools: list[Tool]
    choice: ToolChoice
    parallel_tool_calls: bool = True

    @classmethod
    def from_request(cls, tools, tool_choice=None, parallel_tool_calls=None) -> "ToolCallConfig | None":
        validated = validate_tools(tools)
        choice = parse_tool_choice(tool_choice, validated)
        if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
            raise ParamError("parallel_tool_calls must be true or false", "parallel_tool_calls")
        if not validated:
            return None
        return cls(validated, choice, True if parallel_tool_calls is None else parallel_tool_calls)

    @property
    def forced(self) -> bool:
        """Calls are forced by a grammar (required / a named function)."""
        return self.choice.mode in ("required", "function")

    def template_tools(self) -> list[dict] | None:
        """`tools=` for the chat template: None with tool_choice "none", so the model is not offered them."""
        return None if self.choice.mode == "none" else [t.as_openai() for t in self.tools]

    def constraint(self) -> StructuredOutput | None:
        if self.choice.mode == "function":
            tool = next(t for t in self.tools if t.name == self.choice.name)
            return StructuredOutput(json=tool.parameters)
        if self.choice.mode == "required":
            return StructuredOutput(json=required_calls_schema(self.tools, self.parallel_tool_calls))
        return None

    def parser(self, tool_parser: str = "auto", chat_template: str | None = None) -> ToolParser | None:
        """A fresh parser for one choice's output (None: the text is plain content)."""
        if self.choice.mode == "function":
            return NamedCallParser(self.choice.name)
        if self.choice.mode == "required":
            return RequiredCallsParser()
        if self.choice.mode == "auto":
            return get_tool_parser(tool_parser, chat_template)(tools=self.tools)
        return None


def required_calls_schema(tools: list[Tool], parallel: bool = True) -> dict:
    """[{"name": <tool>, "arguments": <its parameters>}, ...]: one or more calls (one if not parallel).

    Each tool's "$defs"/"definitions" move to the root (renamed per tool) so its "$ref"s still resolve."""
    defs: dict = {}
    calls = []
    for tool in tools:
        arguments = _hoist_definitions(tool.parameters, tool.name, defs)
        calls.append({"type": "object", "properties": {"name": {"type": "string", "enum": [tool.name]},
                                                        "arguments": arguments},
                      "required": ["name", "arguments"], "additionalProperties": False})
    schema = {"type": "array", "minItems": 1, "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}
    if not parallel:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


def _hoist_definitions(schema: dict, prefix: str, defs: dict) -> dict:
    schema = copy.deepcopy(schema)
    local = {**schema.pop("definitions", {}), **schema.pop("$defs", {})}
    if not local and not _has_root_ref(schema):
        return schema
    renames = {f"#/{kind}/{name}": f"#/$defs/{prefix}__{name}" for kind in ("$defs", "definitions") for name in local}
    renames["#"] = f"#/$defs/{prefix}__"
    for name, sub in local.items():
        defs[f"{prefix}__{name}"] = _rewrite_refs(sub, renames)
    schema = _rewrite_refs(schema, renames)
    if _has_root_ref(schema, f"#/$defs/{prefix}__"):
        defs[f"{prefix}__"] = schema  # the schema refers to itself: it must be a definition too
    return schema


def _rewrite_refs(node, renames: dict):
    if isinstance(node, dict):
        return {k: (_rename(v, renames) if k == "$ref" and isinstance(v, str) else _rewrite_refs(v, renames))
                for k, v in node.items()}
    if isinstance(node, list):
        return [_rewrite_refs(v, renames) for v in node]
    return node


def _rename(ref: str, renames: dict) -> str:
    if ref in renames:
        return renames[ref]
    for old, new in renames.items():  # a pointer into a definition: #/$defs/X/properties/y
        if old != "#" and ref.startswith(old + "/"):
            return new + ref[len(old):]
    return ref


def _has_root_ref(node, root: str = "#") -> bool:
    if isinstance(node, dict):
        return node.get("$ref") == root or any(_has_root_ref(v, root) for v in node.values())
    if isinstance(node, list):
        return any(_has_root_ref(v, root) for v in node)
    return False


def finish_reason_with_calls(finish_reason: str | None, tool_calls: list[dict]) -> str | None:
    """OpenAI's finish_reason "tool_calls" when a completed answer made calls."""
    return "tool_calls" if tool_calls and finish_reason == "stop" else finish_reason


def assistant_message(content: str | None, tool_calls: list[dict]) -> dict:
    """The chat completion `message` of an answer that may have made calls."""
    message = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message
