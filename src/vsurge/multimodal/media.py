"""A prompt with images: its token ids (each image's placeholder tokens included) and, per image,
where its embeddings go and what the encoder reads.

The prefix cache and the engine see one token list per sequence: at an image's embedding
positions it holds pseudo-tokens derived from the image's content hash (negative ids, never a
real token), so page hashes chain over the image's content and not over placeholder ids (two
different images never share KV; the same image in the next chat turn does), through every tier.
The batch builder feeds those positions the encoder's embeddings instead of token embeddings.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

_INT31 = 2**31 - 2


def content_key(*parts: bytes) -> int:
    """A 63-bit hash of bytes (an image's, and how it was processed)."""
    digest = hashlib.blake2b(b"\0".join(parts), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def pseudo_tokens(key: int, count: int) -> np.ndarray:
    """(count,) int64 negative ids standing for an image's embedding positions in page hashes."""
    j = np.arange(count, dtype=np.uint64)
    mixed = (np.uint64(key) + j * np.uint64(0x9E3779B97F4A7C15)) * np.uint64(0xBF58476D1CE4E5B9)
    return -(1 + (mixed >> np.uint64(33)).astype(np.int64) % _INT31)


@dataclass(frozen=True, eq=False)
class MediaItem:
    """One image of a prompt."""

    key: int  # content hash of its bytes and processing (the encoder cache's key)
    positions: np.ndarray  # (n,) int64 ascending prompt positions of its n embeddings
    pixels: np.ndarray  # uint8 (tiles, H, W, C): what the vision program encodes, in order (one image, (1, H, W, C),
    # at its own size for a family with variable_images)

    @property
    def num_tokens(self) -> int:
        return int(self.positions.shape[0])

    @property
    def num_tiles(self) -> int:
        return int(self.pixels.shape[0])


@dataclass
class MultimodalPrompt:
    """Token ids (placeholders at the embedding positions) and the images they hold."""

    ids: list[int]
    media: tuple[MediaItem, ...] = field(default_factory=tuple)
    # an M-RoPE model's (Qwen2.5-VL): (3, L) int32 rotary (t, h, w) of each token, and the offset of the tokens
    # after them (their index + rope_delta on every axis); None: every token at its index
    rope: np.ndarray | None = None
    rope_delta: int = 0

    def __len__(self) -> int:
        return len(self.ids)

    def cache_ids(self) -> list[int]:
        """The ids with each image's embedding positions replaced by its pseudo-tokens."""
        out = np.asarray(self.ids, np.int64)
        for item in self.media:
            out[item.positions] = pseudo_tokens(item.key, item.num_tokens)
        return out.tolist()
