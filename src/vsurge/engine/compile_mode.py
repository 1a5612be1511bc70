"""Whether an engine compiles part of its programs after it is ready (EngineConfig.compile_at_start)."""

from __future__ import annotations

import jax

from ..hardware.devices import platform


def defers(engine) -> bool:
    """Whether `engine` compiles part of its step programs after start-up (one process only: a multi-host
    follower replays the leader's calls on programs it must already hold). "auto" is "serving" on an
    accelerator (its XLA takes 15-40 s a step program) and "all" on a CPU (seconds each, and a background
    compile would take the cores the steps run on)."""
    mode = engine.config.compile_at_start
    if mode == "auto":
        mode = "serving" if platform() != "cpu" else "all"
    return mode == "serving" and jax.process_count() == 1
