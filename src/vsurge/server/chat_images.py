"""Images in chat requests, for every wire format: each adapter turns its image parts into
`image_part`s inside a message's content list; `render_with_images` fetches them (as the server's
MediaPolicy allows), renders the chat template with its image placeholders and hands both to the
model's image processor -> a MultimodalPrompt. Every refusal is a 400 naming the field."""

from __future__ import annotations

import asyncio

from ..multimodal import ImageError, MediaPolicy, image_bytes
from ..multimodal.chat import chat_prompt
from ..structured.errors import ParamError
from ..tokenizer.chat_template import ChatTemplateError
from ..tokenizer.vision_chat import image_parts
from .errors import APIError

NOT_SUPPORTED = "image inputs are not supported by this model"


def image_part(url, param: str, detail: str | None = None) -> dict:
    """An image of a message's content (url: a data: URI, an http(s) URL or a file path; detail: OpenAI's
    "low" / "high" / "auto", which a model with a choice of resolutions honours: multimodal/processor.py)."""
    if not isinstance(url, str) or not url:
        raise ParamError(f"{param} must be a URL string (a data: URI with base64 bytes, or http(s))", param)
    return {"type": "image", "url": url, "param": param, "detail": detail}


def _detail(value: dict, param: str) -> str | None:
    detail = value.get("detail")
    if detail is not None and detail not in ("auto", "low", "high"):
        raise ParamError(f"{param}.detail must be auto, low or high", f"{param}.detail")
    return detail


def _deferred(parse):
    """A part parser whose refusal waits for render_with_images: a model without images says so first."""
    def parse_or_defer(part: dict, param: str) -> dict:
        try:
            return parse(part, param)
        except ParamError as exc:
            return {"type": "image", "error": exc, "param": exc.param or param}
    return parse_or_defer


def text_or_parts(pieces: list) -> str | list[dict]:
    """A message's pieces (strings, and image parts where images are) -> one string, or with images a
    list of text and image parts (what render_with_images reads)."""
    if all(isinstance(p, str) for p in pieces):
        return "".join(pieces)
    return [p if isinstance(p, dict) else {"type": "text", "text": p} for p in pieces]


@_deferred
def openai_image_part(part: dict, param: str) -> dict:
    """Chat's {"type": "image_url", "image_url": {"url", "detail"}} (or a bare URL string)."""
    value = part.get("image_url")
    if isinstance(value, dict):
        return image_part(value.get("url"), f"{param}.image_url.url", _detail(value, f"{param}.image_url"))
    return image_part(value, f"{param}.image_url")


@_deferred
def responses_image_part(part: dict, param: str) -> dict:
    """Responses' {"type": "input_image", "image_url": "...", "detail"} (file_id: no file store here)."""
    if part.get("file_id") is not None and part.get("image_url") is None:
        raise ParamError("input_image file_id is not supported (vsurge keeps no files): send image_url",
                         f"{param}.file_id")
    return image_part(part.get("image_url"), f"{param}.image_url", _detail(part, param))


@_deferred
def anthropic_image_block(block: dict, param: str) -> dict:
    """Messages' {"type": "image", "source": {"type": "base64", "media_type", "data"} | {"type": "url", "url"}}."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64":
        media, data = source.get("media_type"), source.get("data")
        if not isinstance(media, str) or not isinstance(data, str):
            raise ParamError(f"{param}.source needs string media_type and data", f"{param}.source")
        if media not in ("image/jpeg", "image/png", "image/gif", "image/webp"):
            raise ParamError(f"{param}.source.media_type {media!r} is not one of image/jpeg, image/png, image/gif, "
                             "image/webp", f"{param}.source.media_type")
        return image_part(f"data:{media};base64,{data}", f"{param}.source.data")
    if kind == "url":
        return image_part(source.get("url"), f"{param}.source.url")
    raise ParamError(f"{param}.source.type must be 'base64' or 'url'", f"{param}.source.type")


async def render_with_images(processor, messages: list[dict], tools, variables: dict, policy: MediaPolicy):
    """-> (prompt text, MultimodalPrompt) of messages holding image parts; APIError 400 for a model
    without images, too many images, an image that cannot be fetched or decoded."""
    parts = image_parts(messages)
    if getattr(processor, "images", None) is None:
        raise APIError(400, NOT_SUPPORTED, parts[0]["param"])
    for part in parts:
        if "error" in part:
            raise APIError(400, str(part["error"]), part["param"])
    if len(parts) > policy.max_images:
        raise APIError(400, f"{len(parts)} images in one request; this server takes at most {policy.max_images}",
                       parts[policy.max_images]["param"])
    try:
        data = [await asyncio.to_thread(image_bytes, p["url"], policy, p["param"]) for p in parts]
        return await asyncio.to_thread(chat_prompt, processor, messages, data, [p["param"] for p in parts], tools,
                                       variables)
    except ImageError as exc:
        raise APIError(400, str(exc), exc.param) from None
    except ChatTemplateError as exc:
        raise APIError(400, str(exc), "messages") from None
