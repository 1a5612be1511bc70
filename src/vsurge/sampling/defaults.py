"""Sampling defaults: what a request gets for the fields it leaves unset.

`vsurge chat`, `vsurge generate` and `vsurge serve` share these. The choice
(`--generation-config`) follows vLLM's flag of the same name:

- "vsurge": VSURGE_DEFAULTS, settings suited to chat (llama.cpp's: temperature 0.8,
  top-k 40, top-p 0.95, min-p 0.05, and a mild repetition penalty). Greedy decoding
  makes small models loop ("the sea, the sea, the sea"), so it is not the default.
- "auto": the model's own settings (HF `generation_config.json`, GGUF
  `general.sampling.*`) for the fields it sets, VSURGE_DEFAULTS for the rest.
- a path: a generation_config.json file (or a directory holding one), over VSURGE_DEFAULTS.

The choice is resolved for a model by loading/generation_config.py (`resolve_generation_defaults`),
which reads the model's files; this module reads none.

Explicit values (CLI flags, OpenAI request fields) always win over these.
"""

from __future__ import annotations

from .params import FIELD_NAMES, SamplingParams, default_of

GENERATION_CONFIG_CHOICES = ("vsurge", "auto")  # or a path

# vsurge's own defaults. repetition_penalty, HF semantics: divides the logits of every token already
# in the prompt or the reply. On the default model at temperature 0.8 (32 seeds "What is the capital of
# France?", 16 seeds "Write a short poem about the sea."): 1.0 loops (a line 3+ times) in 8/16 poems,
# 1.05 in 5/16, 1.1 in none, and 1.1 answers "Paris" as often as any (16/32, against 11/32 without a
# penalty; 1.15: 10/32). max_tokens None: until the model stops or the context is full.
VSURGE_VALUES = {"temperature": 0.8, "top_p": 0.95, "top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1,
                 "max_tokens": None}


class GenerationDefaults:
    """Values for the SamplingParams fields a request leaves unset: vsurge's (VSURGE_VALUES), with the
    given `values` over them. Any SamplingParams field may be set; each reads as an attribute."""

    def __init__(self, source: str = "vsurge defaults", **values):
        unknown = set(values) - set(FIELD_NAMES)
        if unknown:
            raise ValueError(f"unknown sampling field(s): {', '.join(sorted(unknown))}")
        self.values = {**VSURGE_VALUES, **values}
        self.source = source  # where the values came from, for people reading the start-up line

    def __getattr__(self, name):
        if name in FIELD_NAMES:
            return self.values[name] if name in self.values else default_of(name)
        raise AttributeError(name)

    def __eq__(self, other) -> bool:
        return isinstance(other, GenerationDefaults) and (self.values, self.source) == (other.values, other.source)

    def __repr__(self) -> str:
        return f"GenerationDefaults({self.values!r}, source={self.source!r})"

    def replace(self, source: str | None = None, **values) -> "GenerationDefaults":
        return GenerationDefaults(source or self.source, **{**self.values, **values})

    def describe(self) -> str:
        return (f"temperature {self.temperature:g}, top_k {self.top_k}, top_p {self.top_p:g}, "
                f"min_p {self.min_p:g}, repetition_penalty {self.repetition_penalty:g} ({self.source})")

    def as_dict(self) -> dict:
        return dict(self.values)

    def sampling_params(self, **explicit) -> SamplingParams:
        """SamplingParams from the `explicit` values the caller set (None: unset) over these defaults.

        An explicit temperature 0 asks for plain greedy decoding: the default penalties are then left
        out too (explicit ones still apply), so `--temperature 0` gives the model's argmax continuation."""
        values = self.as_dict()
        if explicit.get("temperature") == 0:
            values["repetition_penalty"] = 1.0
        values.update({k: v for k, v in explicit.items() if v is not None})
        return SamplingParams(**values)


VSURGE_DEFAULTS = GenerationDefaults()
# What an OpenAI request's unset fields meant before: the Python server API keeps them unless told otherwise.
OPENAI_DEFAULTS = GenerationDefaults(temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, repetition_penalty=1.0,
                                     source="OpenAI's defaults")


def _coerce(name: str, value, source: str):
    """A value read from a file, as the type of the field's default (float or int)."""
    kind = type(default_of(name)) if default_of(name) is not None else int
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ValueError(f"{source}: {name} must be a number, got {value!r}") from None


def defaults_over_vsurge(found: dict, source: str) -> GenerationDefaults:
    """The fields `found` sets (coerced and validated) over VSURGE_DEFAULTS.

    Raises ValueError naming `source` when a value is out of range."""
    values = {name: _coerce(name, value, source) for name, value in found.items()}
    if values.get("top_k") == -1:
        values["top_k"] = 0  # "off" in vLLM's and HF's spelling
    if not values:
        return VSURGE_DEFAULTS.replace(source=f"{source} sets none: vsurge defaults")
    defaults = VSURGE_DEFAULTS.replace(source=f"{', '.join(sorted(values))} from {source}, the rest vsurge defaults",
                                       **values)
    try:
        defaults.sampling_params()
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None
    return defaults

