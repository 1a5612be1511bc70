"""Check a finished output against its constraint with tools other than the grammar engine.

For tests and debugging: JSON through `jsonschema` (the `test` extra), regexes
through Python's `re` (Rust's syntax agrees for the common subset), choices by
equality; grammars have no independent checker and are replayed through
llguidance on a byte-level vocabulary.
"""

from __future__ import annotations

import json
import re

from .spec import StructuredOutput, _byte_tokenizer


def validate_output(constraint: StructuredOutput | dict, text: str) -> None:
    """Raise ValueError saying why `text` does not satisfy `constraint`."""
    constraint = StructuredOutput.coerce(constraint)
    kind = constraint.kind
    if kind in ("json", "json_object"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"the output is not JSON: {e}") from None
        if kind == "json_object":
            if not isinstance(value, dict):
                raise ValueError(f"the output is JSON but not an object: {type(value).__name__}")
            return
        import jsonschema

        try:
            jsonschema.validate(value, constraint.json)
        except jsonschema.ValidationError as e:
            raise ValueError(f"the output does not follow the schema: {e.message}") from None
    elif kind == "regex":
        if re.fullmatch(constraint.regex, text) is None:
            raise ValueError(f"the output {text!r} does not match the regex {constraint.regex!r}")
    elif kind == "choice":
        if text not in constraint.choice:
            raise ValueError(f"the output {text!r} is not one of the choices")
    else:
        _replay(constraint, text)


def _replay(constraint: StructuredOutput, text: str) -> None:
    import llguidance

    tokenizer = _byte_tokenizer()
    matcher = llguidance.LLMatcher(tokenizer, constraint.grammar_text(), log_level=0)
    if not matcher.consume_tokens(list(text.encode("utf-8"))) or not matcher.is_accepting():
        raise ValueError(f"the output {text!r} is not a complete sentence of the grammar")
