"""Qwen2-VL / Qwen2.5-VL images: each image resized to whole merge blocks of patches near its own size
(smart_resize: between min_pixels and max_pixels, bicubic), its <|image_pad|> repeated once per merged
block (the chat template writes <|vision_start|><|image_pad|><|vision_end|>), and the prompt's M-RoPE
positions (rope_index), as transformers' Qwen2VLImageProcessor (PIL backend), Qwen2_5_VLProcessor and
Qwen2_5_VLModel.get_rope_index do. Pixels stay uint8 here; the model's vision program normalizes them and
cuts the patches."""

from __future__ import annotations

import math

import numpy as np

from .media import MultimodalPrompt
from .processor import ImageProcessor


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width) of whole `factor`-pixel blocks nearest the image's, its area within [min, max]
    pixels (the aspect ratio kept as well as the blocks allow)."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"the image's aspect ratio {max(height, width) / min(height, width):.0f} is over 200")
    h, w = round(height / factor) * factor, round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h, w = max(factor, math.floor(height / beta / factor) * factor), max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h, w


def rope_index(length: int, media, merge_tokens) -> tuple[np.ndarray, int]:
    """(3, length) int32 M-RoPE positions of a prompt and its rope delta: text tokens (p, p, p) counting on
    from the last, an image's tokens (p, p + row, p + col) over its merged grid (merge_tokens(item) ->
    (rows, cols)), the text after it from the image's largest + 1; delta = the largest + 1 - length."""
    out = np.zeros((3, length), np.int32)
    at, next_pos = 0, 0
    for item in sorted(media, key=lambda m: int(m.positions[0])):
        first = int(item.positions[0])
        out[:, at:first] = next_pos + np.arange(first - at)
        next_pos += first - at
        rows, cols = merge_tokens(item)
        r, c = np.divmod(np.arange(rows * cols), cols)
        out[:, first:first + rows * cols] = next_pos + np.stack([np.zeros_like(r), r, c])
        next_pos += max(rows, cols)
        at = first + rows * cols
    out[:, at:] = next_pos + np.arange(length - at)
    return out, int(out.max(initial=-1)) + 1 - length


class QwenVLImages(ImageProcessor):
    placeholder = "<|image_pad|>"

    def __init__(self, config, preprocessor: dict, processor: dict, tokenizer):
        super().__init__(config, tokenizer)
        size = preprocessor.get("size") or {}
        self.min_pixels = int(preprocessor.get("min_pixels") or size.get("shortest_edge") or 56 * 56)
        self.max_pixels = int(preprocessor.get("max_pixels") or size.get("longest_edge") or 28 * 28 * 1280)
        self.patch, self.merge = config.patch_size, config.merge_size
        for key, value in (("patch_size", self.patch), ("merge_size", self.merge),
                           ("temporal_patch_size", config.temporal_patch_size)):
            if int(preprocessor.get(key, value)) != value:
                raise ValueError(f"the image processor's {key} {preprocessor[key]} differs from the tower's {value}")
        self.resize = bool(preprocessor.get("do_resize", True))
        self.resample = int(preprocessor.get("resample", 3))  # PIL's BICUBIC

    def signature(self) -> bytes:
        return f"qwen2_vl:{self.min_pixels}:{self.max_pixels}:{self.patch}:{self.merge}:{self.resample}".encode()

    def tiles(self, image) -> tuple[np.ndarray, int, int]:
        """RGB PIL image -> (uint8 (1, H, W, 3) the resized image, patch rows, patch cols)."""
        factor = self.patch * self.merge
        if self.resize:
            h, w = smart_resize(image.height, image.width, factor, self.min_pixels, self.max_pixels)
            image = image.resize((w, h), resample=self.resample)
        elif image.height % factor or image.width % factor:
            raise ValueError(f"without resizing, an image must be whole {factor}-pixel blocks")
        return np.asarray(image)[None], image.height // self.patch, image.width // self.patch

    def expansion(self, rows: int, cols: int) -> str:
        return self.placeholder * (rows * cols // self.merge ** 2)

    def num_tokens(self, pixels: np.ndarray) -> int:
        return pixels.shape[1] * pixels.shape[2] // (self.patch * self.merge) ** 2

    def merged_grid(self, item) -> tuple[int, int]:
        """(rows, cols) of an image's tokens."""
        side = self.patch * self.merge
        return item.pixels.shape[1] // side, item.pixels.shape[2] // side

    def finish(self, prompt: MultimodalPrompt) -> MultimodalPrompt:
        prompt.rope, prompt.rope_delta = rope_index(len(prompt.ids), prompt.media, self.merged_grid)
        return prompt
