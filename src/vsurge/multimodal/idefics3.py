"""Idefics3 / SmolVLM images: resized to a longest edge, cut into square tiles plus the whole image
downscaled to one tile, each tile `image_seq_len` <image> tokens wrapped in its row/column tag
(transformers' Idefics3ImageProcessor (PIL backend) and Idefics3Processor, which the tests compare
against). Pixels stay uint8 here; the model's vision program rescales and normalizes them."""

from __future__ import annotations

import copy
import math

import numpy as np

from .processor import ImageProcessor

MAX_IMAGE_SIZE = 4096  # transformers' absolute cap on an edge after the first resize


def _to_longest_edge(height: int, width: int, longest: int) -> tuple[int, int]:
    """The first resize: the longest edge becomes `longest` (up or down), the other keeps the aspect
    ratio, rounded up to an even number; then both capped at MAX_IMAGE_SIZE."""
    aspect = width / height
    if width >= height:
        width = longest
        height = int(width / aspect)
        height += height % 2
    else:
        height = longest
        width = int(height * aspect)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    aspect = width / height
    if width >= height and width > MAX_IMAGE_SIZE:
        width, height = MAX_IMAGE_SIZE, int(MAX_IMAGE_SIZE / aspect)
    elif height > width and height > MAX_IMAGE_SIZE:
        height, width = MAX_IMAGE_SIZE, int(MAX_IMAGE_SIZE * aspect)
    return max(height, 1), max(width, 1)


def _to_tile_multiple(height: int, width: int, tile: int) -> tuple[int, int]:
    """The second resize: both edges up to whole tiles (the longer first, the other by the aspect ratio)."""
    aspect = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / aspect) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * aspect) / tile) * tile
    return height, width


class Idefics3Images(ImageProcessor):
    placeholder = "<image>"

    def __init__(self, config, preprocessor: dict, processor: dict, tokenizer):
        super().__init__(config, tokenizer)
        self.longest_edge = int((preprocessor.get("size") or {}).get("longest_edge", 4 * 364))
        self.tile = int((preprocessor.get("max_image_size") or {}).get("longest_edge", config.tile_size[0]))
        if self.tile != config.tile_size[0]:
            raise ValueError(f"max_image_size {self.tile} differs from the vision tower's image_size "
                             f"{config.tile_size[0]}")
        self.split = bool(preprocessor.get("do_image_splitting", True))
        self._low: Idefics3Images | None = None  # for_detail("low")
        self.resize = bool(preprocessor.get("do_resize", True))
        self.resample = int(preprocessor.get("resample", 1))  # PIL's LANCZOS
        self.seq_len = int(processor.get("image_seq_len", config.tokens_per_tile))
        if self.seq_len != config.tokens_per_tile:
            raise ValueError(f"image_seq_len {self.seq_len} differs from the tower's {config.tokens_per_tile} "
                             "tokens per tile")

    def for_detail(self, detail: str | None) -> ImageProcessor:
        """"low": the whole image as one tile, not cut (as do_image_splitting=False): 1 tile's tokens and
        tower work instead of up to rows x cols + 1."""
        if detail != "low" or not self.split:
            return self
        if self._low is None:  # made once: one processor serves every request
            self._low = copy.copy(self)
            self._low.split = False
        return self._low

    def signature(self) -> bytes:
        return f"idefics3:{self.longest_edge}:{self.tile}:{self.split}:{self.resize}:{self.resample}".encode()

    def tiles(self, image) -> tuple[np.ndarray, int, int]:
        """RGB PIL image -> (uint8 (n, tile, tile, 3) tiles, rows, cols): the rows x cols crops in
        row-major order then the whole image (rows = cols = 0: the whole image only)."""
        resample = self.resample
        if self.resize:
            h, w = _to_longest_edge(image.height, image.width, self.longest_edge)
            image = image.resize((w, h), resample=resample)
        t = self.tile
        if not self.split:
            return np.asarray(image.resize((t, t), resample=resample))[None], 0, 0
        h, w = _to_tile_multiple(image.height, image.width, t)
        image = image.resize((w, h), resample=resample)
        if h <= t and w <= t:
            return np.asarray(image)[None], 0, 0
        rows, cols = (h - t) // t + 1, (w - t) // t + 1
        pixels = np.asarray(image)
        crops = [pixels[r * t:(r + 1) * t, c * t:(c + 1) * t] for r in range(rows) for c in range(cols)]
        crops.append(np.asarray(image.resize((t, t), resample=resample)))
        return np.stack(crops), rows, cols

    def expansion(self, rows: int, cols: int) -> str:
        """The text that stands for one image: its tiles' tags and <image> tokens."""
        fake, image = "<fake_token_around_image>", "<image>" * self.seq_len
        whole = f"{fake}<global-img>{image}{fake}"
        if rows == 0 and cols == 0:
            return whole
        text = "".join("".join(f"{fake}<row_{r + 1}_col_{c + 1}>{image}" for c in range(cols)) + "\n"
                       for r in range(rows))
        return text + "\n" + whole
