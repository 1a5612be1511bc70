"""The in-process store behind /v1/responses `store` and `previous_response_id`: TTL and size caps."""

from __future__ import annotations

import pytest

from vsurge.server.adapters.response_store import ResponseStore


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def response(i: int, text: str = "x") -> dict:
    return {"id": f"resp_{i}", "output": [{"text": text}]}


def test_entries_expire_after_the_ttl():
    clock = Clock()
    store = ResponseStore(max_entries=10, ttl_s=60, clock=clock)
    store.put(response(1), [{"role": "user", "content": "hi"}])
    clock.now = 30
    store.put(response(2), [])
    assert store.get("resp_1").conversation == [{"role": "user", "content": "hi"}]
    clock.now = 61
    assert store.get("resp_1") is None and store.get("resp_2") is not None and len(store) == 1
    clock.now = 91
    assert len(store) == 0 and store.bytes == 0


def test_the_oldest_go_past_the_entry_and_byte_caps():
    store = ResponseStore(max_entries=3, ttl_s=60)
    for i in range(5):
        store.put(response(i), [])
    assert [store.get(f"resp_{i}") is not None for i in range(5)] == [False, False, True, True, True]
    small = ResponseStore(max_entries=100, ttl_s=60, max_bytes=400)
    for i in range(10):
        assert small.put(response(i, "y" * 50), [])
    assert small.bytes <= 400 and small.get("resp_9") is not None and small.get("resp_0") is None
    assert not small.put(response(99, "z" * 1000), [])  # larger than the whole cap: not stored
    assert small.get("resp_99") is None


def test_delete_and_replace():
    store = ResponseStore()
    store.put(response(1), [])
    store.put(response(1, "again"), [])
    assert len(store) == 1 and store.get("resp_1").response["output"][0]["text"] == "again"
    assert store.delete("resp_1") and not store.delete("resp_1") and store.bytes == 0
    assert not ResponseStore(max_entries=0).put(response(1), [])  # size 0: nothing is kept
    with pytest.raises(ValueError):
        ResponseStore(ttl_s=0)
