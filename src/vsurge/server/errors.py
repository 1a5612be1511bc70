"""Error responses in each API's shape: OpenAI's {"error": {"message", "type", "param", "code"}}, and
Anthropic's {"type": "error", "error": {"type", "message"}} for the Messages routes."""

from __future__ import annotations

import json
import re

from fastapi.responses import JSONResponse

# OpenAI's error types by status (its SDKs pick the exception class from the status; `type` is what
# clients log and match on): every 4xx that is not about keys or rates is an invalid request
ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    429: "rate_limit_error",
}
# `code` is a string or null in OpenAI's spec: these when the error says nothing more specific
CODE_BY_STATUS = {401: "invalid_api_key", 404: None, 413: "request_too_large"}
CONTEXT_LENGTH_MARKERS = ("maximum context length", "this engine accepts")  # engine/validation.py's messages


def error_type(status: int) -> str:
    if status in ERROR_TYPES:
        return ERROR_TYPES[status]
    return "invalid_request_error" if 400 <= status < 500 else "server_error"


def default_code(status: int, message: str, param: str | None) -> str | None:
    """The string `code` of an error that did not name one (None: OpenAI's null)."""
    if status in CODE_BY_STATUS:
        return CODE_BY_STATUS[status]
    if status == 400 and any(marker in message for marker in CONTEXT_LENGTH_MARKERS):
        return "context_length_exceeded"
    if status in (400, 422) and param is not None:
        return "invalid_value"
    return None


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, headers: dict | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers
        self.code = code if code is not None else default_code(status, message, param)


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error JSON: `type` by status, `code` a string (model_not_found, invalid_api_key,
    context_length_exceeded, unsupported_parameter, invalid_value, ...) or null."""
    return {"error": {"message": message, "type": error_type(status), "param": param,
                      "code": code if code is not None else default_code(status, message, param)}}


class EchoSafeJSONResponse(JSONResponse):
    """JSON with non-ASCII escaped: error messages echo client input, which may hold lone UTF-16
    surrogates that UTF-8 cannot encode; `\\udXXX` escapes are valid JSON for any string."""

    def render(self, content) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
}
ANTHROPIC_PATHS = ("/v1/messages",)  # and below


def anthropic_error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"type": "error", "error": {"type": ANTHROPIC_ERROR_TYPES.get(status, "api_error"), "message": message}}


def error_response(status: int, message: str, param: str | None = None, headers: dict | None = None,
                   path: str = "", code: str | None = None) -> JSONResponse:
    """The error in the shape of the API that `path` belongs to (OpenAI's unless it is Anthropic's)."""
    anthropic = any(path == p or path.startswith(p + "/") for p in ANTHROPIC_PATHS)
    body = (anthropic_error_body if anthropic else error_body)(status, message, param, code)
    return EchoSafeJSONResponse(body, status_code=status, headers=headers)


_TYPE_TAGS = re.compile(r"^(str|int|float|bool|bytes|none|list|dict|json-or-python|function-[a-z]+|lax-or-strict|"
                        r"constrained-[a-z]+|tagged-union)(\[.*\])?$")


def validation_message(errors: list[dict]) -> tuple[str, str | None]:
    """A readable message (and the offending field) from pydantic/FastAPI validation errors. Union
    members' tags (`input.str`, `input.list[str]`) are not fields: the field is what precedes them.
    A list index is written `messages[0]`, as OpenAI names fields."""
    return validation_error(errors)[:2]


def validation_error(errors: list[dict]) -> tuple[str, str | None, str | None]:
    """(message, param, code) of validation_message."""
    if not errors:
        return "invalid request", None, None
    first = errors[0]
    ctx = first.get("ctx") or {}
    param = ""
    for part in first.get("loc", ()):
        if isinstance(part, str) and _TYPE_TAGS.match(part):
            break
        if part == "body" and not param:
            continue
        param += f"[{part}]" if isinstance(part, int) else (f".{part}" if param else str(part))
    param = param or None
    msg = first.get("msg", "invalid value")
    kind = first.get("type")
    if kind == "json_invalid":
        return f"the request body is not valid JSON: {ctx.get('error', msg)}", None, None
    if kind == "missing":
        return f"'{param}' is a required field", param, "missing_required_parameter"
    if isinstance(ctx.get("param"), str):  # the body-wide checks (protocol.check_json_values) name the field
        return msg, ctx["param"], "invalid_value"
    if param and msg.startswith("must "):  # our own validators' messages read on from the field's name
        return f"{param} {msg}", param, "invalid_value"
    return (f"{param}: {msg}" if param else msg), param, ("invalid_value" if param else None)
