"""What compiling an engine's programs cost, by program, and how many came from JAX's persistent compilation
cache: the start-up log says it, so a slow start (a TPU took 42 s to load 25 cached programs) shows where."""

from __future__ import annotations

import threading

import jax

_lock = threading.Lock()
_counts = {"hit": 0, "miss": 0}
_registered = False
_EVENTS = {"/jax/compilation_cache/cache_hits": "hit", "/jax/compilation_cache/cache_misses": "miss"}


def _on_event(name: str, **_) -> None:
    key = _EVENTS.get(name)
    if key:
        with _lock:
            _counts[key] += 1


def cache_counts() -> dict[str, int]:
    """Persistent-cache hits and misses in this process so far (listening starts on the first call)."""
    global _registered
    with _lock:
        if not _registered:
            jax.monitoring.register_event_listener(_on_event)
            _registered = True
        return dict(_counts)


def summary(seconds_by_program: dict, wall: float, before: dict[str, int]) -> str:
    """One line: programs, wall seconds, cache hits / compiled, and the three slowest programs."""
    now = cache_counts()
    hits, misses = now["hit"] - before["hit"], now["miss"] - before["miss"]
    slowest = sorted(seconds_by_program.items(), key=lambda kv: -kv[1])[:3]
    named = ", ".join(f"{key[0]} {key[1:]} {s:.1f} s" for key, s in slowest)
    cache = f"{hits} from the compilation cache, {misses} compiled" if hits or misses else "no compilation cache"
    return f"{len(seconds_by_program)} programs in {wall:.1f} s ({cache}; slowest: {named})"
