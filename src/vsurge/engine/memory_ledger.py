"""The process's resident memory at the ends of its start-up phases, for /v1/stats' `memory` object.

What one part of a server holds cannot be read from the OS, but how much the process's resident set
grew while that part was made can: `mark(phase)` reads /proc/self/status (VmRSS, VmHWM) at the end of
each phase, and server/memory_stats.py turns the differences into parts (the JAX runtime, what
loading left beside the weights, the compiled programs) beside the parts whose bytes are known
exactly (weights, KV pool, recurrent states).

Phases, in order: `start` (`vsurge serve` began: the interpreter and the CLI), `runtime` (JAX, XLA
and the server's modules imported, the backend started), `load_begin` / `loaded` (a model's weights
and tokenizer), `compile_begin` / `compiled` (its programs), `ready` (KV pool made, warmed up). The
last of each wins: with several models, the latest model loaded and compiled. Linux only: elsewhere
every reading is empty and the parts are null.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass

PHASES = ("start", "runtime", "load_begin", "loaded", "compile_begin", "compiled", "ready")
_FIELDS = ("VmRSS", "VmHWM", "RssAnon", "RssFile")


@dataclass(frozen=True)
class Reading:
    """Resident bytes (rss), its high-water mark so far (hwm), and rss' anonymous and file-backed shares."""

    rss: int
    hwm: int
    anon: int
    file: int


def read() -> Reading | None:
    """The process's memory now, from /proc/self/status; None where there is none (not Linux)."""
    values = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in _FIELDS:
                    values[key] = int(rest.split()[0]) * 1024  # kB
    except OSError:
        return None
    if len(values) < len(_FIELDS):
        return None
    return Reading(values["VmRSS"], values["VmHWM"], values["RssAnon"], values["RssFile"])


_marks: dict[str, Reading] = {}
_lock = threading.Lock()


def mark(phase: str, trim: bool = False) -> None:
    """Record the memory at the end of `phase` (one of PHASES). trim: hand the C heap's freed pages back
    first (malloc_trim), so that what the phase freed but glibc kept is not counted as held."""
    if phase not in PHASES:
        raise ValueError(f"unknown memory phase {phase!r} (phases: {', '.join(PHASES)})")
    if trim:
        from ..hardware.devices import release_freed_host_memory

        release_freed_host_memory()
    reading = read()
    if reading is not None:
        with _lock:
            _marks[phase] = reading


def marks() -> dict[str, Reading]:
    with _lock:
        return dict(_marks)


def mark_runtime() -> None:
    """`runtime`: import JAX and start its backend now (what loading would do first), then mark."""
    import jax

    jax.devices()
    mark("runtime")


@contextmanager
def loading():
    """Marks `load_begin` and `loaded` around a model's load."""
    mark("load_begin", trim=True)
    yield
    mark("loaded", trim=True)


def arrays_on_host() -> bool:
    """Whether JAX's arrays (weights, KV pool) live in this process's memory: the CPU backend."""
    import jax

    return jax.default_backend() == "cpu"


def jax_arrays_bytes() -> int:
    """Bytes of every live JAX array in the process."""
    import jax

    return sum(a.nbytes for a in jax.live_arrays())


def device_bytes_in_use() -> tuple[int | None, int | None]:
    """(in use, peak) bytes of the local devices' allocators, summed; None where a device reports none."""
    import jax

    stats = [d.memory_stats() or {} for d in jax.local_devices()]
    if not all("bytes_in_use" in s for s in stats):
        return None, None
    return (sum(s["bytes_in_use"] for s in stats),
            sum(s.get("peak_bytes_in_use", s["bytes_in_use"]) for s in stats))


def clear() -> None:
    """Forget every mark (a test's fresh start)."""
    with _lock:
        _marks.clear()
