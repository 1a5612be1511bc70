"""The sampling settings a model ships with: HF `generation_config.json` or GGUF `general.sampling.*`,
and `--generation-config` resolved for a model: the settings read here over vsurge's defaults.

Keys are returned under SamplingParams' names; which fields may be set, how they are checked and
what fills the gaps is `vsurge.sampling.defaults`.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ModelLoadError
from ..sampling.defaults import VSURGE_DEFAULTS, GenerationDefaults, defaults_over_vsurge
from .hf import read_json

GENERATION_CONFIG_FILE = "generation_config.json"
# What vsurge ships for the embedded default model, whose GGUF sets no sampling keys
DEFAULT_MODEL_GENERATION_CONFIG = Path(__file__).with_name("default_model_generation_config.json")

# HF GenerationConfig key -> SamplingParams field (the keys vLLM's `--generation-config auto` reads).
HF_SAMPLING_KEYS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}

# llama.cpp's GGUF keys (gguf.Keys.General.SAMPLING_*) -> SamplingParams field. penalty_last_n,
# mirostat, xtc and the sampler sequence have no equivalent here and are ignored.
GGUF_SAMPLING_KEYS = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_p": "top_p",
    "general.sampling.top_k": "top_k",
    "general.sampling.min_p": "min_p",
    "general.sampling.penalty_repeat": "repetition_penalty",
}


def sampling_from_hf_dict(config: dict) -> dict:
    """The sampling fields a generation_config dict sets (absent or null keys are not set)."""
    return {ours: config[theirs] for theirs, ours in HF_SAMPLING_KEYS.items() if config.get(theirs) is not None}


def read_generation_config_file(path: Path) -> dict:
    """A generation_config.json file, or a directory holding one -> its sampling fields."""
    path = Path(path).expanduser()
    if path.is_dir():
        path = path / GENERATION_CONFIG_FILE
    config = read_json(path)
    if not isinstance(config, dict):
        raise ModelLoadError(f"file {str(path)!r} must hold a JSON object")
    return sampling_from_hf_dict(config)


def read_gguf_sampling(path: Path) -> dict:
    """The `general.sampling.*` keys of a GGUF file (without reading its tensors)."""
    from .gguf import field_value, open_gguf

    reader = open_gguf(Path(path))
    values = {ours: field_value(reader, key) for key, ours in GGUF_SAMPLING_KEYS.items()}
    return {k: v for k, v in values.items() if v is not None}


def model_sampling_config(model_path: Path) -> tuple[dict, str | None]:
    """(sampling fields, where they came from) of a resolved model path; ({}, None) if it has none."""
    model_path = Path(model_path)
    if _is_default_model(model_path):
        found = read_generation_config_file(DEFAULT_MODEL_GENERATION_CONFIG)
        return found, f"vsurge's settings for the default model ({DEFAULT_MODEL_GENERATION_CONFIG.name})"
    if model_path.is_dir():
        file = model_path / GENERATION_CONFIG_FILE
        if file.exists():
            found = read_generation_config_file(file)
            return (found, str(file)) if found else ({}, None)
        return {}, None
    found = read_gguf_sampling(model_path)
    return (found, f"{model_path.name} (general.sampling.*)") if found else ({}, None)


def _is_default_model(model_path: Path) -> bool:
    from .default_model import default_model_path

    try:
        return model_path.resolve() == default_model_path().resolve()
    except ModelLoadError:  # the default model is not installed: this path is not it
        return False


def resolve_generation_defaults(choice: str, model_path: Path | None) -> GenerationDefaults:
    """`--generation-config` ("vsurge", "auto" or a path) for the model at `model_path` (resolved).

    Raises ValueError (bad values) or ModelLoadError (unreadable file)."""
    if choice == "vsurge":
        return VSURGE_DEFAULTS
    if choice == "auto":
        if model_path is None:
            return VSURGE_DEFAULTS
        found, source = model_sampling_config(model_path)
        return defaults_over_vsurge(found, source) if found else VSURGE_DEFAULTS
    path = Path(choice).expanduser()
    return defaults_over_vsurge(read_generation_config_file(path), str(path))
