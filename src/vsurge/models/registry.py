"""Which families vsurge runs: every family module in models/families/, found there.

Each family class declares the HF `model_type`s and GGUF architectures it runs (models/parts/base.py); a
class of a module in families/ that declares either is a family, so adding a family is its one file. This
module indexes them.
"""

from __future__ import annotations

import pkgutil
from functools import lru_cache
from importlib import import_module

from ..errors import UnsupportedModelError
from . import families as family_modules


def _declares_a_family(obj, module) -> bool:
    """A class the module defines (not one it imports) that runs some HF model type or GGUF architecture."""
    return (isinstance(obj, type) and obj.__module__ == module.__name__
            and bool(getattr(obj, "hf_model_types", ()) or getattr(obj, "gguf_architectures", ())))


def _claimed_once(found: list[type]) -> None:
    """An HF model type or architecture names one family (a GGUF architecture may be shared: Llama and Mixtral
    both read `llama` files and tell them apart with accepts_gguf)."""
    for attribute in ("hf_model_types", "hf_architectures"):
        owner: dict[str, type] = {}
        for family in found:
            for name in getattr(family, attribute):
                if name in owner:
                    raise TypeError(f"{attribute} {name!r} is declared by both {owner[name].__module__}."
                                    f"{owner[name].__name__} and {family.__module__}.{family.__name__}")
                owner[name] = family


@lru_cache(maxsize=None)
def families() -> tuple:
    """Every family class, by module name (then by definition order in its module)."""
    found = []
    for info in sorted(pkgutil.iter_modules(family_modules.__path__), key=lambda info: info.name):
        module = import_module(f"{family_modules.__name__}.{info.name}")
        found += [obj for obj in vars(module).values() if _declares_a_family(obj, module)]
    _claimed_once(found)
    return tuple(found)


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
