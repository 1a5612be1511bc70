"""Error responses in each API's shape: OpenAI's {"error": {"message", "type", "param", "code"}}, and
Anthropic's {"type": "error", "error": {"type", "message"}} for the Messages routes."""

from __future__ import annotations

import json
import re

from fastapi.responses import JSONResponse

ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    413: "RequestTooLargeError",
    422: "BadRequestError",
    500: "InternalServerError",
    501: "NotImplementedError",
    503: "ServiceUnavailableError",
}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers


def error_body(status: int, message: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "APIError"), "param": param,
                      "code": status}}


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
    501: "invalid_request_error",
    503: "overloaded_error",
}
ANTHROPIC_PATHS = ("/v1/messages",)  # and below


def anthropic_error_body(status: int, message: str, param: str | None = None) -> dict:
    return {"type": "error", "error": {"type": ANTHROPIC_ERROR_TYPES.get(status, "api_error"), "message": message}}


def error_response(status: int, message: str, param: str | None = None, headers: dict | None = None,
                   path: str = "") -> JSONResponse:
    """The error in the shape of the API that `path` belongs to (OpenAI's unless it is Anthropic's)."""
    anthropic = any(path == p or path.startswith(p + "/") for p in ANTHROPIC_PATHS)
    body = (anthropic_error_body if anthropic else error_body)(status, message, param)
    return EchoSafeJSONResponse(body, status_code=status, headers=headers)


_TYPE_TAGS = re.compile(r"^(str|int|float|bool|bytes|none|list|dict|json-or-python|function-[a-z]+|lax-or-strict|"
                        r"constrained-[a-z]+|tagged-union)(\[.*\])?$")


def validation_message(errors: list[dict]) -> tuple[str, str | None]:
    """A readable message (and the offending field) from pydantic/FastAPI validation errors. Union
    members' tags (`input.str`, `input.list[str]`) are not fields: the field is what precedes them."""
    if not errors:
        return "invalid request", None
    first = errors[0]
    loc = []
    for part in first.get("loc", ()):
        if isinstance(part, str) and _TYPE_TAGS.match(part):
            break
        if part != "body":
            loc.append(str(part))
    param = ".".join(loc) or None
    msg = first.get("msg", "invalid value")
    if first.get("type") == "json_invalid":
        return f"the request body is not valid JSON: {first.get('ctx', {}).get('error', msg)}", None
    if first.get("type") == "missing":
        return f"'{param}' is a required field", param
    return (f"{param}: {msg}" if param else msg), param
