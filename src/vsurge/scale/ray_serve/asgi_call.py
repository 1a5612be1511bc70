"""One HTTP request through an ASGI app in this process, without a socket: what a replica does with a
request its ingress forwarded. The request and the response pieces are plain dicts and bytes, so they
cross process boundaries (Ray pickles them)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator


def request_record(method: str, path: str, query_string: bytes, headers: list[tuple[bytes, bytes]],
                   body: bytes, client: tuple[str, int] | None = None) -> dict:
    return {"method": method, "path": path, "query_string": query_string, "headers": headers, "body": body,
            "client": client}


def is_event_stream(head: dict) -> bool:
    """Whether a response head (call_app's first piece) starts server-sent events."""
    return any(k.lower() == b"content-type" and v.startswith(b"text/event-stream") for k, v in head["headers"])


_NOTHING = object()


async def call_app(app, request: dict) -> AsyncIterator[dict | bytes]:
    """Runs `request` (request_record) through `app`; yields the head {"status", "headers"}, then the
    body's chunks as the app sends them (those sent while the last was being passed on, joined). Closing the iterator early is a client disconnect: the app's
    receive() reports it, so a stream stops generating."""
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": request["method"], "scheme": "http", "path": request["path"],
             "raw_path": request["path"].encode(), "query_string": request["query_string"], "root_path": "",
             "headers": [(k.lower(), v) for k, v in request["headers"]], "client": request.get("client"),
             "server": ("127.0.0.1", 80)}
    messages: asyncio.Queue = asyncio.Queue()
    disconnected = asyncio.Event()
    body_given = False

    async def receive():
        nonlocal body_given
        if not body_given:
            body_given = True
            return {"type": "http.request", "body": request["body"], "more_body": False}
        await disconnected.wait()
        return {"type": "http.disconnect"}

    async def run():
        try:
            await app(scope, receive, messages.put)
        finally:
            messages.put_nowait(None)  # the app returned (or raised: its error middleware answered first)

    task = asyncio.create_task(run())
    started = complete = False
    held = _NOTHING  # a message taken from the queue while joining chunks, not yet handled
    try:
        while (message := await messages.get() if held is _NOTHING else held) is not None:
            held = _NOTHING
            if message["type"] == "http.response.start":
                started = True
                yield {"status": message["status"], "headers": list(message.get("headers", []))}
            elif message["type"] == "http.response.body":
                pieces, more = [message.get("body", b"")], message.get("more_body", False)
                # the chunks the app sent meanwhile go as one piece: each piece is a Ray streaming item, whose
                # round trip through the ingress cost more than the engine's step at 8 streams on 2 cores
                while more and not messages.empty():
                    following = messages.get_nowait()
                    if following is None or following["type"] != "http.response.body":
                        held = following
                        break
                    pieces.append(following.get("body", b""))
                    more = following.get("more_body", False)
                body = b"".join(pieces)
                if body:
                    yield body
                if not more:
                    complete = True
                    break
        if not started:  # the app ended without answering
            yield {"status": 500, "headers": [(b"content-type", b"application/json")]}
            yield b'{"error": {"message": "the server sent no response", "type": "server_error"}}'
    finally:
        disconnected.set()
        if not complete and not task.done():  # closed early: the client is gone (a finished response's
            task.cancel()                     # background work is left to end)
        with contextlib.suppress(BaseException):
            await task
