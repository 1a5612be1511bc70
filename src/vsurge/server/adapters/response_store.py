"""The in-process store behind Responses' `store` and `previous_response_id`.

Each stored response keeps its JSON object (what `GET /v1/responses/{id}` returns) and
the conversation it ends (chat messages: the earlier turns, its input, its output), so a
follow-up request with `previous_response_id` continues it. Bounded twice: entries
expire `ttl_s` seconds after they were stored, and past `max_entries` entries or
`max_bytes` of JSON the oldest are dropped. Nothing survives a restart.
"""

from __future__ import annotations

import collections
import json
import threading
import time
from dataclasses import dataclass


@dataclass
class StoredResponse:
    response: dict  # the Response object
    conversation: list[dict]  # chat messages up to and including this response's output
    stored_at: float
    size: int  # bytes of JSON, for the cap


class ResponseStore:
    def __init__(self, max_entries: int = 1000, ttl_s: float = 3600.0, max_bytes: int = 64 * 1024 * 1024,
                 clock=time.monotonic):
        if max_entries < 0 or ttl_s <= 0 or max_bytes <= 0:
            raise ValueError("the response store needs max_entries >= 0, ttl_s > 0 and max_bytes > 0")
        self.max_entries, self.ttl_s, self.max_bytes = max_entries, ttl_s, max_bytes
        self._clock = clock
        self._entries: collections.OrderedDict[str, StoredResponse] = collections.OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            self._expire()
            return len(self._entries)

    @property
    def bytes(self) -> int:
        return self._bytes

    def put(self, response: dict, conversation: list[dict]) -> bool:
        """Store (or replace) a response; False when it alone is larger than the cap (not stored)."""
        size = len(json.dumps(response, ensure_ascii=False)) + len(json.dumps(conversation, ensure_ascii=False))
        if self.max_entries == 0 or size > self.max_bytes:
            return False
        with self._lock:
            self._drop(response["id"])
            self._entries[response["id"]] = StoredResponse(response, conversation, self._clock(), size)
            self._bytes += size
            self._expire()
            while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                self._drop(next(iter(self._entries)))
        return True

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            self._expire()
            return self._entries.get(response_id)

    def delete(self, response_id: str) -> bool:
        with self._lock:
            self._expire()
            return self._drop(response_id)

    def _drop(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is not None:
            self._bytes -= entry.size
        return entry is not None

    def _expire(self) -> None:
        cutoff = self._clock() - self.ttl_s
        while self._entries:
            oldest = next(iter(self._entries.values()))
            if oldest.stored_at > cutoff:
                return
            self._drop(oldest.response["id"])
