"""Reading llama.cpp's mmproj metadata (the `clip.*` keys its converter writes beside the vision tower
and projector, tools/mtmd/clip.cpp reads them) into the VisionConfig fields a SigLIP-towered family
shares. The family adds its projector's own keys (models/families/idefics3.py, models/families/gemma3_vl.py)."""

from __future__ import annotations

from typing import Any

from ...errors import ModelLoadError, UnsupportedModelError
from .config_io import GGUFMeta

MMPROJ_ARCH = "clip"  # general.architecture of every mmproj file


def projector_type(mm: GGUFMeta) -> str:
    """clip.projector_type (older files: clip.vision.projector_type); the file must hold a vision tower."""
    if mm.arch != MMPROJ_ARCH:
        raise ModelLoadError(f"{mm.where} is not an mmproj file (general.architecture {mm.arch!r}, not "
                             f"{MMPROJ_ARCH!r}): give the vision tower's GGUF as the mmproj, the text model's "
                             "as the model")
    if not mm.key("has_vision_encoder", False):
        raise UnsupportedModelError(f"{mm.where}: this mmproj holds no vision encoder (clip.has_vision_encoder); "
                                    "only images are supported")
    kind = mm.key("projector_type") or mm.key("vision.projector_type")
    if kind is None:
        raise ModelLoadError(f"{mm.where}: metadata key 'clip.projector_type' is missing")
    return str(kind)


def token_id(text: GGUFMeta, token: str, where: str) -> int:
    """The id of `token` in the text GGUF's vocabulary (an image's placeholder)."""
    tokens = text.get("tokenizer.ggml.tokens") or []
    try:
        return tokens.index(token)
    except ValueError:
        raise ModelLoadError(f"{where}: the text model's vocabulary has no {token!r} token, which its images "
                             "need (is this the text half of the vision-language model the mmproj belongs "
                             "to?)") from None


def tower_fields(mm: GGUFMeta, text_hidden: int) -> dict[str, Any]:
    """The VisionConfig fields every mmproj states alike (clip.vision.*): the tower's widths, depth, heads,
    norm epsilon and pixel normalization; its projection must reach the text model's width."""
    def key(name: str):
        return mm.key(f"vision.{name}", required=True)

    width = mm.key("vision.projection_dim")
    if width is not None and int(width) != text_hidden:
        raise ModelLoadError(f"{mm.where}: the mmproj projects images to width {int(width)}, but the text "
                             f"model's width is {text_hidden}: the two files are not one model's halves")
    return dict(vision_hidden=int(key("embedding_length")), vision_layers=int(key("block_count")),
                vision_heads=int(key("attention.head_count")), vision_intermediate=int(key("feed_forward_length")),
                vision_eps=float(mm.key("vision.attention.layer_norm_epsilon", 1e-6)),
                image_mean=tuple(float(v) for v in key("image_mean")),
                image_std=tuple(float(v) for v in key("image_std")), rescale_factor=1 / 255)


def activation(mm: GGUFMeta) -> str:
    """The tower's MLP activation as clip.cpp picks it (clip.use_silu, clip.use_gelu: the tanh GELU)."""
    if mm.key("use_silu", False):
        return "silu"
    if mm.key("use_gelu", False):
        return "gelu_pytorch_tanh"
    raise UnsupportedModelError(f"{mm.where}: a vision tower with neither SiLU nor GELU (clip.use_silu, "
                                "clip.use_gelu) is not supported")


def vision_fields(mm: GGUFMeta, text_hidden: int, merge: int) -> dict[str, Any]:
    """A SigLIP tower's VisionConfig fields (and `patch_size`) from clip.vision.*, its tiles' patches merged
    `merge` x `merge` into one token (clip.vision.projector.scale_factor, whose default is the family's)."""
    fields = tower_fields(mm, text_hidden)
    if activation(mm) != "gelu_pytorch_tanh":
        raise UnsupportedModelError(f"{mm.where}: a SigLIP tower without GELU (clip.use_gelu) is not supported")
    tile, patch = int(mm.key("vision.image_size", required=True)), int(mm.key("vision.patch_size", required=True))
    if tile % patch or (tile // patch) % merge:
        raise UnsupportedModelError(f"{mm.where}: image_size {tile} is not a whole number of {patch}-pixel patches "
                                    f"divisible by the projector's scale_factor {merge}")
    return dict(fields, tile_size=(tile, tile), patch_size=patch, tokens_per_tile=(tile // patch // merge) ** 2,
                vision_activation="gelu_pytorch_tanh")
