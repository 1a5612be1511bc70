"""Idefics3 and SmolVLM: a SigLIP vision tower, a pixel-shuffle connector, a Llama language model.

HF: Idefics3ForConditionalGeneration (model_type "idefics3": SmolVLM-256M/500M/2.2B-Instruct),
SmolVLMForConditionalGeneration ("smolvlm": SmolVLM2). An image is cut into square tiles (plus a
downscaled whole image, multimodal/idefics3.py); each tile's patches go through the tower, the
connector folds each 2 x 2 (scale_factor) block of patch vectors into one and projects it to the
language model's width: `tokens_per_tile` embeddings per tile, at the tile's <image> tokens.
The language model's weights are under model.text_model (read as a Llama's).
llama.cpp: a `llama` text GGUF and an mmproj of projector type "idefics3" (the connector as mm.model.fc).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ...errors import UnsupportedModelError
from ...ops import vision as ops
from ..parts.config_io import hf_fields
from ..parts import siglip
from ..parts.mmproj_config import token_id, vision_fields
from .llama import Llama
from ..parts.spec import Weight
from ..parts.vision_lm import VisionConfig, VisionLM


@dataclass(frozen=True)
class Idefics3Config(VisionConfig):
    patch_size: int = 16
    scale_factor: int = 2


class Idefics3(VisionLM, Llama):
    supports_lora = False  # (adapters name model.text_model's projections: not laid out yet)
    name = "idefics3"
    hf_model_types = ("idefics3", "smolvlm")
    hf_architectures = ("Idefics3ForConditionalGeneration", "SmolVLMForConditionalGeneration")
    gguf_architectures = ()  # (a text GGUF alone is a Llama's; with its mmproj: config_from_mmproj)
    mmproj_projector = "idefics3"
    mmproj_text_architecture = "llama"
    config_class = Idefics3Config
    hf_renames = (("model.text_model.", "model."),)

    @classmethod
    def config_from_hf(cls, cfg: dict, where: str):
        text, vision = cfg.get("text_config") or {}, cfg.get("vision_config") or {}
        if text.get("model_type", "llama") != "llama":
            raise UnsupportedModelError(f"{where}: an Idefics3 language model of type {text.get('model_type')!r} "
                                        "is not supported (llama only)")
        text = {"rms_norm_eps": 1e-5, **text, "_name_or_path": cfg.get("_name_or_path", "")}
        text.setdefault("tie_word_embeddings", cfg.get("tie_word_embeddings", False))
        fields = hf_fields(text, where, cls.name)
        if text.get("attention_bias") or text.get("mlp_bias"):
            raise UnsupportedModelError(f"{where}: attention or MLP biases in the language model are not supported")
        hidden = int(vision.get("hidden_size", 1152))
        patch, tile = int(vision.get("patch_size", 32)), int(vision.get("image_size", 224))
        factor = int(cfg.get("scale_factor", 2))
        side = tile // patch
        if tile % patch or side % factor:
            raise UnsupportedModelError(f"{where}: image_size {tile} is not a whole number of {patch}-pixel "
                                        f"patches divisible by scale_factor {factor}")
        activation = vision.get("hidden_act", "gelu_pytorch_tanh")
        if activation not in ops.ACTIVATIONS:
            raise UnsupportedModelError(f"{where}: vision hidden_act {activation!r} is not supported")
        return Idefics3Config(
            **fields, image_token_id=int(cfg.get("image_token_id", 128257)), tile_size=(tile, tile),
            tokens_per_tile=(side // factor) ** 2, vision_hidden=hidden,
            vision_layers=int(vision.get("num_hidden_layers", 12)), vision_heads=int(vision.get("num_attention_heads", 16)),
            vision_intermediate=int(vision.get("intermediate_size", 3072)),
            vision_eps=float(vision.get("layer_norm_eps", 1e-6)), vision_activation=activation, patch_size=patch,
            scale_factor=factor)

    @classmethod
    def config_from_mmproj(cls, text, mm, where: str):
        base = cls.config_from_gguf(text, text.where)  # Llama's reading, as an Idefics3Config
        factor = int(mm.key("vision.projector.scale_factor", 2))
        return dataclasses.replace(base, **vision_fields(mm, base.hidden_size, factor), scale_factor=factor,
                                   image_token_id=token_id(text, "<image>", where))

    @classmethod
    def mmproj_preprocessor(cls, mm) -> dict:
        # the first resize's longest edge (the converter's preproc_image_size; without it, one tile)
        edge = mm.key("vision.preproc_image_size") or mm.key("vision.image_size")
        return {"size": {"longest_edge": int(edge)}}

    @classmethod
    def vision_weights(cls, c: Idefics3Config) -> dict[str, Weight]:
        return {**siglip.tower_weights(c, "model.vision_model"),
                "projector": siglip.mat("model.connector.modality_projection.proj.weight", c.hidden_size,
                                        c.vision_hidden * c.scale_factor ** 2, gguf="mm.model.fc.weight")}

    @classmethod
    def vision_layer_weights(cls, c: Idefics3Config, i: int) -> dict[str, Weight]:
        return siglip.block_weights(c, i, "model.vision_model")

    def encode_images(self, pixels):
        c: Idefics3Config = self.config
        h = ops.pixel_shuffle(siglip.encode(self, pixels), c.scale_factor)  # (n, tokens_per_tile, Dv * f^2)
        out = ops.dense(h, self.vision.weights()["projector"])  # (n, tokens_per_tile, D)
        return out.reshape(-1, out.shape[-1]).astype(self.dtype)
