"""SamplingParams: how one request is sampled, validated with the messages clients expect (vLLM's).

Every numeric knob becomes a per-row array inside the compiled step
(`ops.sampling.SamplingArrays`), so changing them never recompiles. A
`structured` constraint (JSON schema, regex, choice, grammar, JSON object)
becomes a per-row token bitmask filled on the host (`vsurge.structured`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Sequence

from .structured.spec import StructuredOutput

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


@dataclass
class SamplingParams:
    max_tokens: int | None = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    seed: int | None = None
    n: int = 1
    skip_special_tokens: bool = True
    logprobs: int | None = None  # top alternatives returned per token (0 = just the chosen one)
    logit_bias: dict[int, float] | None = None
    # The output must match this: a StructuredOutput or a dict of its fields, e.g.
    # {"json": schema}, {"regex": r"\d+"}, {"choice": ["yes", "no"]}, {"grammar": lark},
    # {"json_object": True}. Invalid constraints raise ValueError here.
    structured: StructuredOutput | dict | None = None
    # Prompt-lookup draft tokens per step for this (greedy) request; None = the engine's setting.
    speculative_tokens: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.validate()

    # The messages follow vLLM's, which OpenAI clients already handle.
    def validate(self) -> "SamplingParams":
        if self.max_tokens is not None and (not _is_int(self.max_tokens) or self.max_tokens < 1):
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}.")
        if not _is_number(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}.")
        if not _is_number(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if not _is_int(self.top_k) or (self.top_k < 0 and self.top_k != -1):
            raise ValueError(f"top_k must be 0 (disable), or at least 1, got {self.top_k}.")
        if self.top_k == -1:
            self.top_k = 0  # vLLM's spelling of "off"
        if not _is_number(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}.")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_number(value) or not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {value}.")
        if not _is_number(self.repetition_penalty) or not 0.0 < self.repetition_penalty <= 100.0:
            raise ValueError(f"repetition_penalty must be in (0, 100], got {self.repetition_penalty}.")
        if self.stop is not None:
            if not isinstance(self.stop, (list, tuple)) or not all(isinstance(s, str) for s in self.stop):
                raise ValueError("stop must be a string or a list of strings.")
            if any(s == "" for s in self.stop):
                raise ValueError("stop cannot contain an empty string.")
            self.stop = list(self.stop)
        if self.stop_token_ids is not None:
            if not all(_is_int(t) and t >= 0 for t in self.stop_token_ids):
                raise ValueError("stop_token_ids must be a list of non-negative integers.")
            self.stop_token_ids = [int(t) for t in self.stop_token_ids]
        if self.seed is not None and (not _is_int(self.seed) or not INT64_MIN <= self.seed <= INT64_MAX):
            raise ValueError(f"seed must be an integer in [{INT64_MIN}, {INT64_MAX}], got {self.seed}.")
        if not _is_int(self.n) or self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}.")
        if self.logprobs is not None and (not _is_int(self.logprobs) or not 0 <= self.logprobs <= 20):
            raise ValueError(f"logprobs must be in [0, 20], got {self.logprobs}.")
        if self.logit_bias is not None:
            try:
                self.logit_bias = {int(k): float(v) for k, v in self.logit_bias.items()}
            except (TypeError, ValueError, AttributeError):
                raise ValueError("logit_bias must map token ids to numbers.") from None
            if any(not -100.0 <= v <= 100.0 for v in self.logit_bias.values()):
                raise ValueError("logit_bias values must be in [-100, 100].")
        self.structured = StructuredOutput.coerce(self.structured)
        if self.speculative_tokens is not None and (not _is_int(self.speculative_tokens)
                                                    or not 0 <= self.speculative_tokens <= 16):
            raise ValueError(f"speculative_tokens must be in [0, 16], got {self.speculative_tokens}.")
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def replace(self, **changes) -> "SamplingParams":
        return dataclasses.replace(self, **changes)

    @classmethod
    def coerce(cls, value: "SamplingParams | dict | None", **defaults) -> "SamplingParams":
        """Accept a SamplingParams, a dict of its fields, or None (defaults)."""
        if value is None:
            return cls(**defaults)
        if isinstance(value, SamplingParams):
            return value
        if isinstance(value, dict):
            unknown = set(value) - {f.name for f in dataclasses.fields(cls)}
            if unknown:
                raise ValueError(f"unknown sampling parameter(s): {', '.join(sorted(unknown))}")
            return cls(**{**defaults, **value})
        raise TypeError(f"sampling_params must be SamplingParams or dict, got {type(value).__name__}")

    def eos_ids(self, model_eos: Sequence[int]) -> list[int]:
        """Token ids that end this request: eos (unless ignored) + stop_token_ids."""
        ids = [] if self.ignore_eos else list(model_eos)
        return list(dict.fromkeys(ids + list(self.stop_token_ids or [])))


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value  # not NaN
