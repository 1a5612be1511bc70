"""Request bodies -> one constraint + tool setup, with errors that name the offending param."""

from __future__ import annotations

import re

import pytest

from vsurge.structured.errors import ParamError
from vsurge.structured.openai_fields import structured_request
from vsurge.structured.spec import StructuredOutput
from vsurge.structured.tool_parsers import HermesParser, RequiredCallsParser

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
TOOL = {"type": "function", "function": {"name": "f", "parameters": SCHEMA}}


@pytest.mark.parametrize("body, expected", [
    ({}, None),
    ({"response_format": {"type": "text"}}, None),
    ({"response_format": {"type": "json_object"}}, StructuredOutput(json_object=True)),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "A", "schema": SCHEMA, "strict": True}}},
     StructuredOutput(json=SCHEMA)),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "A"}}}, StructuredOutput(json_object=True)),
    ({"guided_json": SCHEMA}, StructuredOutput(json=SCHEMA)),
    ({"guided_json": '{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}'},
     StructuredOutput(json=SCHEMA)),
    ({"guided_regex": "[0-9]+"}, StructuredOutput(regex="[0-9]+")),
    ({"guided_choice": ["yes", "no"]}, StructuredOutput(choice=["yes", "no"])),
    ({"guided_grammar": 'root ::= "a"'}, StructuredOutput(grammar='root ::= "a"')),
    ({"structured_outputs": {"choice": ["x"]}}, StructuredOutput(choice=["x"])),
    ({"structured_outputs": {"json_object": True, "disable_any_whitespace": True}}, StructuredOutput(json_object=True)),
    ({"structured_outputs": {"json": SCHEMA, "regex": None}}, StructuredOutput(json=SCHEMA)),
])
def test_fields_map_to_one_constraint(body, expected):
    assert structured_request(body).constraint == expected


@pytest.mark.parametrize("body, param, message", [
    ({"response_format": "json"}, "response_format", "must be an object"),
    ({"response_format": {"type": "xml"}}, "response_format.type", "'xml'"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "must be an object"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "A", "schema": {"type": "nope"}}}},
     "response_format.json_schema.schema", "invalid JSON schema"),
    ({"guided_json": "{oops"}, "guided_json", "not valid JSON"),
    ({"guided_regex": "(a"}, "guided_regex", "invalid regex"),
    ({"guided_regex": "[^\\s\\S]"}, "guided_regex", "cannot match anything"),
    ({"guided_choice": []}, "guided_choice", "at least one"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs", "exactly one"),
    ({"structured_outputs": {"yaml": "a: 1"}}, "structured_outputs.yaml", "unknown field"),
    ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex",
     "not several: got response_format and guided_regex"),
    ({"tools": [TOOL], "tool_choice": "required", "guided_regex": "a"}, "tool_choice", "cannot be combined"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice.function.name",
     "'g', which is not among the tools"),
    ({"tools": [TOOL], "parallel_tool_calls": "yes"}, "parallel_tool_calls", "true or false"),
])
def test_errors_name_the_param(body, param, message):
    with pytest.raises(ParamError, match=re.escape(message)) as info:
        structured_request(body)
    assert info.value.param == param
    assert isinstance(info.value, ValueError)  # the server's 400 path


def test_tools_set_the_constraint_prompt_and_parser():
    auto = structured_request({"tools": [TOOL]})
    assert auto.constraint is None and isinstance(auto.parser(), HermesParser)
    assert auto.template_tools() == [{"type": "function", "function": {"name": "f", "parameters": SCHEMA}}]
    required = structured_request({"tools": [TOOL], "tool_choice": "required"})
    assert required.source == "tool_choice" and required.constraint.json["type"] == "array"
    assert isinstance(required.parser(), RequiredCallsParser)
    # the request's own format wins over free tool calls: its text is content
    formatted = structured_request({"tools": [TOOL], "response_format": {"type": "json_object"}})
    assert formatted.constraint == StructuredOutput(json_object=True) and formatted.parser() is None
    assert structured_request({}).parser() is None and structured_request({}).template_tools() is None


def _node(ref_or_schema, required=("x",)):
    return {"type": "object", "properties": {"x": ref_or_schema}, "required": list(required)}


@pytest.mark.parametrize("schema, satisfiable", [
    ({"$defs": {"a": _node({"$ref": "#/$defs/a"})}, "$ref": "#/$defs/a"}, False),  # must contain itself
    (_node({"$ref": "#"}), False),  # the root itself
    ({"$defs": {"a": _node({"$ref": "#/$defs/b"}), "b": _node({"$ref": "#/$defs/a"})}, "$ref": "#/$defs/a"},
     False),  # a cycle of two
    ({"type": "array", "minItems": 1000000000}, False),
    ({"type": "string", "minLength": 2**24 + 1}, False),
    ({"$defs": {"a": _node({"$ref": "#/$defs/a"}, required=())}, "$ref": "#/$defs/a"}, True),  # x optional
    ({"$defs": {"a": {"anyOf": [{"type": "null"}, _node({"$ref": "#/$defs/a"})]}}, "$ref": "#/$defs/a"}, True),
    ({"$defs": {"a": _node({"type": "array", "items": {"$ref": "#/$defs/a"}})}, "$ref": "#/$defs/a"}, True),
    ({"$defs": {"a": _node({"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/a"}})},
      "$ref": "#/$defs/a"}, False),
    ({"type": "array", "minItems": 100}, True),
])
def test_schemas_no_finite_value_satisfies_are_refused(schema, satisfiable):
    """structured/schema_check.py: a ParamError naming the field, before the grammar engine sees it."""
    body = {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}
    if satisfiable:
        assert structured_request(body).constraint is not None
    else:
        with pytest.raises(ParamError) as info:
            structured_request(body)
        assert info.value.param == "response_format.json_schema.schema"
