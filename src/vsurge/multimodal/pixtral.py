"""Pixtral / Mistral 3 images: each image scaled down (never up) to fit `longest_edge`, then up to whole
merged blocks (patch_size x spatial_merge_size pixels) per side, bicubic; its [IMG] placeholder becomes one
[IMG] per block, row by row, each row closed by [IMG_BREAK] and the last by [IMG_END] (transformers'
PixtralImageProcessor (PIL backend) and PixtralProcessor, which hands the image processor the merged block
as its patch size). Pixels stay uint8 here; the model's vision program normalizes them and cuts the patches."""

from __future__ import annotations

import math

import numpy as np

from .processor import ImageProcessor


def fitted_size(height: int, width: int, max_height: int, max_width: int, block: int) -> tuple[int, int]:
    """(height, width) of the resized image: scaled by the largest ratio over the maximum (floored, keeping
    it within), then each edge rounded up to whole blocks."""
    ratio = max(height / max_height, width / max_width)
    if ratio > 1:
        height, width = int(math.floor(height / ratio)), int(math.floor(width / ratio))
    return (max(height - 1, 0) // block + 1) * block, (max(width - 1, 0) // block + 1) * block


class PixtralImages(ImageProcessor):
    def __init__(self, config, preprocessor: dict, processor: dict, tokenizer):
        super().__init__(config, tokenizer)
        self.patch, self.merge = config.patch_size, config.merge_size
        for key, value in (("patch_size", self.patch), ("spatial_merge_size", self.merge)):
            if key in processor and int(processor[key]) != value:
                raise ValueError(f"the processor's {key} {processor[key]} differs from the model's {value}")
        size = preprocessor.get("size") or {}
        longest = size.get("longest_edge")
        self.max_size = (int(longest), int(longest)) if longest else (int(size.get("height", 1024)),
                                                                       int(size.get("width", 1024)))
        self.resize = bool(preprocessor.get("do_resize", True))
        self.resample = int(preprocessor.get("resample", 3))  # PIL's BICUBIC
        self.placeholder = processor.get("image_token", "[IMG]")
        self.row_end = processor.get("image_break_token", "[IMG_BREAK]")
        self.image_end = processor.get("image_end_token", "[IMG_END]")

    def signature(self) -> bytes:
        return f"pixtral:{self.max_size}:{self.patch}:{self.merge}:{self.resize}:{self.resample}".encode()

    def tiles(self, image) -> tuple[np.ndarray, int, int]:
        """RGB PIL image -> (uint8 (1, H, W, 3) the resized image, token rows, token cols)."""
        block = self.patch * self.merge
        if self.resize:
            h, w = fitted_size(image.height, image.width, *self.max_size, block)
            image = image.resize((w, h), resample=self.resample)
        elif image.height % block or image.width % block:
            raise ValueError(f"without resizing, an image must be whole {block}-pixel blocks")
        return np.asarray(image)[None], image.height // block, image.width // block

    def expansion(self, rows: int, cols: int) -> str:
        row = self.placeholder * cols
        return (row + self.row_end) * (rows - 1) + row + self.image_end

    def num_tokens(self, pixels: np.ndarray) -> int:
        return pixels.shape[1] * pixels.shape[2] // (self.patch * self.merge) ** 2
