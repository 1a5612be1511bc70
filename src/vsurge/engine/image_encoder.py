"""Image embeddings for prompt chunks: the vision program run on the images a step's chunks reach,
and a host cache of their embeddings by content hash (an image seen again is not encoded again).

Before a step with prompt chunks, `prepare(plan)` encodes every image of those chunks whose
embeddings are not cached: all their tiles in one call per bucket of tiles (batched across
requests), then split per image (a model whose images keep their own size: each image alone, through
the program of its size). The batch builder (batch.py) copies each chunk's share of them into the step's
embedding rows (`fill`), and on an M-RoPE model each token's rotary positions (`rope_positions`).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

MAX_TILES_PER_CALL = 16  # larger sets of tiles run as several calls


def within_image_budget(seq, want: int, budget: list[int], step_budget: int, encoder) -> int:
    """`want` prompt tokens of `seq` from its first uncomputed one, cut before the first image whose
    encoding would pass the step's budget of image embeddings (`budget[0]` left of `step_budget`, the
    prompt-token budget, as vLLM's encoder budget): a step encodes what its prompt tokens could hold, so
    the tower's work spreads over steps and decode rows are not held up by many images at once. A step's
    first image always goes (however large); images `encoder` holds already cost nothing. An image
    whose vision program is still compiling (a size not seen before) waits, the chunk cut before it.
    The scheduler calls it (pure Python)."""
    start, end = seq.num_computed, seq.num_computed + want
    for item in seq.request.media:
        first = int(item.positions[0])
        if first < start or first >= end or (encoder is not None and encoder.is_cached(item.key)):
            continue
        if encoder is not None and not encoder.ready(item):
            return first - start
        if item.num_tokens > budget[0] and budget[0] < step_budget:
            return first - start
        budget[0] -= item.num_tokens
    return want


def waits_for_program(seq, encoder) -> bool:
    """Whether `seq`'s next image to prefill waits for its vision program to compile (the scheduler
    does not count such a sequence as blocked on pages)."""
    if encoder is None or not seq.request.media:
        return False
    for item in seq.request.media:
        if int(item.positions[-1]) >= seq.num_computed and not encoder.is_cached(item.key):
            return not encoder.ready(item)
    return False


def whole_images(seq, want: int) -> int:
    """`want` prompt tokens of `seq` from its first uncomputed one, ending outside every image (a model
    whose image tokens see their whole image computes each image in one step): cut before an image the
    step would split, or 0 where one began before this step's start and does not end within it."""
    start, end = seq.num_computed, seq.num_computed + want
    for item in seq.request.media:
        first, last = int(item.positions[0]), int(item.positions[-1])
        if first < end <= last:
            return max(first - start, 0)
    return want


def rope_positions(request, start: int, count: int) -> np.ndarray:
    """(3, count) int32 rotary (t, h, w) of `request`'s tokens [start, start + count) on an M-RoPE model:
    the prompt's own (request.rope_positions), and past them (generated tokens, a text-only prompt) the
    index + rope_delta on every axis."""
    out = np.broadcast_to(np.arange(start, start + count, dtype=np.int32) + request.rope_delta, (3, count)).copy()
    known = request.rope_positions
    if known is not None and start < known.shape[1]:
        k = min(count, known.shape[1] - start)
        out[:, :k] = known[:, start:start + k]
    return out


def tile_buckets(limit: int = MAX_TILES_PER_CALL) -> list[int]:
    """The tile counts a vision program is compiled for: powers of two up to `limit`."""
    out, n = [], 1
    while n < limit:
        out.append(n)
        n *= 2
    return out + [limit]


class MediaEncoder:
    def __init__(self, core, cache_bytes: int):
        self.core = core
        self.cache_bytes = cache_bytes
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()  # key -> (tokens, D) float32, LRU first
        self._held = 0
        self._pinned: dict[int, np.ndarray] = {}  # this step's images (kept even past the budget)
        self.hits = 0  # images a sequence began that were encoded already
        self.encoded = 0  # images encoded
        # the model's image tokens see their whole image: the scheduler keeps each image in one step and
        # the batch builder widens their attention (kv/paged.StepLayout.chunk_limit)
        self.whole_images = bool(getattr(core.model.config, "bidirectional_images", False))
        self.variable_images = bool(getattr(core.model.config, "variable_images", False))

    def is_cached(self, key: int) -> bool:
        return key in self._cache

    def ready(self, item) -> bool:
        """Whether `item` can be encoded now. An image of a model whose images keep their own size needs
        the vision program of that size: a new size compiles on a background thread (seconds on a real
        tower), and until it is done the image waits while the engine serves everyone else."""
        if not self.variable_images:
            return True
        _, h, w, _ = item.pixels.shape
        return self.core.image_program_ready(h, w)

    def embeddings(self, item) -> np.ndarray:
        """(tokens, D) of an image `prepare` made ready."""
        return self._pinned[item.key]

    def prepare(self, plan) -> None:
        """Encode the images the plan's chunks reach that are not cached; pin them for the step."""
        self._pinned = {}
        missing: dict[int, object] = {}
        for chunk in plan.chunks:
            end = chunk.start + chunk.length
            for item in chunk.seq.request.media:
                if item.key in self._pinned or item.key in missing:
                    continue
                pos = item.positions
                if pos[0] >= end or pos[-1] < chunk.start:
                    continue
                cached = self._cache.get(item.key)
                if cached is not None:
                    self._cache.move_to_end(item.key)
                    self._pinned[item.key] = cached
                    self.hits += chunk.start <= pos[0]  # (an image prefilled over several steps counts once)
                else:
                    missing[item.key] = item
        if missing:
            self._encode(list(missing.values()))

    def _encode(self, items: list) -> None:
        if self.variable_images:  # one image a call, each at its own size (its program compiled per size)
            for item in items:
                self._pinned[item.key] = self._store(item.key, self.core.encode_image(item.pixels))
            self.encoded += len(items)
            return
        pixels = np.concatenate([item.pixels for item in items])  # (tiles, H, W, C)
        out = []
        for start in range(0, pixels.shape[0], MAX_TILES_PER_CALL):
            part = pixels[start:start + MAX_TILES_PER_CALL]
            out.append(self.core.encode_tiles(part))
        per_tile = self.core.model.config.tokens_per_tile
        rows = np.concatenate(out)  # (tiles * tokens_per_tile, D)
        at = 0
        for item in items:
            n = item.num_tiles * per_tile
            self._pinned[item.key] = self._store(item.key, rows[at:at + n])
            at += n
        self.encoded += len(items)

    def _store(self, key: int, value: np.ndarray) -> np.ndarray:
        value = np.ascontiguousarray(value)
        if value.nbytes > self.cache_bytes:
            return value
        self._cache[key] = value
        self._held += value.nbytes
        while self._held > self.cache_bytes:
            _, old = self._cache.popitem(last=False)
            self._held -= old.nbytes
        return value

    def fill(self, seq, start: int, count: int, embeds: np.ndarray, mask: np.ndarray, at: int) -> None:
        """Write the embeddings of `seq`'s prompt positions [start, start + count) that are image
        positions into embeds[at + (position - start)] and set their mask."""
        for item in seq.request.media:
            pos = item.positions
            lo, hi = np.searchsorted(pos, start), np.searchsorted(pos, start + count)
            if lo < hi:
                rows = at + pos[lo:hi] - start
                embeds[rows] = self.embeddings(item)[lo:hi]
                mask[rows] = True
