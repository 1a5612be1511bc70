"""A vision-language model's image processor: images + a prompt with one placeholder per image ->
a MultimodalPrompt (token ids with each image's tokens expanded, and its tiles). Families subclass
it with their resizing/tiling and their placeholder expansion (multimodal/<family>.py)."""

from __future__ import annotations

import numpy as np

from .images import ImageError, decode_image
from .media import MediaItem, MultimodalPrompt, content_key


class ImageProcessor:
    placeholder = "<image>"  # what a chat template writes where an image goes

    def __init__(self, config, tokenizer):
        self.config = config
        self.tokenizer = tokenizer
        self.image_token_id = int(config.image_token_id)
        self.tokens_per_tile = int(config.tokens_per_tile)

    # ---------------------------------------------------------------- the family's part
    def signature(self) -> bytes:
        """How images are processed (part of their cache key: another resize is another image)."""
        raise NotImplementedError

    def tiles(self, image) -> tuple[np.ndarray, int, int]:
        """RGB PIL image -> (uint8 (n, H, W, C) tiles, rows, cols)."""
        raise NotImplementedError

    def expansion(self, rows: int, cols: int) -> str:
        """The prompt text one image's placeholder becomes."""
        raise NotImplementedError

    def for_detail(self, detail: str | None) -> "ImageProcessor":
        """The processor for a request's `detail` ("low", "high", "auto" or None): a family with a choice
        of resolutions returns its cheaper one for "low"; the rest have one resolution."""
        return self

    def num_tokens(self, pixels: np.ndarray) -> int:
        """The prompt tokens (embeddings) an image of these tiles takes."""
        return pixels.shape[0] * self.tokens_per_tile

    def finish(self, prompt: MultimodalPrompt) -> MultimodalPrompt:
        """What the family adds to a prompt once its tokens are known (M-RoPE positions: qwen2_vl.py)."""
        return prompt

    # ---------------------------------------------------------------- shared
    def prompt(self, text: str, images: list[bytes], params: list[str] | None = None,
               param: str = "messages", details: list[str | None] | None = None) -> MultimodalPrompt:
        """`text` with one placeholder per image (in order) -> token ids and the images' items.
        details: each image's requested detail (for_detail). ImageError for a count mismatch or an
        image that cannot be decoded (naming params[i], the request field of image i)."""
        params = params or [param] * len(images)
        processors = [self.for_detail(d) for d in (details or [None] * len(images))]
        if text.count(self.placeholder) != len(images):
            raise ImageError(f"the prompt has {text.count(self.placeholder)} image placeholder(s) "
                             f"{self.placeholder!r} for {len(images)} image(s)", param)
        pieces = text.split(self.placeholder)
        tiles, expanded = [], [pieces[0]]
        for i, data in enumerate(images):
            pixels, rows, cols = processors[i].tiles(decode_image(data, params[i]))
            tiles.append(pixels)
            expanded += [processors[i].expansion(rows, cols), pieces[i + 1]]
        ids = list(self.tokenizer.encode("".join(expanded), add_special_tokens=False))
        at = np.flatnonzero(np.asarray(ids, np.int64) == self.image_token_id)
        counts = [self.num_tokens(t) for t in tiles]
        needed = sum(counts)
        if at.shape[0] != needed:
            raise ImageError(f"the prompt holds {at.shape[0]} image tokens where its images need {needed} "
                             "(does the text contain image tokens of its own?)", param)
        media, start = [], 0
        for data, pixels, n, processor in zip(images, tiles, counts, processors):
            # (another resolution: another key, another image)
            media.append(MediaItem(content_key(processor.signature(), data), at[start:start + n],
                                   np.ascontiguousarray(pixels)))
            start += n
        return self.finish(MultimodalPrompt(ids, tuple(media)))
