"""The seed's abstract classes (EasyDeL's names): `AbstractInferenceEngine`, the base of vEngine and
oEngine, and `AbstractDriver`, the base of vDriver and oDriver. Their abstract methods are the
engine contract that vsurge's own classes follow without them (engine/interface.py's `Engine`
Protocol; EngineCore and Driver implement it) plus the seed's driver methods."""

from __future__ import annotations

import abc
from typing import Any

from ..engine.interface import StepResult
from ..engine.plan import StepPlan
from ..engine.scheduler import Scheduler


class AbstractInferenceEngine(abc.ABC):
    """The seed's base class of vEngine and oEngine: the `Engine` contract as abstract methods."""

    @abc.abstractmethod
    def new_seed(self) -> int:
        """A sampling seed for a request that gave none."""

    @abc.abstractmethod
    def new_scheduler(self) -> Scheduler:
        """A scheduler over this engine's page pool and config."""

    @abc.abstractmethod
    def compile(self, progress: bool = True) -> None:
        """Build every program the engine runs."""

    @abc.abstractmethod
    def init_state(self) -> Any:
        """The empty device state."""

    @abc.abstractmethod
    def step(self, state: Any, plan: StepPlan, masks: dict | None = None) -> tuple[Any, StepResult]:
        """Run one plan (the state is donated)."""


class AbstractDriver(abc.ABC):
    """The seed's base class of vDriver and oDriver: what vSurge and the server call."""

    @abc.abstractmethod
    def compile(self) -> None:
        """Compile every engine's programs."""

    @abc.abstractmethod
    def start(self) -> None:
        """Start the driver's threads."""

    @abc.abstractmethod
    def stop(self, timeout: float = 30.0) -> None:
        """Drain in-flight requests, then stop the threads."""

    @abc.abstractmethod
    def submit_request(self, request) -> None:
        """Take one ActiveRequest (raises QueueFullError / DriverNotReadyError when it cannot)."""

    def place_request_on_prefill_queue(self, request) -> None:
        self.submit_request(request)

    @abc.abstractmethod
    def get_total_concurrent_requests(self) -> int:
        """Sequences the driver can generate at once."""

    @property
    @abc.abstractmethod
    def processor(self) -> Any:
        """The engines' tokenizer."""

    @property
    @abc.abstractmethod
    def driver_name(self) -> str:
        """A name for logs and metrics."""


__all__ = ["AbstractDriver", "AbstractInferenceEngine"]
