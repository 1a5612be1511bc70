"""Which families vsurge runs: one line per family (its module under models/).

Each family class declares the HF `model_type`s and GGUF architectures it runs
(models/base.py); this module indexes them. Adding a family is its file plus
its line in FAMILIES.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import import_module

from ..errors import UnsupportedModelError

# module name under vsurge.models -> the family class it defines
FAMILIES = {
    "llama": "Llama",
    "mistral": "Mistral",
    "qwen2": "Qwen2",
    "qwen3": "Qwen3",
    "gemma2": "Gemma2",
    "gemma3": "Gemma3",
    "gemma4": "Gemma4",
    "phi3": "Phi3",
    "olmo2": "Olmo2",
    "granite": "Granite",
    "smollm3": "SmolLM3",
    "mixtral": "Mixtral",
    "qwen2_moe": "Qwen2Moe",
    "qwen3_moe": "Qwen3Moe",
    "gpt_oss": "GptOss",
    "deepseek": "DeepSeek",
    "glm4": "Glm4",
    "cohere2": "Cohere2",
    "ministral3": "Ministral3",
    "qwen3_next": "Qwen3Next",
    "granitemoehybrid": "GraniteMoeHybrid",
    "lfm2": "Lfm2",
    "nemotron_h": "NemotronH",
    "falcon_h1": "FalconH1",
    "llama4": "Llama4",
    "idefics3": "Idefics3",
    "gemma3_vl": "Gemma3VL",
    "qwen2_vl": "Qwen2VL",
    "qwen2_5_vl": "Qwen25VL",
    "qwen3_vl": "Qwen3VL",
    "qwen3_vl_moe": "Qwen3VLMoe",
    "qwen3_5_vl": "Qwen35VL",
    "mistral3": "Mistral3",
}


@lru_cache(maxsize=None)
def families() -> tuple:
    return tuple(getattr(import_module(f"{__package__}.{module}"), cls) for module, cls in FAMILIES.items())


def hf_model_types() -> dict[str, type]:
    return {t: family for family in families() for t in family.hf_model_types}


def gguf_architectures() -> dict[str, list[type]]:
    out: dict[str, list[type]] = {}
    for family in families():
        for arch in family.gguf_architectures:
            out.setdefault(arch, []).append(family)
    return out


# HF model_type -> family class (the public table of what loads)
def supported_architectures() -> list[str]:
    return sorted(hf_model_types())


def family_for_hf(cfg: dict, where: str = "config.json"):
    """The family of a parsed HF config.json (by `model_type`, else by `architectures`)."""
    model_type = cfg.get("model_type")
    by_type = hf_model_types()
    if model_type in by_type:
        return by_type[model_type]
    for arch in cfg.get("architectures") or ():
        for family in families():
            if arch in family.hf_architectures:
                return family
    raise UnsupportedModelError(
        f"{where}: model_type {model_type!r} (architectures {cfg.get('architectures')}) is not supported; "
        f"supported: {', '.join(supported_architectures())}"
    )


def family_for_gguf(meta):
    """The family of a GGUF file (by `general.architecture`; families sharing one tell apart)."""
    candidates = gguf_architectures().get(meta.arch, [])
    for family in candidates:
        if family.accepts_gguf(meta):
            return family
    raise UnsupportedModelError(
        f"{meta.where}: GGUF architecture {meta.arch!r} is not supported; "
        f"supported: {', '.join(sorted(gguf_architectures()))}"
    )


def family_for_mmproj(text_arch: str, projector: str, where: str):
    """The vision-language family of llama.cpp's pair: a text GGUF of architecture `text_arch` and an mmproj
    of `clip.projector_type` `projector` (where: both files, for the errors)."""
    paired = [f for f in families() if getattr(f, "mmproj_projector", None)]

    def text_archs(f) -> tuple[str, ...]:
        return (f.mmproj_text_architecture, *f.mmproj_other_text_architectures)

    supported = ", ".join(sorted(f"{f.mmproj_projector} (with a {' or '.join(text_archs(f))} text GGUF)" for f in paired))
    if not any(f.mmproj_projector == projector for f in paired):
        raise UnsupportedModelError(f"{where}: mmproj projector type {projector!r} is not supported; supported: "
                                    f"{supported}")
    # (one projector may serve several text models: Qwen3-VL's with a dense or a mixture-of-experts one)
    family = next((f for f in paired if f.mmproj_projector == projector and text_arch in text_archs(f)), None)
    if family is None:
        vision = sorted({f.mmproj_projector for f in paired if text_arch in text_archs(f)})
        raise UnsupportedModelError(
            f"{where}: the text GGUF's architecture {text_arch!r} " +
            (f"pairs with mmproj projector type {', '.join(vision)}, not {projector!r}" if vision else
             "has no vision-language family here (no --mmproj for it)") + f"; supported pairs: {supported}")
    return family


def config_from_hf(cfg: dict, where: str = "config.json"):
    """A parsed HF config.json -> its family's ModelConfig."""
    return family_for_hf(cfg, where).config_from_hf(cfg, where)
