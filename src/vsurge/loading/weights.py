"""Turn per-tensor checkpoints (HF names, (out, in) layout) into the model's weights.

Both the safetensors and the GGUF loaders expose a `TensorSource`: HF tensor
names in, float numpy arrays out. This module checks every shape against the
config, transposes to (in, out), fuses Q/K/V and gate/up and builds the nnx
module, so the two loaders share all of that.
"""

from __future__ import annotations

from typing import Callable, Protocol

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from ..config import ModelConfig
from ..errors import ModelLoadError
from ..models.llama import LlamaForCausalLM, weight_shapes

# Keys some checkpoints carry that the model derives itself.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class TensorSource(Protocol):
    def names(self) -> set[str]: ...

    def get(self, name: str) -> np.ndarray: ...

    def where(self, name: str) -> str:
        """The file a tensor lives in, for error messages."""
        ...


def _layer_key(i: int, part: str) -> str:
    return f"model.layers.{i}.{part}"


def _expect(source: TensorSource, name: str, shape: tuple[int, ...]) -> np.ndarray:
    if name not in source.names():
        raise ModelLoadError(f"tensor {name!r} is missing from {source.where(name)}")
    arr = source.get(name)
    if tuple(arr.shape) != tuple(shape):
        raise ModelLoadError(
            f"tensor {name!r} in {source.where(name)} has shape {tuple(arr.shape)}, "
            f"but the config implies {tuple(shape)}"
        )
    return arr


def _layer_parts(c: ModelConfig) -> dict[str, list[tuple[str, tuple[int, ...]]]]:
    """layer weight name -> HF per-layer tensors concatenated into it (HF shapes)."""
    D, F, Q, K, hd = c.hidden_size, c.intermediate_size, c.q_size, c.kv_size, c.head_dim
    parts = {
        "attn_norm": [("input_layernorm.weight", (D,))],
        "wqkv": [("self_attn.q_proj.weight", (Q, D)), ("self_attn.k_proj.weight", (K, D)),
                 ("self_attn.v_proj.weight", (K, D))],
        "wo": [("self_attn.o_proj.weight", (D, Q))],
        "mlp_norm": [("post_attention_layernorm.weight", (D,))],
        "w_gate_up": [("mlp.gate_proj.weight", (F, D)), ("mlp.up_proj.weight", (F, D))],
        "w_down": [("mlp.down_proj.weight", (D, F))],
    }
    if c.qkv_bias:
        parts["bqkv"] = [("self_attn.q_proj.bias", (Q,)), ("self_attn.k_proj.bias", (K,)),
                         ("self_attn.v_proj.bias", (K,))]
    if c.o_bias:
        parts["bo"] = [("self_attn.o_proj.bias", (D,))]
    if c.qk_norm:
        parts["q_norm"] = [("self_attn.q_norm.weight", (hd,))]
        parts["k_norm"] = [("self_attn.k_norm.weight", (hd,))]
    return parts


def numpy_dtype(dtype) -> np.dtype:
    dtype = jnp.dtype(dtype)
    return np.dtype(ml_dtypes.bfloat16) if dtype == jnp.bfloat16 else np.dtype(dtype)


def assemble_weights(
    config: ModelConfig, source: TensorSource, dtype, progress: bool = True
) -> dict[str, np.ndarray]:
    """Read and check every tensor. Returns model weight name -> array of the model's shape."""
    np_dtype = numpy_dtype(dtype)
    shapes = weight_shapes(config)
    c = config
    out: dict[str, np.ndarray] = {}
    used: set[str] = set()

    def take(name: str, shape) -> np.ndarray:
        used.add(name)
        return _expect(source, name, shape)

    out["embed"] = take("model.embed_tokens.weight", (c.vocab_size, c.hidden_size)).astype(np_dtype)
    out["final_norm"] = take("model.norm.weight", (c.hidden_size,)).astype(np_dtype)
    if "lm_head" in shapes:
        out["lm_head"] = take("lm_head.weight", (c.vocab_size, c.hidden_size)).T.astype(np_dtype)
    elif "lm_head.weight" in source.names():
        used.add("lm_head.weight")  # tied: some exports still write a copy

    parts = _layer_parts(c)
    for i in tqdm(range(c.num_layers), desc="Loading weights", unit="layer", disable=not progress):
        for name, pieces in parts.items():
            arrays = [take(_layer_key(i, p), s) for p, s in pieces]
            joined = np.concatenate(arrays, axis=0) if len(arrays) > 1 else arrays[0]
            # (out, in) -> (in, out), contiguous so the device copy is one memcpy
            out[f"layers.{i}.{name}"] = np.ascontiguousarray(joined.T if joined.ndim == 2 else joined,
                                                              dtype=np_dtype)

    unknown = sorted(n for n in source.names() - used if not n.endswith(IGNORED_SUFFIXES))
    if unknown:
        shown = ", ".join(unknown[:5]) + (" ..." if len(unknown) > 5 else "")
        raise ModelLoadError(
            f"{len(unknown)} tensor(s) in {source.where(unknown[0])} are not used by the "
            f"{c.architecture} architecture: {shown}"
        )
    return out


def build_model(config: ModelConfig, weights: dict[str, np.ndarray], dtype, compute_dtype=None) -> LlamaForCausalLM:
    """Create the nnx module without random init, then place the given weights on the device.

    dtype: the weights'; compute_dtype: the activations' (default: the weights')."""
    model = nnx.eval_shape(lambda: LlamaForCausalLM(config, dtype=compute_dtype or dtype, param_dtype=dtype))
    expected = weight_shapes(config)
    if set(expected) != set(weights):
        raise ModelLoadError(f"weights {sorted(set(expected) ^ set(weights))} do not match the model")
    for name, value in weights.items():
        holder: Callable = model
        *parents, leaf = name.split(".")
        for p in parents:
            holder = holder[int(p)] if p.isdigit() else getattr(holder, p)
        getattr(holder, leaf).set_value(jax.device_put(jnp.asarray(value, dtype=dtype)))
    return model
