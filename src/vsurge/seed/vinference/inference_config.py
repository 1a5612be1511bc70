"""vInference's configuration objects and result type, as in the seed API (pydantic models)."""

from __future__ import annotations

import itertools
from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ...sampling.params import SamplingParams


class vInferenceConfig(BaseModel):  # noqa: N801 (the seed's name)
    """How vInference generates: lengths, streaming granularity, special tokens, default sampling."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    max_new_tokens: int = 512
    streaming_chunks: int = 16  # decode steps run on the device per host round-trip
    num_return_sequences: int = 1
    pad_token_id: Optional[int] = None
    bos_token_id: Optional[int] = None
    eos_token_id: Optional[Union[int, list[int]]] = None
    partition_rules: Optional[tuple] = None
    sampling_params: Optional[SamplingParams] = None
    # Prompts longer than `model_prefill_length`: False = error, True = keep the END of the prompt.
    truncate_prompt: bool = False
    # KV pages' storage: None / "auto" = the model dtype, "int8" / "fp8" = quantized (kv/quant.py)
    kv_cache_dtype: Optional[str] = None

    @field_validator("max_new_tokens", "streaming_chunks", "num_return_sequences")
    @classmethod
    def _positive(cls, value, info):
        if value < 1:
            raise ValueError(f"{info.field_name} must be at least 1, got {value}")
        return value

    @property
    def eos_token_ids(self) -> list[int]:
        eos = self.eos_token_id
        if eos is None:
            return []
        return [int(eos)] if isinstance(eos, int) else [int(e) for e in eos]

    def to_json_dict(self) -> dict[str, Any]:
        data = self.model_dump(exclude={"sampling_params", "partition_rules"})
        if self.sampling_params is not None:
            import dataclasses

            data["sampling_params"] = dataclasses.asdict(self.sampling_params)
        return data

    @classmethod
    def from_json_dict(cls, data: dict[str, Any]) -> "vInferenceConfig":
        data = dict(data)
        if data.get("sampling_params") is not None:
            data["sampling_params"] = SamplingParams(**data["sampling_params"])
        return cls(**data)


def _as_list(value) -> list[int]:
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if not values or any(not isinstance(v, int) or v < 1 for v in values):
        raise ValueError(f"bucket sizes must be positive integers, got {value!r}")
    return sorted(set(values))


class vInferencePreCompileConfig(BaseModel):  # noqa: N801
    """Shapes to compile ahead of time; every (batch_size, prefill_length) pair is compiled."""

    batch_size: Union[int, list[int]] = 1
    prefill_length: Union[int, list[int]] = 512

    def combinations(self) -> list[tuple[int, int]]:
        return list(itertools.product(_as_list(self.batch_size), _as_list(self.prefill_length)))

    @field_validator("batch_size", "prefill_length")
    @classmethod
    def _check(cls, value):
        _as_list(value)
        return value


class vInferenceMetaData(BaseModel):  # noqa: N801
    model_config = ConfigDict(arbitrary_types_allowed=True)

    inference_name: str
    generation_config: vInferenceConfig
    precompiled_configs: dict[int, vInferencePreCompileConfig] = Field(default_factory=dict)
    in_compiling_process: set = Field(default_factory=set)
    input_partition_spec: Any = None
    uuid4: str


class PromptOutput(BaseModel):
    """Structure for holding the output of a processed prompt."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    text: Optional[str] = None
    generated_tokens: Optional[int] = None
    tokens_per_second: Optional[float] = None
    error: Optional[str] = None
    finish_reason: Optional[str] = None
