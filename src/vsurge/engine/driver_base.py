"""What every driver shares: admission with a queue limit, the set of live requests,
guarded threads that fail every live request loudly when one of them raises, and
a graceful stop that never drops a request silently."""

from __future__ import annotations

import logging
import queue
import threading
import time

from ..metrics import EngineMetrics
from .outputs import SequenceOutput
from .request import ActiveRequest, DriverNotReadyError, QueueFullError

log = logging.getLogger(__name__)

_STOP = object()


class AbstractDriver:
    """What vSurge needs from a driver (vDriver and oDriver both provide it)."""

    def submit_request(self, request: ActiveRequest) -> None: ...

    def start(self) -> None: ...

    def stop(self, timeout: float = 30.0) -> None: ...

    def compile(self) -> None: ...


class ThreadedDriver(AbstractDriver):
    """Subclasses provide `start` (calling `_start_threads`), `_enqueue`, `_wake_threads`,
    `num_used_slots`, `processor`, `primary_engine` (whose limits requests are checked against)
    and `compile`."""

    def __init__(self, engine, max_queue: int | None, metrics: EngineMetrics | None):
        self.max_queue = max_queue
        self._live: set[ActiveRequest] = set()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._running = False
        self._accepting = False
        self._error: BaseException | None = None
        name = getattr(engine.model.config, "name", "") if hasattr(engine, "model") else "engine"
        self.metrics = metrics or EngineMetrics(name or "vsurge")

    @property
    def ready(self) -> bool:
        return self._running and self._accepting and self._error is None

    @property
    def error(self) -> BaseException | None:
        return self._error

    @property
    def num_waiting(self) -> int:
        with self._lock:
            return max(0, len(self._live) - self.num_used_slots)

    def submit_request(self, request) -> None:
        if not isinstance(request, ActiveRequest):
            raise TypeError(f"submit_request takes an ActiveRequest, got {type(request).__name__}")
        if not self.ready:
            raise DriverNotReadyError(f"the driver is not ready: {self._error or 'not running'}")
        with self._lock:
            waiting = len(self._live) - self.num_used_slots
            if self.max_queue is not None and waiting >= self.max_queue:
                raise QueueFullError(f"the request queue is full ({waiting} waiting, limit {self.max_queue}); "
                                     f"retry later")
            self._live.add(request)
            self.metrics.set_waiting(waiting + 1)
        self._enqueue(request)

    def place_request_on_prefill_queue(self, request: ActiveRequest) -> None:
        self.submit_request(request)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop accepting work, let in-flight requests finish (up to `timeout` s), then stop the
        threads; whatever is still unfinished is failed, never silently dropped."""
        self._accepting = False
        deadline = time.monotonic() + timeout
        while self._live and self._error is None and time.monotonic() < deadline:
            time.sleep(0.02)
        self._shutdown(DriverNotReadyError("the driver stopped before this request finished"))

    # ------------------------------------------------------------ thread plumbing
    def _start_threads(self, targets) -> None:
        self._running = self._accepting = True
        self._error = None
        for name, target, args in targets:
            thread = threading.Thread(target=self._guarded, args=(name, target, *args), name=f"vsurge-{name}",
                                      daemon=True)
            self._threads.append(thread)
            thread.start()

    def _guarded(self, name, target, *args):
        try:
            target(*args)
        except BaseException as exc:  # noqa: BLE001: any failure must reach the callers
            log.exception("%s %s thread failed", type(self).__name__, name)
            self._error = RuntimeError(f"{type(self).__name__} {name} thread failed: {exc!r}")
            self._shutdown(self._error)

    def _shutdown(self, error: BaseException) -> None:
        self._running = self._accepting = False
        with self._lock:
            live, self._live = list(self._live), set()
        for request in live:
            request.channel.put(error)
        self._wake_threads()
        current = threading.current_thread()
        for thread in self._threads:
            if thread is not current:
                thread.join(timeout=5)
        self._threads = [t for t in self._threads if t.is_alive() and t is not current]

    def _put(self, q: queue.Queue, item) -> bool:
        """Put with backpressure, giving up if the driver stops meanwhile."""
        while self._running:
            try:
                q.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def _settle(self, out: SequenceOutput) -> None:
        """A sequence ended: drop it from the live set and count it, before its last sample goes out."""
        request = out.request
        with self._lock:
            self._live.discard(request)
        if out.finish_reason != "abort":
            self.metrics.request_finished(out.finish_reason, len(request.prompt_ids), len(out.token_ids),
                                          time.perf_counter() - request.submitted_at)

    def _finish_unslotted(self, request: ActiveRequest, reason: str) -> None:
        out = SequenceOutput(request, self.processor)
        request.channel.put(out.abort(reason))
        with self._lock:
            self._live.discard(request)


def _offer(q: queue.Queue, item) -> None:
    try:
        q.put_nowait(item)
    except queue.Full:
        pass
