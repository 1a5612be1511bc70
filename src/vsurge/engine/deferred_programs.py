"""Programs an engine compiles after it is ready: the step programs of other row counts and chunk shapes.

A TPU's XLA takes 15-40 s a step program (docs/tpu.md, Ready time), and an engine has ~10 of them: one per
decode row count (8, 32, 64) and per chunk shape of a prompt step with and without decode rows. Any step can
run on fewer of them: a decode program of the most rows serves fewer rows (padding), and a chunk shape's
program with the most decode rows serves fewer. So with `compile_at_start` "serving" (the default on an
accelerator) start-up compiles only what every plan can fall back to:

- decode at the most rows (each page window);
- prompt steps of two chunk shapes at their most decode rows: the longest rows (one long prompt a step) and
  the most rows (a burst of short prompts);
- every other kind (init, set_slot, page copies) but a vision tower's tile buckets.

The rest compile on background threads once the engine is ready; until one is compiled the scheduler leaves
its chunk shape out (`chunk_shape_ready`) and a step takes the smallest compiled row count that holds it
(`usable`). On a CPU the default is "all": its programs compile in seconds, and a background compile would
take the cores the steps run on.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from concurrent.futures import Future

from .program_kinds import DECODE, MIXED, VISION, kind_of

log = logging.getLogger(__name__)


def start_shapes(config) -> set[tuple[int, int]]:
    """Chunk shapes compiled at start: the longest rows and the most rows (config.chunk_shapes is sorted by
    tokens per row)."""
    shapes = config.chunk_shapes
    return {shapes[-1], max(shapes)} if shapes else set()  # (rows, tokens): max() takes the most rows


def at_start(engine, key: tuple) -> bool:
    """Whether `key` is compiled before the engine is ready."""
    c, kind = engine.config, kind_of(key)
    if kind is DECODE:
        return key[1] == max(c.decode_rows)
    if kind is MIXED:
        return key[2] in start_shapes(c) and key[1] == max(c.mixed_rows(key[2]))
    return kind is not VISION  # (a text request never waits for the tower; an image one waits for its bucket)


def queue_order(keys: list[tuple]) -> list[tuple]:
    """The background compiles in the order they are taken: the tower's tile buckets first. A text step always
    has a start-up program to fall back to, an image request has none: queued last, the first image request
    on a v5e waited 84 s behind 17 step programs (2026-12-07)."""
    return sorted(keys, key=lambda key: kind_of(key) is not VISION)  # (stable: the rest keep their order)


class DeferredCompiles:
    """The background compiles of one engine: started by `start`, waited for by `wait`."""

    def __init__(self, engine):
        self.engine = engine
        self.active = False  # started: steps use only what is compiled (engine.usable)
        self.futures: list[Future] = []
        self.keys: list[tuple] = []  # what was queued, in the order it is taken (queue_order)
        self.seconds: float | None = None  # wall time of the whole background compile, once done
        self.done = threading.Event()
        self.stopped = False  # stop() dropped what had not started
        self._work: queue.SimpleQueue = queue.SimpleQueue()  # (key, future) not yet taken by a thread
        self._threads: list[threading.Thread] = []

    @property
    def pending(self) -> int:
        return sum(not f.done() for f in self.futures)

    def start(self, keys: list[tuple]) -> None:
        """Compile `keys` on background threads (half the cores: the engine's steps and the server run on the
        rest); the engine's own `_building` map makes a step that needs one of them wait for it. The threads
        are daemons, and `stop` ends them."""
        engine = self.engine
        self.active = True
        work = self._work
        with engine._compile_lock:
            for key in queue_order(keys):
                if key in engine._compiled or key in engine._building:
                    continue
                engine._building[key] = future = Future()
                work.put((key, future))
                self.futures.append(future)
                self.keys.append(key)
        if not self.futures:
            self.done.set()
            return
        began = time.perf_counter()

        def compile_queued():
            while True:
                try:
                    key, future = work.get_nowait()
                except queue.Empty:
                    return
                engine._run_build(key, future, True)

        for i in range(max(1, min(len(self.futures), (os.cpu_count() or 2) // 2))):
            self._threads.append(threading.Thread(target=compile_queued, name=f"vsurge-deferred-{i}", daemon=True))
            self._threads[-1].start()
        log.info("compiling %d more programs in the background", len(self.futures))
        threading.Thread(target=self._report, args=(began,), name="vsurge-deferred-report", daemon=True).start()

    def _report(self, began: float) -> None:
        for future in self.futures:
            future.exception()  # (waits; a failure was logged by _run_build and surfaces when the step needs it)
        self.seconds = time.perf_counter() - began
        if not self.stopped:
            log.info("compiled the %d background programs in %.1f s: every row count and chunk shape is served",
                     len(self.futures), self.seconds)
        self.done.set()

    def stop(self, timeout: float = 300.0) -> None:
        """Drop the compiles not started yet and wait for the running ones (an XLA compile cannot be interrupted,
        and one still running when the interpreter exits aborts the process: seen on a TPU at SIGTERM)."""
        engine = self.engine
        self.stopped = True
        while True:
            try:
                key, future = self._work.get_nowait()
            except queue.Empty:
                break
            with engine._compile_lock:
                engine._building.pop(key, None)
            future.set_exception(RuntimeError(f"program {key} was not compiled: the engine stopped"))
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def wait(self, timeout: float | None = None) -> bool:
        """True once every background compile has finished (or failed), within `timeout` seconds."""
        return not self.active or self.done.wait(timeout)
