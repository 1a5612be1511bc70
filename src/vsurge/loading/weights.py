"""Turn a checkpoint's tensors into the model's weights, by the family's declarations.

Both the safetensors and the GGUF loaders expose a `TensorSource` (models/parts/spec.py):
stored tensor names in, float numpy arrays out, whole or a range per axis. Each
model weight declares a recipe per format (models/families/<family>.py); this module
checks every stored tensor against the recipes, then `WeightReader` builds any
slice of any weight from just the stored rows that slice needs. The
single-device path reads whole weights; the sharded path (sharded.py) reads one
slice per device. Nothing here knows a family's weight names.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from ..config import ModelConfig
from ..errors import ModelLoadError
from ..models.parts.spec import FusedQKV, Range, TensorSource
from ..ops.quantized import is_quantized
from .gguf_blocks import keep_blocks

FORMATS = ("hf", "gguf")


def recipes(family, config: ModelConfig, fmt: str) -> dict:
    """Weight name -> its recipe in format `fmt` ("hf" or "gguf")."""
    out = {}
    for name, spec in family.weight_specs(config).items():
        recipe = getattr(spec, fmt)
        if recipe is None:
            raise ModelLoadError(f"the {config.architecture} family has no {fmt.upper()} form of weight {name!r}")
        out[name] = recipe
    return out


def check_source(family, config: ModelConfig, source: TensorSource, fmt: str) -> None:
    """Every tensor the config needs is there with its shape, and nothing else is."""
    expected = [t for recipe in recipes(family, config, fmt).values() for t in recipe.tensors()]
    names = source.names()
    for name, shape in expected:
        if name not in names:
            raise ModelLoadError(f"tensor {name!r} is missing from {source.where(name)}")
        if tuple(source.shape(name)) != tuple(shape):
            raise ModelLoadError(
                f"tensor {name!r} in {source.where(name)} has shape {tuple(source.shape(name))}, "
                f"but the config implies {tuple(shape)}"
            )
    used = {name for name, _ in expected}
    if config.tie_word_embeddings:
        used |= {"lm_head.weight", "output.weight"}  # tied: some exports still write a copy
    unknown = sorted(n for n in names - used if not family.ignores_tensor(n, config))
    if unknown:
        shown = ", ".join(unknown[:5]) + (" ..." if len(unknown) > 5 else "")
        raise ModelLoadError(
            f"{len(unknown)} tensor(s) in {source.where(unknown[0])} are not used by the "
            f"{config.architecture} architecture: {shown}"
        )


def numpy_dtype(dtype) -> np.dtype:
    dtype = jnp.dtype(dtype)
    return np.dtype(ml_dtypes.bfloat16) if dtype == jnp.bfloat16 else np.dtype(dtype)


def _span(index, size: int) -> Range:
    """A slice (or None) of an axis of `size` -> [start, stop)."""
    if index is None:
        return 0, size
    start, stop, step = index.indices(size)
    if step != 1:
        raise ValueError(f"weights are read in contiguous ranges, got step {step}")
    return start, stop


class WeightReader:
    """Builds any slice of any model weight from a checkpoint, reading only the rows it needs.

    `checkpoint` is the config the file was written for; `config` the model's, which may have
    its KV heads replicated for tensor parallelism (models/parts/fused.py)."""

    def __init__(self, family, checkpoint: ModelConfig, source: TensorSource, dtype, fmt: str,
                 config: ModelConfig | None = None, stack_dtype=None):
        self.config = config or checkpoint
        self.kv_replicas = self.config.num_kv_heads // max(1, checkpoint.num_kv_heads)
        self.source = source
        self.np_dtype = numpy_dtype(dtype)
        # weights sliced by index (expert stacks): their own dtype where given (loading/__init__.py)
        self.stack_dtype = numpy_dtype(stack_dtype) if stack_dtype is not None else self.np_dtype
        self.specs = family.weight_specs(self.config)
        self.recipes = recipes(family, checkpoint, fmt)

    def read(self, name: str, index: tuple = ()) -> np.ndarray:
        """Weight `name` (model layout) at `index` (a tuple of contiguous slices; () = all)."""
        spec = self.specs[name]
        index = tuple(index) + (None,) * (len(spec.shape) - len(index))
        spans = [_span(i, n) for i, n in zip(index, spec.shape)]
        array = self.recipes[name].read(self.source, spans, self.replicas(name))
        return np.ascontiguousarray(array, dtype=self.stack_dtype if spec.indexed else self.np_dtype)

    def replicas(self, name: str) -> int:
        """How many copies of each stored KV head weight `name` holds: 1 unless its last axis is fused qkv
        groups, then what its width implies (layers may differ in KV heads: Gemma 4), else the model's."""
        spec, recipe = self.specs[name], self.recipes[name]
        if not spec.kv_groups:
            return 1
        return recipe.replicas_for(spec.shape[-1]) if isinstance(recipe, FusedQKV) else self.kv_replicas


def assemble_weights(family, config: ModelConfig, source: TensorSource, dtype, fmt: str,
                     progress: bool = True, blocks: bool = False, stack_dtype=None) -> dict[str, np.ndarray]:
    """Read and check every tensor. Returns model weight name -> array of the model's shape.
    blocks: hold the weights that can stay in the file's block formats so (loading/gguf_blocks.py);
    stack_dtype: the expert stacks' dtype, where not `dtype`."""
    check_source(family, config, source, fmt)
    reader = WeightReader(family, config, source, dtype, fmt, stack_dtype=stack_dtype)
    held = keep_blocks(reader) if blocks else {}
    names = [n for n in reader.specs if n not in held]
    layers = {n for n in names if n.startswith("layers.")}
    out = {name: reader.read(name) for name in names if name not in layers}
    source.release()  # each weight is read into its own array: the mapped file need not stay resident
    for i in tqdm(range(config.num_layers), desc="Loading weights", unit="layer", disable=not progress):
        prefix = f"layers.{i}."
        out.update({name: reader.read(name) for name in names if name.startswith(prefix)})
        source.release()
    return {**out, **held}


def build_model(family, config: ModelConfig, weights: dict[str, np.ndarray], dtype, compute_dtype=None,
                stack_dtype=None, quantizer=None):
    """Create the nnx module without random init, then place the given weights on the device.

    dtype: the weights'; compute_dtype: the activations' (default: the weights'); stack_dtype: the
    expert stacks', where not `dtype`; quantizer: ops/linear.quantize_int8 / quantize_fp8, applied to each
    layer matrix that quantize() would quantize as it is placed (its scale beside it as NAME_scale), so the
    float model never exists whole on the device (an 8B checkpoint as int8 on a 16 GB chip); the head is
    left to CausalLM.quantize.
    weights: name -> numpy array, or an already placed jax.Array (sharded loading)."""
    model = nnx.eval_shape(lambda: family(config, dtype=compute_dtype or dtype, param_dtype=dtype))
    expected = family.weight_specs(config)
    if stack_dtype is not None and any(spec.indexed for spec in expected.values()):
        model.stack_dtype = jnp.dtype(stack_dtype)
    if set(expected) != set(weights):
        raise ModelLoadError(f"weights {sorted(set(expected) ^ set(weights))} do not match the model")
    for name, value in weights.items():
        holder: Callable = model
        *parents, leaf = name.split(".")
        for p in parents:
            holder = holder[int(p)] if p.isdigit() else getattr(holder, p)
        if is_quantized(value):
            value = jax.device_put(value)
        elif not isinstance(value, jax.Array):
            value = jax.device_put(jnp.asarray(value, dtype=stack_dtype if expected[name].indexed and stack_dtype
                                               else dtype))
        if quantizer is not None and name.startswith("layers.") and expected[name].quantize \
                and not expected[name].indexed:
            value, scale = quantizer(value)
            setattr(holder, leaf + "_scale", nnx.Param(scale))
        getattr(holder, leaf).set_value(value)
    return model
