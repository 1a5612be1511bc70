"""A replica's request through the server's ASGI app without a socket (scale/ray_serve/asgi_call.py): the head,
then the body, with the chunks the app sent while the last was passed on joined into one piece (each piece is a
Ray streaming item on its way to the ingress)."""

from __future__ import annotations

import asyncio

from vsurge.scale.ray_serve.asgi_call import call_app, request_record


def streaming_app(release: asyncio.Event):
    """Sends a head, three chunks at once, waits for `release`, then two more and the end."""

    async def app(scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        for part in (b"data: 1\n\n", b"data: 2\n\n", b"data: 3\n\n"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await release.wait()
        await send({"type": "http.response.body", "body": b"data: 4\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})

    return app


def test_chunks_sent_together_travel_as_one_piece_and_the_stream_is_whole():
    async def run():
        release, pieces = asyncio.Event(), []
        request = request_record("POST", "/v1/chat/completions", b"", [], b"{}")
        async for piece in call_app(streaming_app(release), request):
            pieces.append(piece)
            release.set()  # the later chunks are sent after the first body piece was taken
        return pieces

    head, *body = asyncio.run(run())
    assert head == {"status": 200, "headers": [(b"content-type", b"text/event-stream")]}
    assert b"".join(body) == b"data: 1\n\ndata: 2\n\ndata: 3\n\ndata: 4\n\ndata: [DONE]\n\n"
    assert body[0] == b"data: 1\n\ndata: 2\n\ndata: 3\n\n"  # queued together: one piece, not three
    assert len(body) <= 2


def test_an_app_that_answers_nothing_is_a_500():
    async def silent(scope, receive, send):
        await receive()

    async def run():
        return [p async for p in call_app(silent, request_record("GET", "/x", b"", [], b""))]

    head, body = asyncio.run(run())
    assert head["status"] == 500 and b"sent no response" in body
