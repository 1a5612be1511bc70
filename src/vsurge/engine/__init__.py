"""Continuous batching: engines (device work) and drivers (a scheduling thread per engine).

Submodules load on first use, so the pure-Python ones (engine_config, scheduler,
sequence) import no JAX. The seed's classes (vEngine, vDriver, ...) are built on top of these in
seed/ and imported from the package root (`from vsurge import vEngine`), never from here.
"""

from ..lazy_exports import lazy_getattr

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

__getattr__ = lazy_getattr(__name__, _EXPORTS)
del lazy_getattr  # (not a name of the package)
