"""Gemma 3 images: each image resized to the tower's square (bilinear, no crops: pan-and-scan is not
served yet), its <start_of_image> placeholder expanded to "\\n\\n<start_of_image>", its
<image_soft_token>s and "<end_of_image>\\n\\n" (transformers' Gemma3ImageProcessor (PIL backend) and
Gemma3Processor)."""

from __future__ import annotations

import numpy as np

from .processor import ImageProcessor


class Gemma3Images(ImageProcessor):
    placeholder = "<start_of_image>"

    def __init__(self, config, preprocessor: dict, processor: dict, tokenizer):
        super().__init__(config, tokenizer)
        size = preprocessor.get("size") or {}
        self.size = (int(size.get("height", config.tile_size[0])), int(size.get("width", config.tile_size[1])))
        if self.size != tuple(config.tile_size):
            raise ValueError(f"the image processor's size {self.size} differs from the tower's {config.tile_size}")
        if preprocessor.get("do_pan_and_scan"):
            raise ValueError("Gemma 3's pan-and-scan crops are not supported yet (do_pan_and_scan)")
        self.resample = int(preprocessor.get("resample", 2))  # PIL's BILINEAR
        self.seq_len = int(processor.get("image_seq_length", config.tokens_per_tile))
        if self.seq_len != config.tokens_per_tile:
            raise ValueError(f"image_seq_length {self.seq_len} differs from the model's mm_tokens_per_image "
                             f"{config.tokens_per_tile}")

    def signature(self) -> bytes:
        return f"gemma3:{self.size}:{self.resample}".encode()

    def tiles(self, image) -> tuple[np.ndarray, int, int]:
        h, w = self.size
        return np.asarray(image.resize((w, h), resample=self.resample))[None], 0, 0

    def expansion(self, rows: int, cols: int) -> str:
        return f"\n\n<start_of_image>{'<image_soft_token>' * self.seq_len}<end_of_image>\n\n"
