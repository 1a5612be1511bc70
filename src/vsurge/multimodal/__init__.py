"""Images in prompts: reading them from requests (images.py), a family's tiling and placeholder
expansion (processor.py, <family>.py), and the prompt that carries them to the engine (media.py).
No JAX here: the server and the loaders use it; the engine runs the model's vision program."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from .images import ImageError, MediaPolicy, decode_image, image_bytes
from .media import MediaItem, MultimodalPrompt, content_key, pseudo_tokens
from .processor import ImageProcessor

__all__ = ["ImageError", "MediaPolicy", "MediaItem", "MultimodalPrompt", "ImageProcessor", "content_key",
           "pseudo_tokens", "decode_image", "image_bytes", "image_config", "image_processor_for"]


def _read(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def _preprocessor(model_dir: Path) -> dict:
    """preprocessor_config.json, or the image_processor section of processor_config.json."""
    pre = _read(model_dir / "preprocessor_config.json")
    return pre or dict(_read(model_dir / "processor_config.json").get("image_processor") or {})


def image_config(config, model_dir: Path):
    """The model config with its image processor's normalization (what the vision program applies)."""
    pre = _preprocessor(Path(model_dir))
    updates = {}
    for key in ("image_mean", "image_std"):
        if pre.get(key) is not None:
            value = pre[key]
            updates[key] = tuple(float(v) for v in (value if isinstance(value, list) else [value] * 3))
    if pre.get("rescale_factor") is not None:
        updates["rescale_factor"] = float(pre["rescale_factor"])
    if pre.get("do_normalize") is False:
        updates.update(image_mean=(0.0, 0.0, 0.0), image_std=(1.0, 1.0, 1.0))
    if pre.get("do_rescale") is False:
        updates["rescale_factor"] = 1.0
    return dataclasses.replace(config, **updates) if updates else config


def image_processor_for(config, model_dir: Path | None, tokenizer, preprocessor: dict | None = None):
    """The image processor of a vision-language model (by its family): its settings from the model
    directory's preprocessor_config.json / processor_config.json, or (model_dir None: llama.cpp's mmproj
    file) from `preprocessor` in preprocessor_config.json's schema, the rest from the config."""
    if model_dir is not None:
        model_dir = Path(model_dir)
        preprocessor, processor = _preprocessor(model_dir), _read(model_dir / "processor_config.json")
    else:
        preprocessor, processor = dict(preprocessor or {}), {}
    if config.architecture == "idefics3":
        from .idefics3 import Idefics3Images

        return Idefics3Images(config, preprocessor, processor, tokenizer)
    if config.architecture == "gemma3_vl":
        from .gemma3 import Gemma3Images

        return Gemma3Images(config, preprocessor, processor, tokenizer)
    if config.architecture in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5_vl"):
        from .qwen2_vl import QwenVLImages

        return QwenVLImages(config, preprocessor, processor, tokenizer)
    if config.architecture == "mistral3":
        from .pixtral import PixtralImages

        return PixtralImages(config, preprocessor, processor, tokenizer)
    raise ValueError(f"no image processor for {config.architecture}")
