"""What compiling an engine's programs cost, by program and by phase, and how many came from JAX's persistent
compilation cache: the start-up log says it, so a slow start (a TPU took 42 s to load 25 cached programs)
shows where: tracing the Python, lowering to MLIR, XLA's compile, or reading the cache."""

from __future__ import annotations

import threading
from contextlib import contextmanager

import jax

_lock = threading.Lock()
_counts = {"hit": 0, "miss": 0}
_registered = False
_EVENTS = {"/jax/compilation_cache/cache_hits": "hit", "/jax/compilation_cache/cache_misses": "miss"}
# JAX's duration events (jax/_src/dispatch.py, compiler.py), recorded on the thread doing the work
_PHASES = {"/jax/core/compile/jaxpr_trace_duration": "trace",
           "/jax/core/compile/jaxpr_to_mlir_module_duration": "mlir",
           "/jax/core/compile/backend_compile_duration": "xla",
           "/jax/compilation_cache/cache_retrieval_time_sec": "cache read"}
_job = threading.local()  # .phases: the current program's {phase: seconds}, .hit: whether the cache served it


def _on_event(name: str, **_) -> None:
    key = _EVENTS.get(name)
    if key:
        with _lock:
            _counts[key] += 1
        if key == "hit" and getattr(_job, "phases", None) is not None:
            _job.hit = True


def _on_duration(name: str, seconds: float, **_) -> None:
    phase = _PHASES.get(name)
    phases = getattr(_job, "phases", None)
    if phase and phases is not None:
        phases[phase] = phases.get(phase, 0.0) + seconds


def note(phase: str, seconds: float) -> None:
    """Add `seconds` of `phase` to the program compiling on this thread (e.g. "store read": the program came
    whole from vsurge's program store, engine/program_store.py)."""
    phases = getattr(_job, "phases", None)
    if phases is not None:
        phases[phase] = phases.get(phase, 0.0) + seconds


def cache_counts() -> dict[str, int]:
    """Persistent-cache hits and misses in this process so far (listening starts on the first call)."""
    global _registered
    with _lock:
        if not _registered:
            jax.monitoring.register_event_listener(_on_event)
            jax.monitoring.register_event_duration_secs_listener(_on_duration)
            _registered = True
        return dict(_counts)


@contextmanager
def phases_of_this_thread():
    """Collect the phase seconds of the compile running on this thread into the yielded dict (its "cache"
    key says whether the persistent cache served it)."""
    cache_counts()  # listening
    _job.phases, _job.hit = {}, False
    try:
        yield _job.phases
    finally:
        _job.phases["cache"] = _job.hit
        _job.phases = None


def program_line(key: tuple, seconds: float, phases: dict) -> str:
    parts = ", ".join(f"{name} {phases[name]:.1f}" for name in ("trace", "mlir", "xla", "cache read", "store read")
                      if phases.get(name, 0.0) >= 0.05)
    hit = " stored" if "store read" in phases else " cached" if phases.get("cache") else ""
    return f"{key[0]} {key[1:]} {seconds:.1f} s{hit}" + (f" ({parts})" if parts else "")


def summary(seconds_by_program: dict, wall: float, before: dict[str, int], phases_by_program: dict | None = None,
            slowest: int = 8) -> str:
    """One line: programs, wall seconds, cache hits / compiled, and the slowest programs with their phases
    (programs compile on several threads at once, so their seconds overlap)."""
    now = cache_counts()
    hits, misses = now["hit"] - before["hit"], now["miss"] - before["miss"]
    phases_by_program = phases_by_program or {}
    ranked = sorted(seconds_by_program.items(), key=lambda kv: -kv[1])[:slowest]
    named = "; ".join(program_line(key, s, phases_by_program.get(key, {})) for key, s in ranked)
    stored = sum("store read" in phases_by_program.get(key, {}) for key in seconds_by_program)
    cache = f"{hits} from the compilation cache, {misses} compiled" if hits or misses else "no compilation cache"
    if stored:
        cache = f"{stored} from vsurge's program store, " + (cache if hits or misses else "none compiled")
    return f"{len(seconds_by_program)} programs in {wall:.1f} s ({cache}; slowest: {named})"
