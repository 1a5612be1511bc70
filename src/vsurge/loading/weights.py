"""Turn per-tensor checkpoints (HF names, (out, in) layout) into the model's weights.

Both the safetensors and the GGUF loaders expose a `TensorSource`: HF tensor
names in, float numpy arrays out, whole or a range of rows/columns. This module
checks every shape against the config, then `WeightReader` builds any slice of
any model weight (transposed to (in, out), Q/K/V and gate/up fused in the
layouts of models/fused.py) from just the source rows that slice needs. The
single-device path reads whole weights; the sharded path (sharded.py) reads one
slice per device.
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
from ..models.fused import fuse_qkv_rows, interleave_gate_up_rows, qkv_group_width
from ..models.llama import LlamaForCausalLM, weight_shapes

# Keys some checkpoints carry that the model derives itself.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)

Range = tuple[int, int]  # [start, stop)


class TensorSource(Protocol):
    def names(self) -> set[str]: ...

    def shape(self, name: str) -> tuple[int, ...]: ...

    def read(self, name: str, rows: Range | None = None, cols: Range | None = None) -> np.ndarray:
        """Rows/columns [start, stop) of a tensor in HF (out, in) order; None = all."""
        ...

    def where(self, name: str) -> str:
        """The file a tensor lives in, for error messages."""
        ...


def _layer_key(i: int, part: str) -> str:
    return f"model.layers.{i}.{part}"


def _layer_parts(c: ModelConfig) -> dict[str, list[tuple[str, tuple[int, ...]]]]:
    """layer weight name -> HF per-layer tensors it is built from (HF shapes)."""
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


def _global_parts(c: ModelConfig) -> dict[str, tuple[str, tuple[int, ...]]]:
    parts = {"embed": ("model.embed_tokens.weight", (c.vocab_size, c.hidden_size)),
             "final_norm": ("model.norm.weight", (c.hidden_size,))}
    if not c.tie_word_embeddings:
        parts["lm_head"] = ("lm_head.weight", (c.vocab_size, c.hidden_size))
    return parts


def check_source(config: ModelConfig, source: TensorSource) -> None:
    """Every tensor the config needs is there with its shape, and nothing else is."""
    expected = list(_global_parts(config).values())
    for i in range(config.num_layers):
        expected += [(_layer_key(i, p), s) for pieces in _layer_parts(config).values() for p, s in pieces]
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
        used.add("lm_head.weight")  # tied: some exports still write a copy
    unknown = sorted(n for n in names - used if not n.endswith(IGNORED_SUFFIXES))
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

    `checkpoint` is the config the file was written for; `config` the model's, which may
    have its KV heads replicated `kv_replicas` times for tensor parallelism (fused.py)."""

    def __init__(self, checkpoint: ModelConfig, source: TensorSource, dtype, config: ModelConfig | None = None):
        self.checkpoint = checkpoint
        self.config = config or checkpoint
        self.kv_replicas = self.config.num_kv_heads // checkpoint.num_kv_heads
        self.source = source
        self.np_dtype = numpy_dtype(dtype)
        self.shapes = weight_shapes(self.config)
        self._parts = _layer_parts(checkpoint)

    def read(self, name: str, index: tuple = ()) -> np.ndarray:
        """Weight `name` (model layout) at `index` (a tuple of contiguous slices; () = all)."""
        shape = self.shapes[name]
        index = tuple(index) + (None,) * (len(shape) - len(index))
        spans = [_span(i, n) for i, n in zip(index, shape)]
        return np.ascontiguousarray(self._build(name, spans), dtype=self.np_dtype)

    def _hf(self, name: str, rows: Range | None, cols: Range | None = None) -> np.ndarray:
        return self.source.read(name, rows, cols)

    def _build(self, name: str, spans: list[Range]) -> np.ndarray:
        if name in ("embed", "final_norm"):
            return self._hf(_global_parts(self.checkpoint)[name][0], *spans)
        if name == "lm_head":  # HF (V, D) -> (D, V)
            return self._hf("lm_head.weight", spans[1], spans[0]).T
        _, layer, kind = name.split(".")
        i = int(layer)
        pieces = [_layer_key(i, p) for p, _ in self._parts[kind]]
        if kind == "wqkv":
            return self._qkv(pieces, spans[1], spans[0]).T
        if kind == "bqkv":
            return self._qkv(pieces, spans[0], None)
        if kind == "w_gate_up":
            start, stop = spans[1]
            f0, f1 = start // 2, -(-stop // 2)
            pairs = interleave_gate_up_rows(*(self._hf(p, (f0, f1), spans[0]) for p in pieces))
            return pairs[start - 2 * f0:stop - 2 * f0].T
        if kind in ("wo", "w_down"):  # HF (out, in) -> (in, out)
            return self._hf(pieces[0], spans[1], spans[0]).T
        return self._hf(pieces[0], spans[0])  # norms and the o bias: 1-D, as stored

    def _qkv(self, pieces: list[str], cols: Range, rows: Range | None) -> np.ndarray:
        """Fused q/k/v rows (HF orientation) for fused columns [start, stop): whole KV groups are
        read (query rows of the groups, the KV rows they share) and cut to the range."""
        c, hd, r = self.config, self.config.head_dim, self.kv_replicas
        width, heads = qkv_group_width(c), c.num_heads // c.num_kv_heads
        start, stop = cols
        g0, g1 = start // width, -(-stop // width)
        q = self._hf(pieces[0], (g0 * heads * hd, g1 * heads * hd), rows)
        kv_rows = ((g0 // r) * hd, ((g1 - 1) // r + 1) * hd)
        k, v = self._hf(pieces[1], kv_rows, rows), self._hf(pieces[2], kv_rows, rows)
        fused = fuse_qkv_rows(q, k, v, self.checkpoint, first_group=g0, kv_replicas=r)
        return fused[start - g0 * width:stop - g0 * width]


def assemble_weights(
    config: ModelConfig, source: TensorSource, dtype, progress: bool = True
) -> dict[str, np.ndarray]:
    """Read and check every tensor. Returns model weight name -> array of the model's shape."""
    check_source(config, source)
    reader = WeightReader(config, source, dtype)
    names = list(weight_shapes(config))
    layers = {n for n in names if n.startswith("layers.")}
    out = {name: reader.read(name) for name in names if name not in layers}
    for i in tqdm(range(config.num_layers), desc="Loading weights", unit="layer", disable=not progress):
        prefix = f"layers.{i}."
        out.update({name: reader.read(name) for name in names if name.startswith(prefix)})
    return out


def build_model(config: ModelConfig, weights: dict[str, np.ndarray], dtype, compute_dtype=None) -> LlamaForCausalLM:
    """Create the nnx module without random init, then place the given weights on the device.

    dtype: the weights'; compute_dtype: the activations' (default: the weights').
    weights: name -> numpy array, or an already placed jax.Array (sharded loading)."""
    model = nnx.eval_shape(lambda: LlamaForCausalLM(config, dtype=compute_dtype or dtype, param_dtype=dtype))
    expected = weight_shapes(config)
    if set(expected) != set(weights):
        raise ModelLoadError(f"weights {sorted(set(expected) ^ set(weights))} do not match the model")
    for name, value in weights.items():
        holder: Callable = model
        *parents, leaf = name.split(".")
        for p in parents:
            holder = holder[int(p)] if p.isdigit() else getattr(holder, p)
        if not isinstance(value, jax.Array):
            value = jax.device_put(jnp.asarray(value, dtype=dtype))
        getattr(holder, leaf).set_value(value)
    return model
