"""The contract every model family meets, and the decoder they share (a flax.nnx module).

A family is one file, models/families/<family>.py, with a subclass of `CausalLM` that declares:

    config_class                 its ModelConfig subclass (config.py): the family's own fields
    hf_model_types               HF `model_type`s it runs (default: its `name`; `hf_architectures` is informative)
    gguf_architectures           GGUF `general.architecture`s it runs
    config_from_hf(cfg, where)   HF config.json dict -> config
    config_from_gguf(meta, where)  GGUF metadata (models/parts/config_io.GGUFMeta) -> config
    layer_weights(config, i)     the weights of layer i: shape, logical axes, HF and GGUF recipes
    layer(i, x, w, cache, ctx)   layer i's forward pass

and may override `global_weights` (embedding, final norm, head), `embed_scale`,
`scale_logits` and the config's per-layer methods (attention_spec, layer_rope,
kv_layout). The engine calls only `embed_tokens`, `decode_layers` and `logits`;
loaders, quantization and sharding read the declarations (models/parts/spec.py).

Each decoder layer holds its own weights and the forward pass is a Python loop
over the layers (unrolled in the compiled program). XLA:CPU feeds a layer's own
arrays straight into its dots, whereas a `lax.scan` over stacked weights copies
every layer's slice before the dot (docs/performance.md); a KV cache keeps one
array per layer for the same reason.

Two dtypes: `param_dtype` for the weights and `dtype` for activations (the
residual stream, norms, attention and the KV cache). bfloat16 weights with
float32 activations multiply in bfloat16 and accumulate in float32
(ops/linear.py): on CPUs with AVX512-BF16 that is twice as fast as float32.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ...config import BLOCK_QUANTIZATIONS, ModelConfig
from ...kv.dense import NoCache
from ...ops.lora import LoraStack, head_delta, lora_embedding
from ...ops.linear import FP8, linear, matmul_t, quantize_fp8, quantize_int8
from ...ops.norm import rms_norm
from ...ops.quantized import activation_passes, gather_rows, held_bytes, is_quantized, quantize, with_passes
from ...ops.rope import rope_cos_sin
from ...hardware.sharding import constrain
from .fused import replicate_kv_groups
from .spec import Weight, tensor

log = logging.getLogger(__name__)


@dataclasses.dataclass
class StepContext:
    """What every layer of one forward pass shares: positions and the rotary tables."""

    positions: jax.Array  # (B, T) int32
    tables: dict  # Rope -> (cos, sin) (B, T, rotary/2)

    def rope(self, config: ModelConfig, layer: int):
        """(cos, sin) of the layer's rotary embedding, or None for a NoPE layer."""
        rope = config.layer_rope(layer)
        return None if rope is None else self.tables[rope]


def _init(name: str, spec: Weight, dtype, rngs: nnx.Rngs) -> nnx.Param:
    if spec.init == "ones":
        return nnx.Param(jnp.ones(spec.shape, dtype))
    if spec.init == "zeros":
        return nnx.Param(jnp.zeros(spec.shape, dtype))
    return nnx.Param((0.02 * jax.random.normal(rngs.params(), spec.shape, jnp.float32)).astype(dtype))


class LayerWeights(nnx.Module):
    """One decoder layer's weights, one attribute per declared name."""

    def __init__(self, specs: dict[str, Weight], param_dtype, rngs: nnx.Rngs):
        for name, spec in specs.items():
            setattr(self, name, _init(name, spec, param_dtype, rngs))

    def weights(self) -> dict[str, jax.Array]:
        return {name: value[...] for name, value in vars(self).items() if isinstance(value, nnx.Param)}

    def forward_weights(self) -> dict[str, jax.Array]:
        """What the layer's forward pass reads: its weights and, on an engine serving LoRA adapters,
        their stacked slots (ops/lora.py, lora/stacks.py)."""
        return {name: value[...] for name, value in vars(self).items() if isinstance(value, (nnx.Param, LoraStack))}


class CausalLM(nnx.Module):
    """Embedding -> decoder layers -> final norm -> output head. Families subclass it."""

    config_class: ClassVar[type] = ModelConfig
    hf_model_types: ClassVar[tuple[str, ...]] = ()  # a family's own `name` unless it declares them
    hf_architectures: ClassVar[tuple[str, ...]] = ()
    gguf_architectures: ClassVar[tuple[str, ...]] = ()
    # GGUF tensors the config is read from (not weights), e.g. rope frequency factors
    gguf_config_tensors: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "name" in vars(cls) and "hf_model_types" not in vars(cls):
            cls.hf_model_types = (cls.name,)

    # ---------------------------------------------------------------- declarations
    @classmethod
    def config_from_hf(cls, cfg: dict, where: str) -> ModelConfig:
        raise NotImplementedError

    @classmethod
    def config_from_gguf(cls, meta, where: str) -> ModelConfig:
        raise NotImplementedError

    @classmethod
    def accepts_gguf(cls, meta) -> bool:
        """Whether this family runs a GGUF file of one of its architectures (families sharing an
        architecture name, e.g. Llama and Mixtral as `llama`, tell themselves apart here)."""
        return True

    @classmethod
    def layer_weights(cls, config: ModelConfig, i: int) -> dict[str, Weight]:
        raise NotImplementedError

    @classmethod
    def global_weights(cls, config: ModelConfig) -> dict[str, Weight]:
        """Embedding, final norm and (untied) output head, by llama.cpp's and HF's usual names."""
        v, d = config.vocab_size, config.hidden_size
        out = {
            "embed": Weight((v, d), ("vocab", "embed"), tensor("model.embed_tokens.weight", (v, d), matrix=False),
                            tensor("token_embd.weight", (v, d), matrix=False), lookup=True),
            "final_norm": Weight((d,), ("embed",), tensor("model.norm.weight", (d,)),
                                 tensor("output_norm.weight", (d,)), init="ones"),
        }
        if not config.tie_word_embeddings:
            out["lm_head"] = Weight((d, v), ("embed", "vocab"), tensor("lm_head.weight", (v, d)),
                                    tensor("output.weight", (v, d)), quantize=True)
        return out

    @classmethod
    def weight_specs(cls, config: ModelConfig) -> dict[str, Weight]:
        """Every weight of the model by name ("embed", "layers.3.wqkv", ...)."""
        specs = dict(cls.global_weights(config))
        for i in range(config.num_layers):
            specs.update({f"layers.{i}.{k}": v for k, v in cls.layer_weights(config, i).items()})
        return specs

    # the layers route their projections through models/parts/blocks.py's attention and mlp, where LoRA
    # adapters are added (ops/lora.py), and a test compares the family's adapted logits with PEFT's
    supports_lora: ClassVar[bool] = False

    # (stored prefix, the prefix the declarations use) of HF tensor names: a vision-language
    # checkpoint's language model under its own prefix ("model.text_model." -> "model.")
    hf_renames: ClassVar[tuple[tuple[str, str], ...]] = ()

    @classmethod
    def hf_source(cls, source):
        """The checkpoint's tensors as this family's declarations read them (a family whose checkpoints come
        in two layouts presents them as one: models/families/qwen3_vl_moe.py)."""
        return source

    # tensors some checkpoints carry that the model derives or does not use
    hf_ignored_suffixes: ClassVar[tuple[str, ...]] = ("rotary_emb.inv_freq",)

    @classmethod
    def ignores_tensor(cls, name: str, config: ModelConfig) -> bool:
        """A stored tensor the model does not read and the loader should not call unknown: the blocks of a
        GGUF's multi-token-prediction layers (after the model's own: config_io.gguf_fields) among them."""
        if name.startswith("blk."):
            block = name.split(".", 2)[1]
            return block.isdigit() and int(block) >= config.num_layers
        return name.endswith(cls.hf_ignored_suffixes)

    # ---------------------------------------------------------------- construction
    def __init__(self, config: ModelConfig, *, dtype=jnp.float32, param_dtype=None, rngs: nnx.Rngs | None = None):
        rngs = rngs if rngs is not None else nnx.Rngs(0)
        self.config = config
        self.dtype = jnp.dtype(dtype)
        self.param_dtype = jnp.dtype(param_dtype or dtype)
        self.stack_dtype = self.param_dtype  # expert stacks' (a GGUF file's may differ: prepare_mixed_dtypes)
        self.layers = nnx.List([LayerWeights(self.layer_weights(config, i), self.param_dtype, rngs)
                                for i in range(config.num_layers)])
        for name, spec in self.global_weights(config).items():
            setattr(self, name, _init(name, spec, self.param_dtype, rngs))

    def for_context(self, max_length: int) -> "CausalLM":
        """The model to run with contexts up to `max_length` tokens: itself, unless its config
        depends on the context (Phi-3's LongRoPE picks its long factors beyond the original
        context, as llama.cpp and vLLM do by the serving context)."""
        config = self.config_for_context(self.config, max_length)
        if config == self.config:
            return self
        copy = nnx.merge(*nnx.split(self))  # shares the weight arrays
        copy.config = config
        return copy

    @classmethod
    def config_for_context(cls, config: ModelConfig, max_length: int) -> ModelConfig:
        return config

    # ---------------------------------------------------------------- weights
    @property
    def quantization(self) -> str | None:
        """"int8" / "fp8" (quantize()), "blocks" (weights held in GGUF block formats), or None."""
        if hasattr(self, "lm_head_scale"):  # quantize() always quantizes the head
            return "fp8" if self.lm_head[...].dtype == FP8 else "int8"
        return "blocks" if any(is_quantized(w) for w in self.named_weights().values()) else None

    def block_formats(self) -> dict[str, int]:
        """Block format -> how many weights are held in it (empty for a float model)."""
        out: dict[str, int] = {}
        for w in self.named_weights().values():
            if is_quantized(w):
                out[w.format] = out.get(w.format, 0) + 1
        return out

    def use_activation_passes(self, passes: int) -> "CausalLM":
        """Have the block kernel multiply every block weight in `passes` passes (ops/quantized.py
        `activation_passes`: 2 adds the activations' int8 rounding residual, 1 is llama.cpp's arithmetic),
        in every row of every step."""
        for holder in (self, *self.layers):
            for value in vars(holder).values():
                if isinstance(value, nnx.Param) and is_quantized(value[...]):
                    value.set_value(with_passes(value[...], passes))
        return self

    @property
    def activation_passes(self) -> int | None:
        """The block kernel's passes over this model's block weights (None: it holds none)."""
        found = next((w for w in self.named_weights().values() if is_quantized(w)), None)
        if found is None:
            return None
        return (found.parts[0] if hasattr(found, "parts") else found).passes

    def quantize(self, kind: str = "int8") -> "CausalLM":
        """Replace the declared matrices, in place: "int8" by int8 + per-channel scales (ops/linear.py);
        "fp8" by float8_e4m3fn + per-channel scales (for accelerators with fp8: ops/linear.py);
        "int4" (q4_0: 4 bits, one scale per 32 weights) or "q8_0" (8 bits, one scale per 32), and
        "int4_g64" / "int4_g128" / "int8_g64" / "int8_g128" (one scale per 64 or 128 weights), by GGUF
        blocks (ops/quantized.py) multiplied by the block kernel, the embedding too (its rows are
        gathered from the blocks, and a tied head multiplies them)."""
        if kind in BLOCK_QUANTIZATIONS:
            return self._quantize_blocks(*BLOCK_QUANTIZATIONS[kind])
        quantizer = {"int8": quantize_int8, "fp8": quantize_fp8}.get(kind)
        if quantizer is None:
            raise ValueError(f"unsupported quantization {kind!r} (supported: int8, fp8, {', '.join(BLOCK_QUANTIZATIONS)})")
        if self.quantization == "blocks":
            raise ValueError("the weights are held in GGUF block formats already; load the file with an "
                             f"explicit dtype (dequantized) to quantize it to {kind}")
        if self.quantization:
            if self.quantization != kind:
                raise ValueError(f"the model is quantized already ({self.quantization})")
            return self
        for i, layer in enumerate(self.layers):
            for name, spec in self.layer_weights(self.config, i).items():
                if spec.quantize and not hasattr(layer, name + "_scale"):  # (loading quantizes as it places)
                    q, scale = quantizer(getattr(layer, name)[...])
                    getattr(layer, name).set_value(q)
                    setattr(layer, name + "_scale", nnx.Param(scale))
        head = self.lm_head[...] if hasattr(self, "lm_head") else self.embed[...].T
        q, scale = quantizer(head)
        if hasattr(self, "lm_head"):
            self.lm_head.set_value(q)
        else:
            self.lm_head = nnx.Param(q)  # the float embedding stays for token lookups
        self.lm_head_scale = nnx.Param(scale)
        return self

    def _quantize_blocks(self, fmt: str, group_size: int = 32) -> "CausalLM":
        """Every 2-D `quantize` matrix (K, N) and `lookup` table (N, K) -> blocks of `fmt` with one scale
        per `group_size` weights (ops/quantized.quantize), or per 64 / 32 where K is not a multiple of
        it (logged; K not a multiple of 32 stays float), replicated on the model's mesh if it has one."""
        if self.quantization:
            raise ValueError(f"the model is quantized already ({self.quantization})")
        from ...hardware.sharding import mesh_of, replicated

        mesh = mesh_of(self)
        smaller: dict[int, int] = {}  # group size -> matrices whose K needs it
        for name, spec in self.weight_specs(self.config).items():
            if len(spec.shape) != 2 or spec.indexed or not (spec.quantize or spec.lookup):
                continue
            holder = self
            *parents, leaf = name.split(".")
            for p in parents:
                holder = holder[int(p)] if p.isdigit() else getattr(holder, p)
            value = getattr(holder, leaf)[...]
            if value.dtype == jnp.uint16:  # raw bits of the weights' dtype (prepare_mixed_dtypes)
                value = jax.lax.bitcast_convert_type(value, self.param_dtype)
            rows = value.T if spec.quantize else value  # (N, K)
            size = next((g for g in (group_size, 64, 32) if g <= group_size and rows.shape[1] % g == 0), None)
            if size is None:
                continue
            if size != group_size:
                smaller[size] = smaller.get(size, 0) + 1
            blocks = quantize(rows, fmt, size)
            getattr(holder, leaf).set_value(jax.device_put(blocks, replicated(mesh)) if mesh else blocks)
        if hasattr(self, "lm_head") and not is_quantized(self.lm_head[...]) and self.config.tie_word_embeddings:
            del self.lm_head  # a float copy of the tied head (prepare_mixed_dtypes): the embedding's blocks serve
        for size, count in smaller.items():
            log.info("%s in groups of %d: %d matrices' input size is not a multiple of %d, they take groups of %d",
                     fmt, group_size, count, group_size, size)
        return self.use_activation_passes(activation_passes(self.config))

    def prepare_mixed_dtypes(self) -> "CausalLM":
        """Layouts for weights whose dtype differs from the activations' (bfloat16 weights on CPU),
        so that XLA:CPU never converts a whole (V, D) table inside a program:
        - a tied model gets a (D, V) copy of its embedding as the output head: XLA:CPU has no
          bfloat16 dot that reads the (V, D) table transposed and converted all of it to float32
          every decode call (~30 ms at V=49k); costs V * D weights;
        - the embedding is held as its raw bits (uint16): a bfloat16 gather inside the decode loop
          made XLA convert the whole table (hoisted out of the loop) before taking a few rows,
          ~16 ms per call at V=49k; a gather of integer rows is exact and reads only those rows."""
        if self.param_dtype != self.dtype and not is_quantized(self.embed[...]):  # (blocks: no float copies)
            if self.config.tie_word_embeddings and not hasattr(self, "lm_head"):
                self.lm_head = nnx.Param(jnp.asarray(self.embed[...].T))  # the embedding stays for token lookups
            table = self.embed[...]
            if jnp.issubdtype(table.dtype, jnp.floating) and table.dtype.itemsize == 2:
                self.embed = nnx.Param(jax.lax.bitcast_convert_type(table, jnp.uint16))
        # (bfloat16 expert stacks beside float32 weights too: a GGUF file's, loading/__init__.py; the bits'
        # dtype stays in self.stack_dtype, which ops/moe.py reads them back as)
        for i, layer in enumerate(self.layers):  # weights sliced in loops (experts): the same, for the same reason
            for name, spec in self.layer_weights(self.config, i).items():
                value = getattr(layer, name)[...]
                if spec.indexed and jnp.issubdtype(value.dtype, jnp.floating) and value.dtype.itemsize == 2:
                    getattr(layer, name).set_value(jax.lax.bitcast_convert_type(value, jnp.uint16))
        return self

    def embedding_table(self) -> jax.Array:
        """The (V, D) embedding in the weights' dtype (whichever way it is held)."""
        table = self.embed[...]
        if is_quantized(table):
            return gather_rows(table, jnp.arange(table.shape[0]), self.param_dtype)
        return jax.lax.bitcast_convert_type(table, self.param_dtype) if table.dtype == jnp.uint16 else table

    def named_weights(self) -> dict[str, jax.Array]:
        out = {name: getattr(self, name)[...] for name in ("embed", "final_norm", "lm_head", "lm_head_scale")
               if hasattr(self, name)}
        out.update({name: getattr(self, name)[...] for name in self.global_weights(self.config) if name not in out})
        for i, layer in enumerate(self.layers):
            out.update({f"layers.{i}.{k}": v for k, v in layer.weights().items()})
        return out

    def weight_axes(self) -> dict[str, tuple[str | None, ...]]:
        """Logical axes of every weight the model holds (an int8 scale takes its weight's last
        axis; a head made from a tied embedding is (embed, vocab))."""
        axes = {name: spec.axes for name, spec in self.weight_specs(self.config).items()}
        held = self.named_weights()
        if "lm_head" in held and "lm_head" not in axes:
            axes["lm_head"] = ("embed", "vocab")
        for name in held:
            if name not in axes and name.endswith("_scale"):  # int8 scales (quantize()), not declared weights
                axes[name] = axes[name[: -len("_scale")]][-1:]
        return axes

    def kv_group_weights(self) -> set[str]:
        """Names of the held weights whose last axis is fused qkv groups (and their scales)."""
        names = {name for name, spec in self.weight_specs(self.config).items() if spec.kv_groups}
        return names | {name + "_scale" for name in names}

    def replicate_kv_groups(self, name: str, columns, config):
        """One of `kv_group_weights`' arrays (`name`) with each KV head copied to the groups `config` (this
        model's config at a tensor-parallel size) has for it (fused.py): sharding.place_model calls it, so
        sharding need not import the models' layouts. Families whose layers differ in KV heads override it."""
        factor = config.num_kv_heads // self.config.num_kv_heads
        return replicate_kv_groups(np.asarray(columns), self.config, factor) if factor > 1 else columns

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights held in memory."""
        return sum(held_bytes(w) for w in self.named_weights().values())

    @property
    def decode_bytes(self) -> int:
        """Weight bytes one decode step reads: the embedding table only when it is also the output
        head (routed experts counted whole: an upper bound for a mixture of experts)."""
        weights = self.named_weights()
        if "lm_head" in weights:
            weights.pop("embed")
        return sum(held_bytes(w) for w in weights.values())

    @property
    def num_params(self) -> int:
        return sum(int(np.prod(spec.shape)) for spec in self.weight_specs(self.config).values())

    # ---------------------------------------------------------------- forward
    def __call__(
        self,
        input_ids: jax.Array,  # (B, T) int32
        positions: jax.Array | None = None,  # (B, T) int32; default 0..T-1
        cache=None,  # a kv cache pytree with .attend(); None = no cache
        logits_index: jax.Array | None = None,  # (B,) take logits of one token per row
    ):
        """Returns (logits, cache): logits (B, T, V) float32, or (B, V) with `logits_index`."""
        b, t = input_ids.shape
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        if cache is None:
            cache = NoCache()
        hidden, cache = self.decode_layers(self.embed_tokens(input_ids), positions, cache)
        if logits_index is not None:
            hidden = jnp.take_along_axis(hidden, logits_index[:, None, None].astype(jnp.int32), axis=1)[:, 0]
        return self.logits(hidden), cache

    @property
    def embed_scale(self) -> float | None:
        """A constant the embeddings are multiplied by (Gemma: sqrt(D)); None = none."""
        return None

    def embed_tokens(self, input_ids: jax.Array) -> jax.Array:
        """(...) int32 -> (..., D) in the activation dtype."""
        table = self.embed[...]
        if is_quantized(table):  # GGUF blocks: the rows' tiles gathered and dequantized
            rows = gather_rows(table, input_ids, self.param_dtype)
        elif table.dtype == jnp.uint16:  # raw bits of the weights' dtype (prepare_mixed_dtypes)
            rows = jax.lax.bitcast_convert_type(table[input_ids], self.param_dtype)
        else:
            rows = table[input_ids]
        if hasattr(self, "lora_embed_a"):  # LoRA adapters of the embedding (ops/lora.py), before its scale
            rows = lora_embedding(input_ids, rows, self.lora_embed_a[...], self.lora_embed_b[...])
        if self.embed_scale is not None:  # scaled in the weights' dtype, as the references do
            rows = rows * jnp.asarray(self.embed_scale, rows.dtype)
        return rows.astype(self.dtype)

    def decode_layers(self, hidden, positions, cache, final_norm: bool = True, rope_positions=None,
                      layer_inputs=None):
        """hidden: (B, T, D) -> (B, T, D) after every decoder layer and the final norm (a family with
        another kind of final norm applies its own: final_norm=False). rope_positions: what the rotary
        tables are built from where it is not `positions` (M-RoPE's (3, B, T): rope_tables); the KV
        slots and masks always take `positions`. layer_inputs: (K, B, T, D) added to the hidden states
        after each of the first K layers (Qwen3-VL's deepstack image features; zeros elsewhere)."""
        c = self.config
        ctx = StepContext(positions, self.rope_tables(positions if rope_positions is None else rope_positions))
        for i, layer in enumerate(self.layers):
            with jax.named_scope(f"layer_{i}"):
                hidden, cache = self.layer(i, hidden, layer.forward_weights(), cache, ctx)
            if layer_inputs is not None and i < layer_inputs.shape[0]:
                hidden = hidden + layer_inputs[i].astype(hidden.dtype)
        return (rms_norm(hidden, self.final_norm[...], c.rms_norm_eps) if final_norm else hidden), cache

    def rope_tables(self, positions) -> dict:
        """Rope -> (cos, sin) (B, T, rotary/2) of every rotary embedding the layers use, at positions (B, T)."""
        c = self.config
        ropes = {c.layer_rope(i) for i in range(c.num_layers)} - {None}
        return {r: rope_cos_sin(positions, r, c.head_dim) for r in ropes}

    def layer(self, i: int, x, w: dict, cache, ctx: StepContext):
        """Layer i: x (B, T, D) -> (x, cache)."""
        raise NotImplementedError

    def scale_logits(self, logits: jax.Array) -> jax.Array:
        """Family-specific treatment of the head's output (Gemma's soft-cap, Granite's scale)."""
        return logits

    def logits(self, hidden: jax.Array) -> jax.Array:
        """hidden: (..., D) -> (..., V) float32."""
        # accumulated and kept in float32: bfloat16 logits (8 bits of mantissa: steps of 1/16 at 10-16) made
        # near-ties of greedy decoding; a bfloat16 hidden state multiplies as bfloat16 still (ops/linear.py)
        hidden = hidden.astype(jnp.float32)
        if hasattr(self, "lm_head"):
            scale = self.lm_head_scale[...] if hasattr(self, "lm_head_scale") else None
            out = linear(hidden, self.lm_head[...], scale)
        else:
            out = matmul_t(hidden, self.embed[...])  # tied: hidden @ embed.T
        delta = head_delta(self, hidden)  # LoRA adapters of the head (ops/lora.py)
        if delta is not None:
            out = out + delta.astype(out.dtype)
        # vocabulary-parallel head: each device computes its vocabulary slice, then the logits are
        # gathered once here (not in every sampling stage, and not the head's weights instead)
        out = constrain(out, (None,) * (out.ndim - 1) + ("vocab",))
        return self.scale_logits(constrain(out.astype(jnp.float32), ()))
