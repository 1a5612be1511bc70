"""ParamError: a request field that cannot be served, and which field (OpenAI's error `param`)."""

from __future__ import annotations


class ParamError(ValueError):
    """A ValueError (-> HTTP 400) that names the offending request parameter, e.g.
    "response_format.json_schema.schema" or "tools[1].function.name"."""

    def __init__(self, message: str, param: str | None):
        super().__init__(message)
        self.param = param
