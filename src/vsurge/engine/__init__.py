"""Continuous batching: engines (device work) and drivers (a scheduling thread per engine).

Submodules load on first use, so the pure-Python ones (engine_config, scheduler,
sequence) import no JAX. The seed's classes (vEngine, vDriver, ...) are built on top of these in
seed/ and imported from the package root (`from vsurge import vEngine`), never from here.
"""

from importlib import import_module

_EXPORTS = {
    "EngineConfig": ".engine_config",
    "EngineCore": ".core",
    "Scheduler": ".scheduler",
    "StepPlan": ".plan",
    "NextIterationPlan": ".plan",
    "Sequence": ".sequence",
    "EngineState": ".programs",
    "StepOutput": ".programs",
    "ActiveRequest": ".request",
    "DriverNotReadyError": ".request",
    "QueueFullError": ".request",
    "ReturnChannel": ".request",
    "ReturnSample": ".request",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'vsurge.engine' has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value
    return value
