"""Mistral 3 with images (Mistral Small 3.1 / 3.2, Magistral Small, Ministral 3): a Pixtral tower over images at
their own resolution, the Mistral 3 projector, a Mistral or Ministral 3 text model (plain 1-D rotary).

The tower: an image resized to fit `longest_edge` in whole 2 x 2 blocks of patches (multimodal/pixtral.py),
its patches embedded by a bias-free convolution (a matmul on flattened patches), RMSNorm (ln_pre), RMSNorm
blocks with gated MLPs and Pixtral's 2-D rotary q/k (ops/vision.pixtral_rope) attending to the whole image.
The projector reads block `vision_feature_layer`'s output (-1: the last): RMSNorm, the patch merger (each
2 x 2 block unfolded into one vector, projected back to the tower's width), a two-layer GELU MLP to the text
model's width. One image token per merged block, row by row; [IMG_BREAK] / [IMG_END] are plain text tokens.

HF: Mistral3ForConditionalGeneration (model_type "mistral3"): the text model under model.language_model. (or
language_model.model., the hub's older layout), the tower under (model.)vision_tower., the projector under
(model.)multi_modal_projector.; text_config's model_type "mistral" or "ministral3" (Ministral 3's layer reads
both: without llama_4_scaling_beta it is Mistral's).
llama.cpp: a `mistral3` text GGUF (or `llama`: Mistral Small 3.1 / 3.2 as the converter's --mistral-format and
its older versions write them) and an mmproj of projector type "pixtral" (tower q / k rows permuted for
llama.cpp's rotary, as its text models'). The converter writes no vision_feature_layer: llama.cpp runs every
tower block, as the released checkpoints' -1 does. [IMG_BREAK]'s embedding, which clip.cpp takes from the
mmproj (v.token_embd.img_break), is the text model's own here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache

import jax.numpy as jnp
import numpy as np

from ...errors import UnsupportedModelError
from ...ops import vision as ops
from ...ops.norm import rms_norm
from .ministral3 import Ministral3, Ministral3Config
from ..parts.mmproj_config import activation, token_id, tower_fields
from ..parts.siglip import mat, vec
from ..parts.spec import Weight, paired, tensor
from ..parts.vision_lm import VisionConfig, VisionLM

TOWER, PROJECTOR = "vision_tower", "multi_modal_projector"
TEXT_MODEL_TYPES = ("mistral", "ministral3")
# PixtralVisionConfig's defaults (what transformers fills in for keys a vision_config leaves out)
VISION_DEFAULTS = dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                       patch_size=16, hidden_act="gelu")
TOWER_EPS = 1e-5  # Pixtral's norms (fixed, not in the config)
ROPE_THETA = 10000.0  # the tower's rotary base: every Pixtral's, and fixed in clip.cpp (an mmproj does not say it)
# the HF name under the tower's block prefix -> the mmproj's under v.blk.<i> (the `gguf` package's MMPROJ map)
GGUF_BLOCK = {"attention_norm": "ln1", "ffn_norm": "ln2", "attention.q_proj": "attn_q", "attention.k_proj": "attn_k",
              "attention.v_proj": "attn_v", "attention.o_proj": "attn_out", "feed_forward.gate_proj": "ffn_gate",
              "feed_forward.up_proj": "ffn_up", "feed_forward.down_proj": "ffn_down"}


@dataclass(frozen=True)
class Mistral3VLConfig(VisionConfig, Ministral3Config):
    patch_size: int = 14
    merge_size: int = 2  # patches per side one image token folds
    vision_rope_theta: float = 10000.0
    tower_blocks: int = 0  # tower blocks the projector's features pass through (vision_feature_layer)
    projector_bias: bool = False
    projector_activation: str = "gelu"


class Mistral3(VisionLM, Ministral3):
    supports_lora = False  # (adapters name model.language_model's projections: not laid out yet)
    name = "mistral3"
    hf_architectures = ("Mistral3ForConditionalGeneration",)
    gguf_architectures = ()  # (`mistral3` GGUFs are Ministral 3's text model: ministral3.py)
    mmproj_projector = "pixtral"
    mmproj_text_architecture = "mistral3"
    mmproj_other_text_architectures = ("llama",)
    config_class = Mistral3VLConfig
    hf_renames = (("language_model.model.", "model."), ("model.language_model.", "model."),
                  ("language_model.lm_head.", "lm_head."), ("model.vision_tower.", f"{TOWER}."),
                  ("model.multi_modal_projector.", f"{PROJECTOR}."))

    @classmethod
    def config_from_hf(cls, cfg: dict, where: str):
        text = dict(cfg.get("text_config") or {})
        if text.get("model_type", "mistral") not in TEXT_MODEL_TYPES:
            raise UnsupportedModelError(f"{where}: a Mistral 3 text model of type {text.get('model_type')!r} is not "
                                        f"supported (supported: {', '.join(TEXT_MODEL_TYPES)})")
        # transformers 5 ties by the top-level flag (and unties where the checkpoint holds both tensors); with the
        # flag at neither level, untied: a checkpoint without lm_head.weight then stops at load, naming it
        text["tie_word_embeddings"] = cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
        text["eos_token_id"] = cfg.get("eos_token_id", text.get("eos_token_id"))
        text["_name_or_path"] = cfg.get("_name_or_path", "")
        vision = {**VISION_DEFAULTS, **(cfg.get("vision_config") or {})}
        base = super().config_from_hf(text, where)
        layers, heads, width = (int(vision[k]) for k in ("num_hidden_layers", "num_attention_heads", "hidden_size"))
        _check_heads(width, heads, where)
        feature = cfg.get("vision_feature_layer", -1)
        feature = feature[0] if isinstance(feature, list) and len(feature) == 1 else feature
        if not isinstance(feature, int) or not -layers - 1 <= feature <= layers:
            raise UnsupportedModelError(f"{where}: vision_feature_layer {feature!r} is not supported (one layer)")
        for key, act in (("vision hidden_act", vision["hidden_act"]), ("projector_hidden_act",
                                                                         cfg.get("projector_hidden_act", "gelu"))):
            if act not in ops.ACTIVATIONS:
                raise UnsupportedModelError(f"{where}: {key} {act!r} is not supported")
        rope = dict(vision.get("rope_parameters") or {})
        return dataclasses.replace(
            base, image_token_id=int(cfg.get("image_token_index", cfg.get("image_token_id", 10))),
            variable_images=True, vision_hidden=width, vision_layers=layers, vision_heads=heads,
            vision_intermediate=int(vision["intermediate_size"]), vision_eps=TOWER_EPS,
            vision_activation=vision["hidden_act"], patch_size=int(vision["patch_size"]),
            merge_size=int(cfg.get("spatial_merge_size", 2)),
            vision_rope_theta=float(rope.get("rope_theta", vision.get("rope_theta", ROPE_THETA))),
            tower_blocks=feature % (layers + 1),  # hidden_states[0] is the input of block 0
            projector_bias=bool(cfg.get("multimodal_projector_bias", False)),
            projector_activation=cfg.get("projector_hidden_act", "gelu"))

    @classmethod
    def ignores_tensor(cls, name: str, config) -> bool:
        # clip.cpp's copy of [IMG_BREAK]'s embedding row (mmproj files llama-server loads hold it: clip.cpp
        # requires it): the text model's own embeds that token here
        return super().ignores_tensor(name, config) or name == "v.token_embd.img_break"

    @classmethod
    def config_from_mmproj(cls, text, mm, where: str):
        base = cls.config_from_gguf(text, text.where)  # Ministral 3's reading (of a `llama` file too)
        merge = int(mm.key("vision.spatial_merge_size", 1))  # (clip.cpp's default: Pixtral 12B merges none)
        if merge < 2 or not mm.has("mm.patch_merger.weight"):
            raise UnsupportedModelError(f"{mm.where}: a pixtral mmproj without the patch merger "
                                        "(clip.vision.spatial_merge_size, mm.patch_merger.weight) is Pixtral 12B's, "
                                        "which is not supported (Mistral 3's tower only)")
        fields = tower_fields(mm, base.hidden_size)
        _check_heads(fields["vision_hidden"], fields["vision_heads"], mm.where)
        for token in ("[IMG_BREAK]", "[IMG_END]"):  # the processor's row and image ends
            token_id(text, token, where)
        return dataclasses.replace(
            base, **fields, image_token_id=token_id(text, "[IMG]", where), variable_images=True,
            vision_activation=activation(mm), patch_size=int(mm.key("vision.patch_size", required=True)),
            merge_size=merge, vision_rope_theta=ROPE_THETA,
            tower_blocks=fields["vision_layers"],  # (no vision_feature_layer in the file: the last, as llama.cpp)
            projector_bias=mm.has("mm.1.bias"), projector_activation="gelu")  # (clip.cpp's projector: always GELU)

    @classmethod
    def mmproj_preprocessor(cls, mm) -> dict:
        # the converter's image_size is the tower's vision_config.image_size, which Mistral 3's processors take as
        # their longest edge (llama.cpp instead fits images within 8 to 1024 image tokens)
        return {"size": {"longest_edge": int(mm.key("vision.image_size", required=True))}}

    @classmethod
    def vision_weights(cls, c: Mistral3VLConfig) -> dict[str, Weight]:
        dv, d, p, m = c.vision_hidden, c.hidden_size, c.patch_size, c.merge_size
        out = {"patch_w": Weight((dv, 3, p, p), (None,) * 4,
                                 *paired(f"{TOWER}.patch_conv.weight", "v.patch_embd.weight", (dv, 3, p, p),
                                         matrix=False)),
               "ln_pre": vec(f"{TOWER}.ln_pre.weight", dv, init="ones", gguf="v.pre_ln.weight"),
               "mm_norm": vec(f"{PROJECTOR}.norm.weight", dv, init="ones", gguf="mm.input_norm.weight"),
               "merge": mat(f"{PROJECTOR}.patch_merger.merging_layer.weight", dv, dv * m * m,
                            gguf="mm.patch_merger.weight"),
               "fc1": mat(f"{PROJECTOR}.linear_1.weight", d, dv, gguf="mm.1.weight"),
               "fc2": mat(f"{PROJECTOR}.linear_2.weight", d, d, gguf="mm.2.weight")}
        if c.projector_bias:
            out.update(fc1_b=vec(f"{PROJECTOR}.linear_1.bias", d, gguf="mm.1.bias"),
                       fc2_b=vec(f"{PROJECTOR}.linear_2.bias", d, gguf="mm.2.bias"))
        return out

    @classmethod
    def vision_layer_weights(cls, c: Mistral3VLConfig, i: int) -> dict[str, Weight]:
        d, f, pre = c.vision_hidden, c.vision_intermediate, f"{TOWER}.transformer.layers.{i}"

        def at(part: str) -> dict:  # the HF name and, as `gguf`, the mmproj's
            return dict(name=f"{pre}.{part}.weight", gguf=f"v.blk.{i}.{GGUF_BLOCK[part]}.weight")

        out = {"ln1": vec(n=d, init="ones", **at("attention_norm")), "ln2": vec(n=d, init="ones", **at("ffn_norm"))}
        for x in "qkvo":
            names = at(f"attention.{x}_proj")
            # the converter stores each head's q / k rows as interleaved pairs (llama.cpp's rotary), as for text
            permuted = dict(permuted_heads=c.vision_heads) if x in "qk" else {}
            out[f"w{x}"] = Weight((d, d), (None, None), tensor(names["name"], (d, d)),
                                  tensor(names["gguf"], (d, d), **permuted))
        for name, n_out, n_in in (("gate", f, d), ("up", f, d), ("down", d, f)):
            out[name] = mat(n_out=n_out, n_in=n_in, **at(f"feed_forward.{name}_proj"))
        return out

    def encode_images(self, pixels):
        """uint8 (1, H, W, C) one image -> (H*W / (p*m)^2, D) embeddings, merged blocks row-major (the order of
        its [IMG] tokens)."""
        c: Mistral3VLConfig = self.config
        g = self.vision.weights()
        rows, cols = pixels.shape[1] // c.patch_size, pixels.shape[2] // c.patch_size
        x = ops.normalize_pixels(pixels, c.image_mean, c.image_std, c.rescale_factor)  # (1, C, H, W)
        h = rms_norm(ops.patch_embed(x, g["patch_w"], None)[0], g["ln_pre"], TOWER_EPS)  # (T, Dv) row-major
        cos, sin = (jnp.asarray(t) for t in _rope_tables(rows, cols, c.vision_hidden // c.vision_heads,
                                                         c.vision_rope_theta))
        whole = np.arange(rows * cols)[None]  # one image: every patch sees every other
        for i in range(c.tower_blocks):
            h = ops.rms_block(h, self.vision_layers[i].weights(), c.vision_heads, c.vision_eps, c.vision_activation,
                              cos, sin, whole)
        x = ops.unfold_blocks(rms_norm(h, g["mm_norm"], c.rms_norm_eps), rows, cols, c.merge_size)  # (tokens, Dv*m*m)
        x = ops.ACTIVATIONS[c.projector_activation](ops.dense(ops.dense(x, g["merge"]), g["fc1"], g.get("fc1_b")))
        return ops.dense(x, g["fc2"], g.get("fc2_b")).astype(self.dtype)  # (tokens, D)


def _check_heads(width: int, heads: int, where: str) -> None:
    if width % heads or (width // heads) % 4:
        raise UnsupportedModelError(f"{where}: the tower's head size {width / heads} is not a multiple of 4 "
                                    "(a quarter of it turns with each image axis)")


@lru_cache(maxsize=32)
def _rope_tables(rows: int, cols: int, head_dim: int, theta: float):
    """Static per image size: the patches' (row-major) rotary tables cos, sin (T, hd/2)."""
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    return ops.pixtral_rope(r.reshape(-1), c.reshape(-1), head_dim, theta)
