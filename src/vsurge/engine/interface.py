"""The contract between a driver and an engine, written down (as JetStream's engine_api does).

A driver owns one thread per engine and only ever calls what this Protocol
lists; the HTTP layer and the drivers never import JAX (results come back as
numpy through `StepResult.to_host`). `EngineCore` implements it on a device;
tests/mock_engine.py implements it by hand-computable rules. A disaggregated
driver (engine/disaggregated.py) also calls export_prefix / receive_prefix /
insert_prefix (engine/transfer.py).

The seed's abstract classes that spell this contract (`AbstractInferenceEngine`,
`AbstractDriver`) are in seed/base_classes.py.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from .plan import HostStepOutput, StepPlan
from .scheduler import Scheduler


@runtime_checkable
class StepResult(Protocol):
    def to_host(self, with_logprobs: bool) -> HostStepOutput:
        """Tokens (K, R), valid (K, R), logprobs, chunk_offset as host arrays."""


@runtime_checkable
class Engine(Protocol):
    # limits that requests are validated against (engine/validation.py)
    max_length: int
    max_prompt_length: int
    max_concurrent_decodes: int
    vocab_size: int
    eos_token_ids: list[int]
    processor: Any  # tokenizer: encode/decode (text streams need it)
    model_name: str  # the metrics label until a served name replaces it

    def new_seed(self) -> int:
        """A sampling seed for a request that gave none."""

    def new_scheduler(self) -> Scheduler:
        """A scheduler over this engine's page pool and config (one per driver thread)."""

    def compile(self, progress: bool = True) -> None:
        """Build every program the engine runs; nothing compiles after this."""

    def init_state(self) -> Any:
        """The device state (KV pages and per-slot sampling state), empty."""

    def step(self, state: Any, plan: StepPlan, masks: dict | None = None) -> tuple[Any, StepResult]:
        """Run one plan: the state is consumed (donated) and a new one returned. masks: sequence ->
        packed bits of its allowed next tokens (`Scheduler.masks(plan)`, structured outputs)."""

    # Optional: engines that serve embeddings and prompt logprobs also have
    #     encode_step(pending: list[EncodeRequest]) -> list[(request, result)]
    # (one embed/score call over waiting requests; engine/encode.py). The driver calls it only
    # when such requests wait, so engines without it (tests/mock_engine.py) never see one.
