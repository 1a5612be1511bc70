"""Gemma 3 with images (4B, 12B, 27B; MedGemma): a SigLIP tower (896-pixel images in 14-pixel patches),
its 64 x 64 patch vectors averaged in 4 x 4 blocks to 256, normed and projected to the language model's
width, the Gemma 3 text model. An image's 256 tokens attend to each other both ways (the rest of the
prompt stays causal): the engine computes each image within one step and widens its tokens' view
(VisionConfig.bidirectional_images).

HF: Gemma3ForConditionalGeneration (model_type "gemma3": the text model under language_model.model,
the tower under vision_tower(.vision_model), multi_modal_projector, each with or without a "model."
before it, as checkpoints were saved); config.json's text_config and vision_config leave out what
Gemma3TextConfig and SiglipVisionConfig default. llama.cpp: a `gemma3` text GGUF and an mmproj of
projector type "gemma3" (its converter stores the projector's norm as 1 + w; the projection as HF's
(vision width, text width) matrix).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ...errors import UnsupportedModelError
from ...ops import vision as ops
from ...ops.norm import rms_norm
from ..parts import siglip
from .gemma2 import GemmaConfig
from .gemma3 import Gemma3
from ..parts.mmproj_config import token_id, vision_fields
from ..parts.spec import Weight, tensor
from ..parts.vision_lm import VisionConfig, VisionLM

TEXT_DEFAULTS = dict(vocab_size=262_208, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                     num_attention_heads=8, num_key_value_heads=4, head_dim=256, query_pre_attn_scalar=256,
                     rms_norm_eps=1e-6, max_position_embeddings=131_072, sliding_window=4096,
                     hidden_activation="gelu_pytorch_tanh", rope_theta=1_000_000.0, rope_local_base_freq=10_000.0)
VISION_DEFAULTS = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                       image_size=224, patch_size=16, layer_norm_eps=1e-6, hidden_act="gelu_pytorch_tanh")
TOWER = "vision_tower"


@dataclass(frozen=True)
class Gemma3VLConfig(VisionConfig, GemmaConfig):
    patch_size: int = 14
    pool: int = 4  # patch vectors averaged per side into one image token


class Gemma3VL(VisionLM, Gemma3):
    supports_lora = False  # (adapters name model.language_model's projections: not laid out yet)
    name = "gemma3_vl"
    hf_model_types = ("gemma3",)
    hf_architectures = ("Gemma3ForConditionalGeneration",)
    gguf_architectures = ()  # (a text GGUF alone is a Gemma 3's; with its mmproj: config_from_mmproj)
    mmproj_projector = "gemma3"
    mmproj_text_architecture = "gemma3"
    config_class = Gemma3VLConfig
    # checkpoints name the parts three ways (the hub's, transformers 4.5x's, transformers 5's): read as one
    hf_renames = (("language_model.model.", "model."), ("model.language_model.", "model."),
                  ("language_model.lm_head.", "lm_head."), ("model.vision_tower.vision_model.", "vision_tower."),
                  ("vision_tower.vision_model.", "vision_tower."), ("model.vision_tower.", "vision_tower."),
                  ("model.multi_modal_projector.", "multi_modal_projector."))

    @classmethod
    def config_from_hf(cls, cfg: dict, where: str):
        text = {**TEXT_DEFAULTS, **(cfg.get("text_config") or {})}
        text.setdefault("tie_word_embeddings", cfg.get("tie_word_embeddings", True))
        text["eos_token_id"] = cfg.get("eos_token_id", text.get("eos_token_id"))
        text["_name_or_path"] = cfg.get("_name_or_path", "")
        vision = {**VISION_DEFAULTS, **(cfg.get("vision_config") or {})}
        if vision.get("vision_use_head"):
            raise UnsupportedModelError(f"{where}: a SigLIP tower with its pooling head is not supported")
        base = super().config_from_hf(text, where)
        side = int(vision["image_size"]) // int(vision["patch_size"])
        tokens = int(cfg.get("mm_tokens_per_image", 256))
        per_side = int(round(tokens ** 0.5))
        if per_side * per_side != tokens or side % per_side or int(vision["image_size"]) % int(vision["patch_size"]):
            raise UnsupportedModelError(f"{where}: mm_tokens_per_image {tokens} does not pool the tower's "
                                        f"{side} x {side} patches evenly")
        if vision["hidden_act"] not in ops.ACTIVATIONS:
            raise UnsupportedModelError(f"{where}: vision hidden_act {vision['hidden_act']!r} is not supported")
        tile = int(vision["image_size"])
        return dataclasses.replace(
            base, image_token_id=int(cfg.get("image_token_index", cfg.get("image_token_id", 262_144))),
            tile_size=(tile, tile), tokens_per_tile=tokens, vision_hidden=int(vision["hidden_size"]),
            vision_layers=int(vision["num_hidden_layers"]), vision_heads=int(vision["num_attention_heads"]),
            vision_intermediate=int(vision["intermediate_size"]), vision_eps=float(vision["layer_norm_eps"]),
            vision_activation=vision["hidden_act"], patch_size=int(vision["patch_size"]), pool=side // per_side,
            bidirectional_images=True)

    @classmethod
    def config_from_mmproj(cls, text, mm, where: str):
        base = cls.config_from_gguf(text, text.where)  # Gemma 3's reading, as a Gemma3VLConfig
        pool = int(mm.key("vision.projector.scale_factor", 4))  # clip.cpp's default: every Gemma 3 pools 4 x 4
        return dataclasses.replace(base, **vision_fields(mm, base.hidden_size, pool), pool=pool,
                                   image_token_id=token_id(text, "<image_soft_token>", where),
                                   bidirectional_images=True)

    @classmethod
    def vision_weights(cls, c: Gemma3VLConfig) -> dict[str, Weight]:
        dv, pre = c.vision_hidden, "multi_modal_projector"
        return {**siglip.tower_weights(c, TOWER),
                "mm_norm": Weight((dv,), (None,), tensor(f"{pre}.mm_soft_emb_norm.weight", (dv,), offset=1.0),
                                  tensor("mm.soft_emb_norm.weight", (dv,)), init="ones"),
                "mm_proj": Weight((dv, c.hidden_size), (None, None),
                                  tensor(f"{pre}.mm_input_projection_weight", (dv, c.hidden_size), matrix=False),
                                  tensor("mm.input_projection.weight", (dv, c.hidden_size), matrix=False))}

    @classmethod
    def vision_layer_weights(cls, c: Gemma3VLConfig, i: int) -> dict[str, Weight]:
        return siglip.block_weights(c, i, TOWER)

    def encode_images(self, pixels):
        c: Gemma3VLConfig = self.config
        g = self.vision.weights()
        h = siglip.encode(self, pixels)  # (n, side * side, Dv), patches row-major
        n, patches, dv = h.shape
        side = int(round(patches ** 0.5))
        t = side // c.pool
        pooled = h.reshape(n, t, c.pool, t, c.pool, dv).mean(axis=(2, 4)).reshape(n, t * t, dv)  # 2-D average pool
        out = ops.dense(rms_norm(pooled, g["mm_norm"], c.vision_eps), g["mm_proj"])  # (n, tokens_per_tile, D)
        return out.reshape(-1, out.shape[-1]).astype(self.dtype)
