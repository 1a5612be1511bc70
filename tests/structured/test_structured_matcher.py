"""Constraints, the grammar compiler and per-sequence matchers on the default model's vocabulary.

Random walks sample among the tokens each mask allows until the matcher finishes;
whatever they produce must satisfy the constraint (checked with jsonschema / re)."""

from __future__ import annotations

import json
import re
import threading
from typing import Literal, Optional

import numpy as np
import pytest
from structured_helpers import assert_tokens_allowed, processor, random_walk, walk_text

from vsurge.sampling.params import SamplingParams
from vsurge.structured.bitmask import allocate_bitmask, allowed_tokens, token_allowed
from vsurge.structured.compiler import compiler_for
from vsurge.structured.matcher import fill_bitmasks
from vsurge.structured.spec import StructuredOutput
from vsurge.structured.validate import validate_output

EOS = 2  # <|im_end|>

FLAT = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                         "member": {"type": "boolean"}}, "required": ["name", "age", "member"]}
NESTED = {"type": "object", "properties": {
    "id": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"},
    "status": {"enum": ["new", "paid", "sent"]},
    "total": {"type": "number", "minimum": 0},
    "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
        "type": "object", "properties": {"sku": {"type": "string", "maxLength": 12},
                                         "qty": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["sku", "qty"]}},
    "note": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
    "required": ["id", "status", "total", "items"]}


def compiler():
    return compiler_for(processor())


def walk_and_validate(constraint, seeds=range(3)) -> list[str]:
    """Walk, validate, then replay the text as the tokenizer would write it: all allowed."""
    texts = []
    for seed in seeds:
        text = walk_text(compiler().matcher(constraint, [EOS]), seed)
        validate_output(constraint, text)
        assert_tokens_allowed(compiler().matcher(constraint, [EOS]), processor().encode(text) + [EOS])
        texts.append(text)
    return texts


@pytest.mark.parametrize("schema", [FLAT, NESTED], ids=["flat", "nested"])
def test_json_schema_walks_validate(schema):
    texts = walk_and_validate({"json": schema})
    for text in texts:
        assert list(json.loads(text)) == [k for k in schema["properties"] if k in json.loads(text)]  # schema order
        assert ", " in text or len(json.loads(text)) <= 1  # json.dumps separators


def test_masks_allow_every_token_of_canonical_documents():
    """The documents the mask benchmark walks, as the tokenizer writes them (json.dumps style);
    an array of objects ending in an enum value once lost the `"}` token (llguidance, strict
    whitespace)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
    from structured_masks import CASES

    for case in CASES:
        constraint = {{"json": "json", "regex": "regex", "choice": "choice"}[case.kind]: case.spec}
        assert_tokens_allowed(compiler().matcher(constraint, [EOS]), processor().encode(case.document) + [EOS])
    spaced = '{ "name": "Ada", "age": 36 , "member": true }'  # one optional space per gap
    assert_tokens_allowed(compiler().matcher({"json": FLAT}, [EOS]), processor().encode(spaced) + [EOS])
    matcher = compiler().matcher({"json": FLAT}, [EOS])
    tokens = processor().encode('{"name": "Ada",\n')  # no newlines, no runs of spaces
    assert matcher.accept_tokens(tokens) < len(tokens)


def test_undeclared_keys_are_refused_unless_allowed():
    closed = compiler().matcher({"json": FLAT})
    prefix = processor().encode('{"name": "x", "age": 1, "member": true')
    assert closed.accept_tokens(prefix) == len(prefix)
    assert not closed.accept_tokens(processor().encode(', "extra": 1}')) == 2  # ", " then '"' is refused
    open_schema = {**FLAT, "additionalProperties": True}
    matcher = compiler().matcher({"json": open_schema})
    tokens = processor().encode('{"name": "x", "age": 1, "member": true, "extra": 1}')
    assert matcher.accept_tokens(tokens) == len(tokens) and matcher.is_finished


def test_tool_call_array_schema_with_defs_walks_validate():
    from vsurge.structured.tools import Tool, required_calls_schema

    weather = {"type": "object", "$defs": {"Unit": {"enum": ["c", "f"]}},
               "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"$ref": "#/$defs/Unit"}},
               "required": ["city", "unit"]}
    schema = required_calls_schema([Tool("get_weather", weather), Tool("now")])
    for text in walk_and_validate({"json": schema}):
        for call in json.loads(text):
            assert call["name"] in ("get_weather", "now")


def test_pydantic_strict_schema_from_the_openai_client():
    """client.beta.chat.completions.parse(response_format=Model) sends this shape:
    strict: true, additionalProperties: false, every field required, $defs/$ref, anyOf null."""
    from openai.lib._parsing._completions import type_to_response_format_param
    from pydantic import BaseModel

    from vsurge.structured.openai_fields import structured_request

    class Step(BaseModel):
        explanation: str
        output: Optional[int]

    class Solution(BaseModel):
        steps: list[Step]
        answer: str
        confidence: Literal["low", "high"]

    response_format = type_to_response_format_param(Solution)
    schema = response_format["json_schema"]["schema"]
    assert response_format["json_schema"]["strict"] is True and "$defs" in schema
    constraint = structured_request({"response_format": response_format}).constraint
    for text in walk_and_validate(constraint):
        Solution.model_validate_json(text)  # what the client does with the answer


def test_regex_and_choice_walks_match():
    for text in walk_and_validate({"regex": r"(\+33|0)[1-9]( [0-9]{2}){4}"}):
        assert re.fullmatch(r"(\+33|0)[1-9]( [0-9]{2}){4}", text)
    choices = ["red", "green", "blue", "dark blue", 'say "hi"', "née"]
    seen = {text for text in walk_and_validate({"choice": choices}, seeds=range(12))}
    assert seen <= set(choices) and len(seen) > 1


def test_json_object_and_lark_grammar_walks():
    for text in walk_and_validate({"json_object": True}, seeds=range(4)):
        assert isinstance(json.loads(text), dict)
    grammar = 'start: "The answer is " NUMBER "."\nNUMBER: /[1-9][0-9]{0,2}/'
    for text in walk_and_validate({"grammar": grammar}):
        assert re.fullmatch(r"The answer is [1-9][0-9]{0,2}\.", text)


def test_gbnf_grammar_is_accepted():
    texts = walk_and_validate({"grammar": 'root ::= "yes" | "no"'}, seeds=range(6))
    assert set(texts) <= {"yes", "no"}


def test_end_tokens_only_when_complete():
    p = processor()
    matcher = compiler().matcher({"regex": "[0-9]+"}, [EOS])
    bitmask = allocate_bitmask(1, p.vocab_size)
    matcher.fill_bitmask(bitmask, 0)
    assert not token_allowed(bitmask[0], EOS)  # nothing yet: cannot end
    assert not matcher.accept(EOS) and not matcher.is_finished  # refused, and no harm done
    assert matcher.accept(p.encode("4")[0])
    matcher.fill_bitmask(bitmask, 0)
    assert token_allowed(bitmask[0], EOS) and token_allowed(bitmask[0], p.encode("2")[0])
    assert matcher.accept(EOS) and matcher.is_finished


def test_stop_token_ids_end_only_a_complete_output():
    p = processor()
    period = p.encode(".")[0]  # a stop token id that the grammar also allows as text
    matcher = compiler().matcher({"regex": "[a-z.]+"}, [EOS, period])
    bitmask = allocate_bitmask(1, p.vocab_size)
    matcher.fill_bitmask(bitmask, 0)
    assert not token_allowed(bitmask[0], period)  # ending now would leave an empty (invalid) output
    assert matcher.accept(p.encode("a")[0])
    matcher.fill_bitmask(bitmask, 0)
    assert token_allowed(bitmask[0], period) and token_allowed(bitmask[0], EOS)
    assert matcher.accept(period) and matcher.is_finished  # it ended the output, as the request asked


def test_finished_grammar_allows_only_the_end_ids():
    p = processor()
    matcher = compiler().matcher({"choice": ["yes", "no"]}, [EOS, 7])
    assert matcher.accept_tokens(p.encode("no")) == 1
    assert matcher.is_finished  # nothing can follow: the engine ends the row here
    bitmask = allocate_bitmask(1, p.vocab_size)
    matcher.fill_bitmask(bitmask, 0)
    assert set(allowed_tokens(bitmask[0], p.vocab_size)) == {EOS, 7}


def test_ignore_eos_still_ends_and_never_masks_everything():
    matcher = compiler().matcher({"choice": ["yes"]}, end_token_ids=[])  # ignore_eos, no stop ids
    assert matcher.accept_tokens(processor().encode("yes")) == 1 and matcher.is_finished
    bitmask = allocate_bitmask(1, processor().vocab_size)
    matcher.fill_bitmask(bitmask, 0)
    assert list(allowed_tokens(bitmask[0], processor().vocab_size)) == [EOS]


def test_rollback_and_validate_tokens():
    p = processor()
    matcher = compiler().matcher({"json": FLAT}, [EOS])
    doc = p.encode('{"name": "Ada", "age": 36, "member": false}') + [EOS]
    assert matcher.validate_tokens(doc) == len(doc) and matcher.num_accepted == 0
    assert matcher.validate_tokens(doc[:3] + p.encode("}")) == 3
    assert matcher.accept_tokens(doc) == len(doc) and matcher.is_finished
    assert matcher.rollback(4) and not matcher.is_finished and matcher.num_accepted == len(doc) - 4
    assert matcher.accept_tokens(doc[-4:]) == 4 and matcher.is_finished
    assert not matcher.rollback(len(doc) + 1)


def test_parallel_fill_equals_one_by_one(monkeypatch):
    import vsurge.structured.matcher as matcher_module

    monkeypatch.setattr(matcher_module, "PARALLEL_MIN_ROWS", 2)  # take llguidance's threaded path
    monkeypatch.setattr(matcher_module, "PARALLEL_MIN_CPUS", 1)
    p = processor()
    constraints = [{"json": FLAT}, {"regex": "[a-z]+"}, {"choice": ["x", "y"]}, {"json_object": True}]
    matchers = [compiler().matcher(c, [EOS]) for c in constraints]
    matchers[0].accept_tokens(p.encode('{"name": "A'))
    matchers[2].accept_tokens(p.encode("x"))
    together = allocate_bitmask(6, p.vocab_size)  # rows 0 and 5 stay free
    fill_bitmasks(together, [(i + 1, m) for i, m in enumerate(matchers)])
    alone = allocate_bitmask(6, p.vocab_size)
    for i, m in enumerate(matchers):
        m.fill_bitmask(alone, i + 1)
    np.testing.assert_array_equal(together, alone)
    assert (together[0] == -1).all() and (together[5] == -1).all()


def test_compiled_grammars_are_cached_and_thread_safe():
    c = compiler()
    constraint = StructuredOutput(json={"type": "object", "properties": {"n": {"type": "integer"}}})
    assert c.compile(constraint) is c.compile({"json": {"type": "object", "properties": {"n": {"type": "integer"}}}})
    results, errors = [], []

    def work(i):
        try:
            m = c.matcher({"regex": f"a{{{i % 3 + 1}}}"}, [EOS])
            results.append(len(random_walk(m, np.random.default_rng(i))))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 8


@pytest.mark.parametrize("fields, message", [
    ({"json": '{"type": "foo"}'}, "invalid JSON schema"),
    ({"json": "{not json"}, "not valid JSON"),
    ({"json": {"type": "string", "minLength": 3, "maxLength": 1}}, "invalid JSON schema"),
    ({"json": {"type": "array", "uniqueItems": True}}, "uniqueItems"),
    ({"regex": "(unclosed"}, "invalid regex"),
    ({"regex": "a[^\\s\\S]"}, "regex cannot match anything"),
    ({"choice": []}, "at least one"),
    ({"choice": ["a", 3]}, "list of strings"),
    ({"grammar": "start: missing_rule"}, "invalid grammar"),
    ({"regex": "a", "choice": ["a"]}, "exactly one"),
    ({"json_object": True, "json": {}}, "exactly one"),
    ({"xml": "<a/>"}, "unknown structured output field"),
])
def test_invalid_constraints_raise_value_errors_naming_the_problem(fields, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        SamplingParams(structured=fields)


def test_sampling_params_carry_the_constraint():
    import dataclasses

    params = SamplingParams(structured={"choice": ["yes", "no"]}, max_tokens=4)
    assert params.structured == StructuredOutput(choice=["yes", "no"])
    assert SamplingParams(**dataclasses.asdict(params)).structured == params.structured  # round trip
    assert SamplingParams().structured is None


def test_wider_logits_than_vocabulary_never_allow_the_padding():
    from vsurge.structured.compiler import GrammarCompiler

    p = processor()
    wide = GrammarCompiler(p, vocab_size=p.vocab_size + 40)
    matcher = wide.matcher({"json_object": True})
    bitmask = wide.allocate_bitmask(1)
    assert bitmask.shape == (1, (p.vocab_size + 40 + 31) // 32)
    matcher.fill_bitmask(bitmask, 0)
    assert allowed_tokens(bitmask[0], p.vocab_size + 40).max() < p.vocab_size
