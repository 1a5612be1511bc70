"""What a vision-language family adds to its language model (a mixin for CausalLM subclasses):
a vision tower's weights beside the decoder's, and `encode_images`, the program the engine runs on
an image's tiles before their embeddings enter the prompt at its placeholder positions.

A family declares:
    vision_weights(config)        the tower's global weights (patch embedding, final norm, projector)
    vision_layer_weights(config, i)  encoder block i's weights
    encode_images(pixels)         uint8 (n, H, W, C) tiles -> (n * tokens_per_tile, D * feature_levels) embeddings
and its config (a VisionConfig) says the tile shape and how many prompt tokens each tile takes (or, with
`variable_images`, that each image is encoded alone at its own size: (1, H, W, C) -> (its tokens, D)).
A family llama.cpp serves as a pair (text GGUF + mmproj GGUF, loading/mmproj.py) also names the
mmproj's `clip.projector_type` and the text GGUF's architecture, and reads its config from both.
Held as `self.vision` and `self.vision_layers[i]` ("vision.<name>", "vision_layers.<i>.<name>"),
unquantized and replicated (sharding axes None): the tower is small beside the language model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from flax import nnx

from ...config import ModelConfig
from .base import LayerWeights
from .spec import Weight


@dataclass(frozen=True)
class VisionConfig(ModelConfig):
    """A language model's config plus its vision tower's (families add their own fields)."""

    image_token_id: int = -1  # the placeholder token each image embedding replaces
    tile_size: tuple[int, int] = (0, 0)  # (H, W) pixels of one tile the tower encodes
    tokens_per_tile: int = 0  # prompt tokens (embeddings) one tile becomes
    vision_hidden: int = 0
    vision_layers: int = 0
    vision_heads: int = 0
    vision_intermediate: int = 0
    vision_eps: float = 1e-6
    vision_activation: str = "gelu_pytorch_tanh"
    # images keep their own size (Qwen2.5-VL): an image's MediaItem holds its one resized image (1, H, W, C), the
    # vision program is compiled per image size and encodes one image a call (its token count: the family's);
    # tile_size and tokens_per_tile are unused
    variable_images: bool = False
    # embeddings per image token, each the text model's width: the first replaces the token's embedding, the
    # others (Qwen3-VL's deepstack features) are added after the first feature_levels - 1 decoder layers
    feature_levels: int = 1
    # an image's tokens attend to the whole image (Gemma 3), not only to those before them: the engine
    # computes each image in one step and widens its tokens' attention (kv/paged.StepLayout.chunk_limit)
    bidirectional_images: bool = False
    # how tiles' uint8 pixels become the tower's input (x * rescale_factor - mean) / std, per channel:
    # the image processor's (preprocessor_config.json, read at load: loading/__init__.py)
    image_mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    image_std: tuple[float, ...] = (0.5, 0.5, 0.5)
    rescale_factor: float = 1 / 255


class VisionLM:
    """Mixin: put it before the language family in the bases (class Idefics3(VisionLM, Llama))."""

    accepts_images: ClassVar[bool] = True
    mmproj_projector: ClassVar[str | None] = None  # llama.cpp's clip.projector_type of this family's mmproj
    mmproj_text_architecture: ClassVar[str | None] = None  # general.architecture of its text GGUF
    # those that other conversions of the same text model write, taken too (Mistral 3's `llama`)
    mmproj_other_text_architectures: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def config_from_mmproj(cls, text, mm, where: str):
        """The config of the pair: text (the text GGUF's GGUFMeta), mm (the mmproj's)."""
        raise NotImplementedError

    @classmethod
    def mmproj_preprocessor(cls, mm) -> dict:
        """What the mmproj says of the image processor, in preprocessor_config.json's schema (the rest
        defaults to the config's tile size and tokens per tile)."""
        return {}

    @classmethod
    def vision_weights(cls, config) -> dict[str, Weight]:
        raise NotImplementedError

    @classmethod
    def vision_layer_weights(cls, config, i: int) -> dict[str, Weight]:
        raise NotImplementedError

    @classmethod
    def weight_specs(cls, config) -> dict[str, Weight]:
        specs = dict(super().weight_specs(config))
        specs.update({f"vision.{k}": v for k, v in cls.vision_weights(config).items()})
        for i in range(config.vision_layers):
            specs.update({f"vision_layers.{i}.{k}": v for k, v in cls.vision_layer_weights(config, i).items()})
        return specs

    def __init__(self, config, *, dtype=None, param_dtype=None, rngs: nnx.Rngs | None = None):
        rngs = rngs if rngs is not None else nnx.Rngs(0)
        super().__init__(config, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        # the tower's weights take the model's dtype (bfloat16 ones multiply in bfloat16: ops/vision.dense)
        self.vision = LayerWeights(self.vision_weights(config), self.param_dtype, rngs)
        self.vision_layers = nnx.List([LayerWeights(self.vision_layer_weights(config, i), self.param_dtype, rngs)
                                       for i in range(config.vision_layers)])

    def named_weights(self):
        out = super().named_weights()
        out.update({f"vision.{k}": v for k, v in self.vision.weights().items()})
        for i, layer in enumerate(self.vision_layers):
            out.update({f"vision_layers.{i}.{k}": v for k, v in layer.weights().items()})
        return out

    def encode_images(self, pixels):
        """uint8 (n, H, W, C) tiles -> (n * tokens_per_tile, D) embeddings in the activation dtype."""
        raise NotImplementedError


def accepts_images(model) -> bool:
    """Whether `model` (or its family class) takes images."""
    return bool(getattr(model, "accepts_images", False))
