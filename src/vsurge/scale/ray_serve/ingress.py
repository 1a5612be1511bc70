"""The HTTP ingress: every route of `vsurge serve` (the replicas run its FastAPI app, replica.py), reached
through one Serve handle, with the prompt text as the router's key (router.py).

Faults: a replica lost before any of its answer reached the client (a non-streamed answer is held until
whole; a stream is held until its first body chunk) is retried on another replica, up to `attempts` times.
A stream cut after that ends with an error event in the API's shape and [DONE] (Anthropic's routes: an
`error` event): the client sees a clean end, never a hang.

Draining (`drain`, what `vsurge serve --ray` calls on SIGTERM): new requests get the API's 503, the ones in
flight (streams until their last chunk) finish.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from ray.exceptions import RayActorError
from ray.serve.exceptions import ReplicaUnavailableError
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ...server.errors import ANTHROPIC_PATHS, anthropic_error_body, error_body, error_response
from .adapters import UNLOAD_PATH, AdapterRecord, adapter_request
from .asgi_call import is_event_stream, request_record
from .cluster_metrics import exposition, replica_stats
from .prefixes import requested_model, routing_text
from .router import routing_choices

log = logging.getLogger(__name__)

# A replica that died, or that Serve found gone when it sent the call; anything else a replica raises is
# its own answer.
REPLICA_LOST = (RayActorError, ReplicaUnavailableError)


class VsurgeIngress:
    """The deployment's class (app.py wraps it with serve.deployment); `replicas`: the replica deployment's
    handle."""

    def __init__(self, replicas, attempts: int = 3, multiplexed: bool = False):
        self.replicas = replicas.options(stream=True)
        self.attempts = attempts
        self.multiplexed = multiplexed  # the replicas serve several models: route each request by its model
        self.adapters = AdapterRecord()  # LoRA adapters loaded at run time, for the whole cluster (adapters.py)
        self.draining = False
        self.in_flight = 0  # requests taken and not yet answered whole (a stream: until its last chunk)

    async def __call__(self, request: Request) -> Response:
        if self.draining:
            return error_response(503, "the server is shutting down: it takes no new requests",
                                  path=request.url.path)
        self.in_flight += 1
        relayed = False
        try:
            response = await self._forward(request)
            if isinstance(response, StreamingResponse):  # counted until its generator ends
                response.body_iterator, relayed = self._counted(response.body_iterator), True
            return response
        finally:
            if not relayed:
                self.in_flight -= 1

    async def _counted(self, chunks):
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            self.in_flight -= 1

    async def drain(self, timeout_s: float) -> int:
        """Take no new requests (503) and wait, at most timeout_s, for those in flight; -> how many are left."""
        self.draining = True
        deadline = time.monotonic() + timeout_s
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        return self.in_flight

    async def _forward(self, request: Request) -> Response:
        body = await request.body()
        record = request_record(request.method, request.url.path, request.url.query.encode(),
                                [(k.encode("latin-1"), v.encode("latin-1")) for k, v in request.headers.items()],
                                body, (request.client.host, request.client.port) if request.client else None)
        prefix_text = routing_text(body) if request.method == "POST" else ""
        replicas = self.replicas
        model = self._multiplexed_id(record["path"], body) if request.method == "POST" else None
        if model:
            replicas = replicas.options(multiplexed_model_id=model)
        last_error = None
        for attempt in range(self.attempts):
            pieces = replicas.handle_http.remote(record, prefix_text=prefix_text, adapters=self.adapters.snapshot())
            try:
                head, held = await _head_and_first(pieces)
                self.adapters.answered(record["path"], body, head["status"])
                if not is_event_stream(head):
                    content = b"".join(held + [c async for c in pieces])
                    if record["path"] == "/metrics" and head["status"] == 200:  # + the router's and every replica's
                        content += exposition(routing_choices(), await replica_stats())
                    return _with_headers(Response(content, status_code=head["status"]), head)
            except REPLICA_LOST as exc:
                last_error = exc
                log.warning("a replica was lost before answering %s (attempt %d of %d): %s",
                            record["path"], attempt + 1, self.attempts, exc)
                await asyncio.sleep(0.2 * (attempt + 1))  # Serve drops the dead replica from the handle
                continue
            return _with_headers(StreamingResponse(_relay(held, pieces, record["path"]), status_code=head["status"]),
                                 head)
        return error_response(503, f"no replica could answer: {last_error}", path=record["path"])

    def _multiplexed_id(self, path: str, body: bytes) -> str | None:
        """The id Serve routes a request by: the model it names when the replicas serve several, or the
        run-time adapter it names (an unload: the adapter it unloads), so it goes to a replica holding it."""
        if path == UNLOAD_PATH:
            named = adapter_request(body)
            if named is not None and self.adapters.recorded(named[0]):
                return named[0]
        model = requested_model(body)
        return model if self.multiplexed or self.adapters.recorded(model) else None


async def _head_and_first(pieces) -> tuple[dict, list[bytes]]:
    """The response head and, for a stream, its first body chunk (nothing sent to the client yet)."""
    head = await pieces.__anext__()
    held = []
    if is_event_stream(head):
        try:
            held.append(await pieces.__anext__())
        except StopAsyncIteration:
            pass
    return head, held


async def _relay(held: list[bytes], pieces, path: str):
    for chunk in held:
        yield chunk
    try:
        async for chunk in pieces:
            yield chunk
    except REPLICA_LOST as exc:
        log.warning("a replica was lost while streaming %s: %s", path, exc)
        yield _stream_error(path, f"the replica serving this stream was lost: {exc}")


def _stream_error(path: str, message: str) -> bytes:
    if any(path == p or path.startswith(p + "/") for p in ANTHROPIC_PATHS):
        return f"event: error\ndata: {json.dumps(anthropic_error_body(503, message))}\n\n".encode()
    return f"data: {json.dumps(error_body(503, message))}\n\ndata: [DONE]\n\n".encode()


def _with_headers(response: Response, head: dict) -> Response:
    """The replica's headers, repeated ones kept (the length is the one of the body sent here)."""
    own = [(k, v) for k, v in response.raw_headers if k == b"content-length"]
    response.raw_headers = own + [(k, v) for k, v in head["headers"]
                                  if k.lower() not in (b"content-length", b"transfer-encoding")]
    return response
