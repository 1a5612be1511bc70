"""SamplingParams: how one request is sampled — the one declaration of every sampling field.

Each field carries its `Knob` (dataclass field metadata): how it is checked (with the
messages clients expect, vLLM's), whether HTTP bodies carry it under its own name and
as what JSON type, the command-line flags that set it, and whether it is a per-row
array of the compiled step. Everything else derives from this list:

- server/adapters/common.py: the sampling fields of every wire format's request body
  (chat, completions, responses, messages) and their mapping onto SamplingParams;
- ops/sampling.py: `SamplingArrays`, one column per `device=` field (per-row arrays:
  changing a value never recompiles);
- defaults.py: which fields `--generation-config` may set, and their types;
- cli/arguments.py: the sampling flags of `vsurge generate` / `vsurge chat`;
- vsurge.py: `vSurgeRequest`, the seed's request type (its fields plus all of these).

Every number a request carries is bounded here, by what the engine can represent: a `device=`
field's value must fit its dtype (int32, float32), token ids and counts fit int32, seeds int64.

So adding a sampling field is one `knob(...)` line here and its use (e.g. a stage of
ops/sampling.py). A `structured` constraint (JSON schema, regex, choice, grammar, JSON
object) becomes a per-row token bitmask filled on the host (`vsurge.structured`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
from pydantic import StrictInt, StrictStr

from ..structured.errors import ParamError
from ..structured.spec import StructuredOutput

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MAX = 2**31 - 1  # the widest count a compiled step's int32 arrays hold (token ids, budgets, top_k)
MAX_STOP = 16  # stop strings per request
MAX_N = 16  # samples per request
TOP_LOGPROBS_LIMIT = 20  # alternatives per token (ops/sampling.TOP_LOGPROBS)


@dataclass(frozen=True)
class Knob:
    """What the schema says about one SamplingParams field (its dataclass metadata)."""

    check: Callable[[str, Any], Any] | None = None  # (name, value) -> normalized value; raises ValueError
    wire: Any = None  # the JSON type HTTP bodies carry it as, under the field's name (None: not on the wire)
    cli: tuple[str, ...] = ()  # flags of `vsurge generate` / `vsurge chat`
    help: str = ""  # the flag's help
    device: Any = None  # numpy dtype of its per-row column in the compiled step (None: host only);
    # every value a request carries must be representable in it (`validate` refuses the rest by name)
    neutral: Any = None  # that column's value in padding rows


def knob(default=None, *, default_factory=None, **spec) -> Any:
    metadata = {"knob": Knob(**spec)}
    if default_factory is not None:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


# ------------------------------------------------------------ checks (vLLM's messages)
def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool) \
        and value == value  # not NaN


def _fail(name: str, message: str):
    raise ParamError(message, name)


def at_least(low: int, allow_none: bool = True, high: int = INT32_MAX):
    """low <= value; above `high` (what the engine's int32 arrays hold) the message gives both bounds."""
    def check(name, value):
        if value is None and allow_none:
            return None
        if not _is_int(value) or value < low:
            _fail(name, f"{name} must be at least {low}, got {value}.")
        if value > high:
            _fail(name, f"{name} must be in [{low}, {high}], got {value}.")
        return int(value)
    return check


def int_range(low: int, high: int):
    def check(name, value):
        if value is None:
            return None
        if not _is_int(value) or not low <= value <= high:
            _fail(name, f"{name} must be in [{low}, {high}], got {value}.")
        return int(value)
    return check


def number_range(low: float, high: float, open_low: bool = False, text: str | None = None):
    """low <= value <= high (low < value with open_low); `text` replaces the range in the message."""
    def check(name, value):
        ok = _is_number(value) and (low < value if open_low else low <= value) and value <= high
        if not ok:
            where = text or f"in {'(' if open_low else '['}{low:g}, {high:g}]"
            _fail(name, f"{name} must be {where}, got {value}.")
        return float(value)
    return check


def _top_k(name, value):
    """-1 is vLLM's spelling of "off" (0). A top_k beyond the vocabulary keeps the whole vocabulary, as in
    vLLM and llama.cpp: it is clamped (here to int32, the step's array; engine/validation.py then to
    "off" when it reaches the model's vocabulary), never refused."""
    if not _is_int(value) or (value < 0 and value != -1):
        _fail(name, f"{name} must be 0 (disable), or at least 1, got {value}.")
    return 0 if value == -1 else min(int(value), INT32_MAX)


def _stop(name, value):
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(s, str) for s in value):
        _fail(name, "stop must be a string or a list of strings.")
    if any(s == "" for s in value):
        _fail(name, "stop cannot contain an empty string.")
    if len(value) > MAX_STOP:
        _fail(name, f"stop may hold at most {MAX_STOP} strings, got {len(value)}.")
    return list(value)


def _token_ids(name, value):
    """Token ids (the model's vocabulary is checked by engine/validation.py, which knows it)."""
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not all(_is_int(t) and 0 <= t <= INT32_MAX for t in value):
        _fail(name, f"{name} must be a list of token ids (integers in [0, {INT32_MAX}]).")
    return [int(t) for t in value]


def _seed(name, value):
    if value is not None and (not _is_int(value) or not INT64_MIN <= value <= INT64_MAX):
        _fail(name, f"seed must be an integer in [{INT64_MIN}, {INT64_MAX}], got {value}.")
    return None if value is None else int(value)


def _logit_bias(name, value):
    if value is None:
        return None
    try:
        bias = {int(k): float(v) for k, v in value.items()}
    except (TypeError, ValueError, AttributeError, OverflowError):
        _fail(name, "logit_bias must map token ids to numbers.")
    bad = next((k for k in bias if not 0 <= k <= INT32_MAX), None)
    if bad is not None:  # (the model's vocabulary: engine/validation.py)
        _fail(name, f"logit_bias keys must be token ids (integers in [0, {INT32_MAX}]), got {bad}.")
    if any(not -100.0 <= v <= 100.0 for v in bias.values()):
        _fail(name, "logit_bias values must be in [-100, 100].")
    return bias


MIN_TEMPERATURE = 1e-2  # vLLM's floor: below it float32 logits / temperature overflow to inf (NaN probabilities)


def _temperature(name, value):
    """0 is greedy; a positive temperature below MIN_TEMPERATURE is raised to it (as vLLM does), the
    distribution being one-hot at that point anyway. The float32 ceiling is checked by `_fits_device`."""
    value = number_range(0.0, float("inf"), text="non-negative")(name, value)
    return max(value, MIN_TEMPERATURE) if value > 0 else value


def _fits_device(name: str, value, dtype) -> None:
    """A value bound for a per-row array of the compiled step must be representable in its dtype: a
    Python int beyond int32 raises OverflowError in numpy, a float beyond float32 becomes inf there."""
    if value is None:
        return
    info = np.iinfo(dtype) if np.issubdtype(dtype, np.integer) else np.finfo(dtype)
    low, high = (int(info.min), int(info.max)) if np.issubdtype(dtype, np.integer) else (float(info.min),
                                                                                       float(info.max))
    if value > high:
        _fail(name, f"{name} must be at most {high:g} (the engine's {np.dtype(dtype).name}), got {value}.")
    if value < low:
        _fail(name, f"{name} must be at least {low:g} (the engine's {np.dtype(dtype).name}), got {value}.")


def _flag(name, value):
    if not isinstance(value, (bool, np.bool_)):
        _fail(name, f"{name} must be true or false, got {value!r}.")
    return bool(value)


def _structured(name, value):
    return StructuredOutput.coerce(value)


def _n(name, value):
    return at_least(1, allow_none=False, high=MAX_N)(name, value)


def _priority(name, value):
    if not _is_int(value) or not INT64_MIN <= value <= INT64_MAX:
        _fail(name, f"priority must be an integer, got {value!r}.")
    return int(value)


@dataclass
class SamplingParams:
    max_tokens: int | None = knob(16, check=at_least(1), wire=StrictInt, cli=("--max-tokens", "-n"),
                                  help="most new tokens per reply")
    temperature: float = knob(1.0, check=_temperature, wire=float,
                              cli=("--temperature", "--temp"), help="0 = greedy", device=np.float32, neutral=0.0)
    top_p: float = knob(1.0, check=number_range(0.0, 1.0, open_low=True), wire=float, cli=("--top-p",),
                        help="nucleus sampling", device=np.float32, neutral=1.0)
    top_k: int = knob(0, check=_top_k, wire=StrictInt, cli=("--top-k",), help="0 = off", device=np.int32,
                      neutral=0)
    min_p: float = knob(0.0, check=number_range(0.0, 1.0), wire=float, cli=("--min-p",), help="0 = off",
                        device=np.float32, neutral=0.0)
    presence_penalty: float = knob(0.0, check=number_range(-2.0, 2.0), wire=float, cli=("--presence-penalty",),
                                   help="OpenAI's, on generated tokens", device=np.float32, neutral=0.0)
    frequency_penalty: float = knob(0.0, check=number_range(-2.0, 2.0), wire=float, cli=("--frequency-penalty",),
                                    help="OpenAI's, on generated tokens", device=np.float32, neutral=0.0)
    # HF semantics: divides the logits of tokens already in the prompt or the reply
    repetition_penalty: float = knob(1.0, check=number_range(0.0, 100.0, open_low=True), wire=float,
                                     cli=("--repeat-penalty", "--repetition-penalty"),
                                     help="divides the logits of tokens already in the prompt or reply; 1 = off",
                                     device=np.float32, neutral=1.0)
    stop: list[str] | None = knob(None, check=_stop, wire=StrictStr | list[StrictStr], cli=("--stop",),
                                  help="stop at TEXT (repeatable)")  # never in the output
    stop_token_ids: list[int] | None = knob(None, check=_token_ids, wire=list[int])
    ignore_eos: bool = knob(False, check=_flag, wire=bool)
    seed: int | None = knob(None, check=_seed, wire=int, cli=("--seed",), help="sampling seed (default: random)")
    n: int = knob(1, check=_n, wire=StrictInt)
    skip_special_tokens: bool = knob(True, check=_flag, wire=bool)
    # top alternatives returned per token (0 = just the chosen one); each wire format spells it its own way
    logprobs: int | None = knob(None, check=int_range(0, TOP_LOGPROBS_LIMIT))
    # log-probabilities of the prompt's tokens too, with this many alternatives (vLLM's prompt_logprobs)
    prompt_logprobs: int | None = knob(None, check=int_range(0, TOP_LOGPROBS_LIMIT), wire=StrictInt)
    logit_bias: dict[int, float] | None = knob(None, check=_logit_bias, wire=dict[str, float])
    # The output must match this: a StructuredOutput or a dict of its fields, e.g.
    # {"json": schema}, {"regex": r"\d+"}, {"choice": ["yes", "no"]}, {"grammar": lark},
    # {"json_object": True}. Invalid constraints raise ValueError here.
    structured: StructuredOutput | dict | None = knob(None, check=_structured)
    # Prompt-lookup draft tokens per step for this (greedy) request; None = the engine's setting.
    speculative_tokens: int | None = knob(None, check=int_range(0, 16))
    # Scheduling priority (vLLM's): lower runs first under `--scheduling-policy priority`.
    priority: int = knob(0, check=_priority, wire=StrictInt)
    extra: dict[str, Any] = knob(default_factory=dict)

    def __post_init__(self):
        self.validate()

    def validate(self) -> "SamplingParams":
        """Check and normalize every field; ParamError (a ValueError) names the first bad one."""
        for f in dataclasses.fields(self):
            spec = f.metadata["knob"]
            if spec.check is not None:
                setattr(self, f.name, spec.check(f.name, getattr(self, f.name)))
            if spec.device is not None:
                _fits_device(f.name, getattr(self, f.name), spec.device)
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
            unknown = set(value) - set(FIELD_NAMES)
            if unknown:
                raise ValueError(f"unknown sampling parameter(s): {', '.join(sorted(unknown))}")
            return cls(**{**defaults, **value})
        raise TypeError(f"sampling_params must be SamplingParams or dict, got {type(value).__name__}")

    def eos_ids(self, model_eos: Sequence[int]) -> list[int]:
        """Token ids that end this request: eos (unless ignored) + stop_token_ids."""
        ids = [] if self.ignore_eos else list(model_eos)
        return list(dict.fromkeys(ids + list(self.stop_token_ids or [])))


# ------------------------------------------------------------ views of the schema (what the rest reads)
FIELDS: tuple[dataclasses.Field, ...] = dataclasses.fields(SamplingParams)
FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in FIELDS)


def knob_of(name: str) -> Knob:
    return next(f.metadata["knob"] for f in FIELDS if f.name == name)


def wire_fields() -> dict[str, Any]:
    """name -> JSON type of every field HTTP bodies carry under its own name."""
    return {f.name: f.metadata["knob"].wire for f in FIELDS if f.metadata["knob"].wire is not None}


def device_columns() -> list[tuple[str, Any, Any]]:
    """(name, dtype, neutral value) of every per-row array of the compiled step, in order."""
    return [(f.name, k.device, k.neutral) for f in FIELDS if (k := f.metadata["knob"]).device is not None]


def cli_fields() -> list[tuple[str, Knob, type]]:
    """(name, knob, value type) of every field with command-line flags."""
    types = {"max_tokens": int, "seed": int, "stop": str}
    return [(f.name, k, types.get(f.name, type(f.default))) for f in FIELDS if (k := f.metadata["knob"]).cli]


def default_of(name: str):
    f = next(f for f in FIELDS if f.name == name)
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
