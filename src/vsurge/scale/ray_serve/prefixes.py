"""Prompt prefixes for routing: the text a request starts with, as a chain of block hashes.

Block i's hash covers the whole text up to the end of block i, so two prompts share their first k hashes
exactly when they share their first k blocks: a replica's recent hashes say how long a prefix it holds.
Hashes are blake2b (Python's hash() differs per process; the router and replicas are separate processes).
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict

BLOCK_CHARS = 64  # characters per block: about 16 tokens of English


def routing_text(body: bytes) -> str:
    """The prompt text of an API request body (chat/Messages `messages` and `system`, completions' `prompt`,
    Responses' `instructions` and `input`), joined in order; "" for anything else. Never raises: a bad body
    is the replica's to reject with the API's error."""
    try:
        data = json.loads(body) if body else None
    except ValueError:
        return ""
    if not isinstance(data, dict):
        return ""
    parts: list[str] = []
    for field in ("system", "instructions", "messages", "prompt", "input"):
        if field in data:
            _collect(data[field], parts)
    return "\n".join(parts)


def requested_model(body: bytes) -> str | None:
    """The `model` an API request body names (None: none, or not a JSON object: the replica rejects it)."""
    try:
        data = json.loads(body) if body else None
    except ValueError:
        return None
    model = data.get("model") if isinstance(data, dict) else None
    return model if isinstance(model, str) and model else None


def _collect(value, parts: list[str]) -> None:
    if isinstance(value, str):
        parts.append(value)
    elif isinstance(value, list):
        for item in value:
            _collect(item, parts)
    elif isinstance(value, dict):
        if isinstance(value.get("role"), str):
            parts.append(value["role"] + ":")
        for key in ("text", "content"):
            if key in value:
                _collect(value[key], parts)


def block_chain(text: str, block_chars: int = BLOCK_CHARS) -> list[str]:
    """The hashes of the text's whole blocks, each chained to the ones before (a partial last block is left
    out: it is not a prefix another prompt can share yet)."""
    chain, digest = [], hashlib.blake2b(digest_size=8)
    for start in range(0, len(text) - block_chars + 1, block_chars):
        digest.update(text[start:start + block_chars].encode("utf-8", "surrogatepass"))
        chain.append(digest.copy().hexdigest())
    return chain


def shared_blocks(chain: list[str], held) -> int:
    """How many leading blocks of `chain` are in `held` (a set of hashes)."""
    n = 0
    for h in chain:
        if h not in held:
            break
        n += 1
    return n


RECENT_BLOCKS = 2048  # block hashes a replica remembers (its reports stay a few tens of KB)


class RecentPrefixes:
    """The block hashes of the prompts served most recently, at most `capacity` (least recent dropped)."""

    def __init__(self, capacity: int = RECENT_BLOCKS):
        self.capacity = capacity
        self._held: OrderedDict[str, None] = OrderedDict()

    def add(self, chain: list[str]) -> None:
        for h in chain:
            self._held[h] = None
            self._held.move_to_end(h)
        while len(self._held) > self.capacity:
            self._held.popitem(last=False)

    def shared(self, chain: list[str]) -> int:
        return shared_blocks(chain, self._held)

    def hashes(self) -> list[str]:
        return list(self._held)
