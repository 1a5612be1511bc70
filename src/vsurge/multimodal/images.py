"""Images out of requests: `data:` URIs, http(s) URLs (only from allowed domains), local files
(only under an allowed folder), decoded with Pillow. Every refusal is an ImageError naming the
problem (the server answers it with that API's 4xx)."""

from __future__ import annotations

import base64
import binascii
import io
import os
import urllib.parse
import urllib.request
from dataclasses import dataclass

FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
MAX_IMAGE_BYTES = 20 * 2**20
MAX_IMAGE_PIXELS = 40_000_000  # a decompression bomb is refused before it is decoded


class ImageError(ValueError):
    """A bad image input: `param` names the request field."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class MediaPolicy:
    """Where images may come from (vsurge serve's --allowed-media-domains, --allowed-local-media-path)."""

    allowed_domains: tuple[str, ...] = ()  # http(s) hosts (and their subdomains); empty: no URLs fetched
    allowed_local_path: str | None = None  # files under this folder; None: no local files
    max_bytes: int = MAX_IMAGE_BYTES
    timeout: float = 10.0
    max_images: int = 16  # per request

    def domain_allowed(self, host: str) -> bool:
        host = host.lower().rstrip(".")
        return any(host == d or host.endswith("." + d) for d in (d.lower().strip(".") for d in self.allowed_domains))


def image_bytes(url: str, policy: MediaPolicy, param: str = "image_url") -> bytes:
    """The bytes an image reference names: a data: URI, an http(s) URL, or a file path / file:// URL."""
    if not isinstance(url, str) or not url:
        raise ImageError("the image URL must be a non-empty string", param)
    if url.startswith("data:"):
        return _data_uri(url, policy, param)
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme in ("http", "https"):
        return _fetch(url, policy, param)
    if scheme == "file" or (not scheme and url.startswith("/")):
        return _local(urllib.parse.unquote(urllib.parse.urlsplit(url).path) if scheme else url, policy, param)
    raise ImageError(f"unsupported image URL scheme {scheme or url[:16]!r} (send a data: URI with base64 bytes, "
                     "or an http(s) URL the server allows)", param)


def decode_base64(data: str, policy: MediaPolicy, param: str) -> bytes:
    if len(data) > policy.max_bytes * 4 // 3 + 8:
        raise ImageError(f"the image is larger than the server's limit of {policy.max_bytes} bytes", param)
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("the image data is not valid base64", param) from None


def _data_uri(url: str, policy: MediaPolicy, param: str) -> bytes:
    head, sep, data = url.partition(",")
    if not sep or ";base64" not in head:
        raise ImageError("a data: image URI must be base64 (data:image/png;base64,...)", param)
    mime = head[5:].split(";")[0].lower()
    if mime and not mime.startswith("image/"):
        raise ImageError(f"a data: URI of type {mime!r} is not an image", param)
    return decode_base64(data, policy, param)


def _fetch(url: str, policy: MediaPolicy, param: str) -> bytes:
    host = urllib.parse.urlsplit(url).hostname or ""
    if not policy.domain_allowed(host):
        raise ImageError(f"image URLs from {host!r} are not allowed by this server (send the image as a base64 "
                         "data: URI, or start the server with --allowed-media-domains)", param)
    try:
        with urllib.request.urlopen(url, timeout=policy.timeout) as response:  # noqa: S310 (scheme checked)
            data = response.read(policy.max_bytes + 1)
    except (OSError, ValueError) as exc:
        raise ImageError(f"could not fetch the image at {url!r}: {exc}", param) from None
    if len(data) > policy.max_bytes:
        raise ImageError(f"the image is larger than the server's limit of {policy.max_bytes} bytes", param)
    return data


def _local(path: str, policy: MediaPolicy, param: str) -> bytes:
    if policy.allowed_local_path is None:
        raise ImageError("local image files are not allowed by this server (start it with "
                         "--allowed-local-media-path)", param)
    root = os.path.realpath(policy.allowed_local_path)
    real = os.path.realpath(path)
    if os.path.commonpath([root, real]) != root:
        raise ImageError(f"{path!r} is outside the allowed media folder", param)
    try:
        if os.path.getsize(real) > policy.max_bytes:
            raise ImageError(f"the image is larger than the server's limit of {policy.max_bytes} bytes", param)
        with open(real, "rb") as f:
            return f.read()
    except OSError as exc:
        raise ImageError(f"could not read the image file {path!r}: {exc.strerror}", param) from None


def decode_image(data: bytes, param: str = "image"):
    """bytes -> an RGB PIL image (transparency composited on white, as HF's image processors do)."""
    from PIL import Image, UnidentifiedImageError

    if len(data) == 0:
        raise ImageError("the image is empty", param)
    try:
        with Image.open(io.BytesIO(data)) as probe:
            fmt, (w, h) = probe.format, probe.size
    except UnidentifiedImageError:
        raise ImageError(f"the image could not be decoded (supported formats: {', '.join(FORMATS)})", param) from None
    except Exception as exc:  # a truncated or corrupt header
        raise ImageError(f"the image could not be decoded: {exc}", param) from None
    if fmt not in FORMATS:
        raise ImageError(f"image format {fmt} is not supported (supported: {', '.join(FORMATS)})", param)
    if w * h > MAX_IMAGE_PIXELS or w < 1 or h < 1:
        raise ImageError(f"the image is {w} x {h} pixels; the limit is {MAX_IMAGE_PIXELS} pixels", param)
    try:
        image = Image.open(io.BytesIO(data))
        image.load()
    except Exception as exc:
        raise ImageError(f"the image could not be decoded: {exc}", param) from None
    return to_rgb(image)


def to_rgb(image):
    """transformers' convert_to_rgb: transparency composited onto white, then RGB."""
    from PIL import Image

    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")
