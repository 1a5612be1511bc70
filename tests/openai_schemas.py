"""OpenAI's OpenAPI spec (tests/data/openapi/openai_subset.json, cut by tests/tools/cut_openapi.py from
github.com/openai/openai-openapi, MIT) as jsonschema validators of the server's bodies and events, and
the deliberate deviations (docs/api_conformance.md, "Responses and deliberate deviations") that a
check may let through where its request produces them."""

from __future__ import annotations

import json
from pathlib import Path

from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

ROOT = Path(__file__).resolve().parent.parent
SPEC = json.loads((ROOT / "tests" / "data" / "openapi" / "openai_subset.json").read_text())
REGISTRY = Registry().with_resource("urn:openai", Resource.from_contents(SPEC, default_specification=DRAFT202012))

# docs/api_conformance.md, "Responses and deliberate deviations": (schema, path) -> (why, the values
# let through). A path's list indices are `*`; check() lets a value through only where the request
# that produces it says so (skip=), and only the values named.
DEVIATIONS = {
    ("CreateEmbeddingResponse", "data/*/embedding"): (
        "encoding_format base64: a base64 string of little-endian float32, as OpenAI's server sends it (the spec "
        "types it as an array of numbers only)", lambda v: isinstance(v, str)),
    ("CreateChatCompletionStreamResponse", "choices/*/finish_reason"): (
        "null on every chunk before the choice's last, as OpenAI's server sends it (the spec's enum lacks null)",
        lambda v: v is None),
    ("CreateCompletionResponse", "choices/*/finish_reason"): (
        "streamed: null on every chunk before the choice's last, as OpenAI's server sends it (the spec's "
        "CreateCompletionResponse, which its stream reuses, types it as a string)", lambda v: v is None),
    ("CreateCompletionResponse", "choices/*/logprobs/token_logprobs/*"): (
        "echo with logprobs: the prompt's first token has no logprob (nothing precedes it): null, as OpenAI's "
        "server sends it", lambda v: v is None),
    ("CreateCompletionResponse", "choices/*/logprobs/top_logprobs/*"): (
        "echo with logprobs: the prompt's first token has no alternatives: null, as OpenAI's server sends it",
        lambda v: v is None),
}
BASE64 = ("CreateEmbeddingResponse", "data/*/embedding")
CHUNK_FINISH = ("CreateChatCompletionStreamResponse", "choices/*/finish_reason")
COMPLETION_CHUNK_FINISH = ("CreateCompletionResponse", "choices/*/finish_reason")
ECHO_FIRST_TOKEN = (("CreateCompletionResponse", "choices/*/logprobs/token_logprobs/*"),
                    ("CreateCompletionResponse", "choices/*/logprobs/top_logprobs/*"))

def validator(name: str) -> Draft202012Validator:
    return Draft202012Validator({"$ref": f"urn:openai#/components/schemas/{name}"}, registry=REGISTRY)


VALIDATORS: dict[str, Draft202012Validator] = {}


def _path(error) -> str:
    return "/".join("*" if isinstance(p, int) else str(p) for p in error.absolute_path)


def _describe(error) -> str:
    """The error, and for a union (anyOf/oneOf) its members' own errors, the deepest first."""
    lines = [f"{_path(error) or '<root>'}: {error.message[:300]}"]
    for sub in sorted(error.context or (), key=lambda e: -len(e.absolute_path))[:6]:
        lines.append(f"    {'/'.join(map(str, sub.absolute_path))}: {sub.message[:200]}")
    return "\n".join(lines)


def _accepted(name: str, error, skip: tuple) -> bool:
    """A listed deviation (in skip) at the error's path with a value it lets through; a union
    (anyOf/oneOf) is accepted when one of its members fails only on such deviations."""
    if error.validator in ("anyOf", "oneOf") and error.context:
        branches: dict = {}
        for sub in error.context:
            branches.setdefault(sub.relative_schema_path[0], []).append(sub)
        return any(all(_accepted(name, sub, skip) for sub in subs) for subs in branches.values())
    key = (name, _path(error))
    return key in skip and DEVIATIONS[key][1](error.instance)


def check(name: str, body, skip: tuple = ()) -> None:
    """body must validate against the spec's schema `name`, but for the deviations `skip` names."""
    for key in skip:
        assert key in DEVIATIONS and key[0] == name, key
    found = VALIDATORS.setdefault(name, validator(name)).iter_errors(body)
    errors = [e for e in found if not _accepted(name, e, skip)]
    assert not errors, f"{name} deviations:\n" + "\n".join(_describe(e) for e in errors) + \
        f"\nbody: {json.dumps(body)[:1500]}"
