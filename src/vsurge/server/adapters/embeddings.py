"""POST /v1/embeddings (OpenAI): texts or token ids -> pooled, L2-normalised final hidden states.

Every input of a request is submitted at once; the engine packs them (several per row)
into as few device calls as its token budget allows (engine/encode.py), between its
generation steps. Pooling is the mean over the input's tokens or its last token
(`vsurge serve --pooling`; auto: a sentence-transformers pooling config beside the
model, else the last token, as vLLM does for decoder models). `dimensions` keeps the
first N values and normalises again (Matryoshka-style); `encoding_format: "base64"` sends
little-endian float32 bytes, which the openai client decodes.
"""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any, Optional

import numpy as np
from fastapi.responses import JSONResponse
from pydantic import StrictBool, StrictStr

from ...structured.errors import ParamError
from ..errors import APIError
from ..protocol import WholeInt
from ..routes import GUARDED, Route
from .common import LARGE_INPUT_CHARS, WireModel, as_api_error, prompt_items

MAX_INPUTS = 2048  # OpenAI's limit per request
POOLINGS = ("mean", "last")


class EmbeddingRequest(WireModel):
    model: Optional[StrictStr] = None
    # a string, strings, token ids or token-id lists (common.prompt_items checks it)
    input: Optional[Any] = None
    encoding_format: Optional[StrictStr] = None  # None: "float"
    dimensions: Optional[WholeInt] = None
    normalize: Optional[StrictBool] = None  # vLLM's: False returns the pooled states as they are (None: true)
    user: Optional[StrictStr] = None


def pooling_for_model(path) -> str:
    """The pooling a model's sentence-transformers config asks for (1_Pooling/config.json: mean or
    last token), else "last" (a decoder's last token has read the whole input)."""
    folder = Path(path) if path is not None else None
    config = folder / "1_Pooling" / "config.json" if folder is not None and folder.is_dir() else None
    if config is not None and config.exists():
        try:
            modes = json.loads(config.read_text())
        except (OSError, json.JSONDecodeError):
            return "last"
        if modes.get("pooling_mode_mean_tokens"):
            return "mean"
    return "last"


def _pooled(result: dict, pooling: str, dimensions: int | None, normalize: bool) -> np.ndarray:
    vector = np.asarray(result[pooling], np.float32)
    if dimensions is not None:
        vector = vector[:dimensions]
    if normalize:
        vector = vector / max(float(np.linalg.norm(vector)), 1e-12)
    return vector


def _encoded(vector: np.ndarray, encoding: str):
    if encoding == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()


async def _token_lists(surge, value) -> list[list[int]]:
    if value is None:
        raise APIError(400, "'input' is a required field", "input", code="missing_required_parameter")
    try:
        value = prompt_items(value, "input")
    except ParamError as exc:
        raise as_api_error(exc) from None
    if isinstance(value[0], list):
        return value
    for i, text in enumerate(value):
        if text == "":
            raise APIError(400, f"input[{i}] is empty", "input")
    encode = surge.processor.encode
    if sum(len(v) for v in value) > LARGE_INPUT_CHARS:
        return await asyncio.to_thread(lambda: [encode(v) for v in value])
    return [encode(v) for v in value]


async def respond(server, body: EmbeddingRequest):
    surge = await server.surge_for(body.model)
    encoding = body.encoding_format or "float"
    if encoding not in ("float", "base64"):
        raise APIError(400, f"encoding_format must be 'float' or 'base64', got {body.encoding_format!r}",
                       "encoding_format")
    hidden = surge.engine.model.config.hidden_size
    if body.dimensions is not None and not 1 <= body.dimensions <= hidden:
        raise APIError(400, f"dimensions must be in [1, {hidden}] for this model, got {body.dimensions}",
                       "dimensions")
    prompts = await _token_lists(surge, body.input)
    if len(prompts) > MAX_INPUTS:
        raise APIError(400, f"input holds {len(prompts)} items, more than the {MAX_INPUTS} allowed", "input")
    try:
        results = await surge.encode(prompts, "embed")
    except (ValueError, TypeError) as exc:
        raise APIError(400, str(exc), "input") from None
    except RuntimeError as exc:
        raise APIError(503, f"embedding failed: {exc}") from None
    pooling = server.pooling_for(surge)
    data = [{"object": "embedding", "index": i,
             "embedding": _encoded(_pooled(r, pooling, body.dimensions, body.normalize is not False), encoding)}
            for i, r in enumerate(results)]
    tokens = sum(len(p) for p in prompts)
    return JSONResponse({"object": "list", "data": data, "model": server.name_of(surge),
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


# the routes this adapter answers (app.py installs every adapter module's ROUTES)
ROUTES = (Route("POST", "/v1/embeddings", GUARDED, respond, "embeddings"),)
