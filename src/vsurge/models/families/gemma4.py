"""Gemma 4 (text): Gemma 3's sandwich-normed layers (sliding-window and global, two rotary bases,
scaled embeddings, GeGLU, final soft-cap) with what Gemma 4 adds:

- norms multiply by w (not 1 + w); q and k RMS-normed per head, v by a norm without weights;
  scores are not scaled (the q/k norms fix their size: AttentionSpec.scale 1);
- global layers have their own head size and KV heads (`per_layer_config`, or `global_head_dim`
  and `num_global_key_value_heads`), and "proportional" rotary: frequencies over the whole head
  (exponent 2j / head_dim) for the first partial_rotary_factor of its pairs, the rest not rotated
  (their frequency 0: Rope.freq_factors of infinity);
- `attention_k_eq_v`: global layers have no v_proj, values are the keys' projection (before the
  k norm and rotary), normed by the weightless v norm;
- per-layer inputs (`hidden_size_per_layer_input` P): a second embedding (V', L * P) of the token
  ids, plus a projection of the embeddings normed per layer, mixed once before the layers; layer i
  adds per_layer_projection(gelu(per_layer_input_gate(x)) * input_i), normed, to its output;
- KV sharing (`num_kv_shared_layers` N): the last N layers compute queries only and attend to the
  keys and values of the last earlier layer of their kind (sliding / global) of the same step.
  Here a shared layer keeps its own KV entry and writes its source layer's keys and values into it
  (exact, but the cache holds those layers twice; no cache needs a read-only attend); those layers'
  MLP is twice as wide with `use_double_wide_mlp`;
- each layer's output is multiplied by its `layer_scalar`.

The per-layer token embeddings are looked up in `embed_tokens` and travel to `decode_layers`
concatenated after the hidden state (the engine hands one to the other and nothing else): the
(B, T, D + L * P) input is split there.

HF: Gemma4ForCausalLM ("gemma4_text"), and the text model of a whole Gemma 4 checkpoint
(Gemma4ForConditionalGeneration, "gemma4": its `text_config`, weights under model.language_model;
the vision and audio towers and their embedders are not read). Refused at load: the MoE block
(`enable_moe_block`), bidirectional attention over everything (`use_bidirectional_attention`
"all"), attention biases. GGUF: `gemma4` as llama.cpp's converter writes it: norms as stored (w), the
per-layer head sizes, KV heads and MLP widths as per-layer keys, which layers slide as
`sliding_window_pattern`, K/V sharing as `shared_kv_layers`, values = keys where a computing layer has no
attn_v, the proportional rotary's unrotated pairs as rope_freqs factors of 1e30 (read as infinite).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from ...config import AttentionSpec, KVLayer, ModelConfig, Rope
from ...errors import UnsupportedModelError
from ...ops.linear import linear
from ...ops.rope import apply_rope, rope_cos_sin
from ..parts.base import StepContext
from ..parts.blocks import attention_weights, mlp, mlp_weights, norm, project_qkv
from ..parts.config_io import GGUFMeta, check_activation, gguf_fields, hf_fields, rope_from_hf
from ..parts.fused import replicate_kv_groups
from .gemma2 import GELU, Gemma2, GemmaConfig
from ..parts.spec import FusedQKV, Weight, paired


@dataclass(frozen=True)
class Gemma4Config(GemmaConfig):
    head_dims: tuple[int, ...] = ()  # per layer
    layer_kv_heads: tuple[int, ...] = ()  # per layer
    k_eq_v: tuple[bool, ...] = ()  # per layer: values are the keys' projection (no v_proj)
    kv_source: tuple[int | None, ...] = ()  # per layer: the earlier layer whose K/V it attends to
    mlp_widths: tuple[int, ...] = ()  # per layer (twice intermediate_size on shared layers if double wide)
    per_layer_dim: int = 0  # hidden_size_per_layer_input (0: no per-layer inputs)
    per_layer_vocab: int = 0  # vocab_size_per_layer_input
    hf_prefix: str = "model"  # "model.language_model" in a whole Gemma 4 checkpoint

    def layer_config(self, layer: int) -> "Gemma4Config":
        """This config with layer `layer`'s head size and KV heads (what blocks.py reads)."""
        hd, kvh = self.head_dims[layer], self.layer_kv_heads[layer]
        if hd == self.head_dim and kvh == self.num_kv_heads:
            return self
        return dataclasses.replace(self, head_dim=hd, num_kv_heads=kvh)

    def attention_spec(self, layer: int) -> AttentionSpec:
        return AttentionSpec(scale=1.0, window=self.sliding_window if self.is_sliding(layer) else None,
                             softcap=self.attn_softcap)

    @property
    def kv_layout(self) -> tuple[KVLayer, ...]:
        return tuple(KVLayer(self.layer_kv_heads[i], self.head_dims[i], self.head_dims[i])
                     for i in range(self.num_layers))

    def for_tensor_parallel(self, tp: int) -> "ModelConfig":
        """Query heads and MLP units split evenly; each layer's KV heads replicated up to lcm(its KV heads,
        tp) (the global layers' one KV head is copied to every device), which needs that many groups."""
        if self.num_heads % tp:
            raise ValueError(f"tensor_parallel_size {tp} must divide the model's {self.num_heads} attention heads")
        widths = sorted({w for w in self.mlp_widths if w % tp})
        if widths:
            raise ValueError(f"tensor_parallel_size {tp} must divide the model's MLP widths {widths}")
        kv = tuple(math.lcm(k, tp) for k in self.layer_kv_heads)
        if any(self.num_heads % k for k in kv):
            raise ValueError(f"tensor_parallel_size {tp}: the KV heads {sorted(set(self.layer_kv_heads))} would be "
                             f"replicated to {sorted(set(kv))}, which must divide the {self.num_heads} query heads")
        return self.replace(num_kv_heads=math.lcm(self.num_kv_heads, tp), layer_kv_heads=kv)


def _gemma4_rope(params: dict, head_dim: int, where: str) -> Rope:
    """One layer type's rope parameters -> Rope over that type's whole head (dim set: the rotary
    tables are built per Rope, not from the config's head_dim)."""
    kind = params.get("rope_type", "default") or "default"
    theta = float(params.get("rope_theta", 10000.0))
    if kind == "proportional":  # transformers' _compute_proportional_rope_parameters
        angles = int(float(params.get("partial_rotary_factor", 1.0) or 1.0) * head_dim // 2)
        factor = float(params.get("factor", 1.0) or 1.0)
        nope = head_dim // 2 - angles
        return Rope(kind="linear" if factor != 1.0 else "default", theta=theta, dim=head_dim, factor=factor,
                    freq_factors=(1.0,) * angles + (float("inf"),) * nope if nope else None)
    if kind == "default":  # the reference's default rope rotates the whole head (no partial factor)
        return Rope(theta=theta, dim=head_dim)
    rope = rope_from_hf(params, head_dim, where)
    return rope if rope.dim is not None else dataclasses.replace(rope, dim=head_dim)


def _kv_sources(types: list[str], head_dims: list[int], kv_heads: list[int], shared: int,
                where: str) -> list[int | None]:
    """Per layer, the earlier layer whose K/V it attends to (the last `shared` layers share the last
    earlier layer of their kind: Gemma4TextConfig.kv_sharing_modes), else None."""
    n = len(types)
    first = n - shared
    if shared and first <= 0:
        raise UnsupportedModelError(f"{where}: num_kv_shared_layers {shared} leaves no layer computing K/V")
    source: list[int | None] = [None] * n
    for i in range(first, n):
        earlier = [j for j in range(first) if types[j] == types[i]]
        if not earlier:
            raise UnsupportedModelError(f"{where}: layer {i} shares the K/V of no earlier {types[i]} layer")
        source[i] = earlier[-1]
        if head_dims[i] != head_dims[source[i]] or kv_heads[i] != kv_heads[source[i]]:
            raise UnsupportedModelError(f"{where}: layer {i}'s heads differ from those of layer {source[i]} "
                                        "whose K/V it shares")
    return source


def _norm(x, weight, eps):
    """Gemma4RMSNorm: x * (mean(x^2) + eps)^-0.5 (times w, in float32), in x.dtype."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    if weight is not None:
        normed = normed * weight.astype(jnp.float32)
    return normed.astype(x.dtype)


@dataclasses.dataclass
class Gemma4Context(StepContext):
    per_layer: jax.Array | None = None  # (B, T, L, P) each layer's input
    shared: dict = dataclasses.field(default_factory=dict)  # source layer -> its (k, v) of this step


class Gemma4(Gemma2):
    supports_lora = False  # (models/parts/base.py)
    name = "gemma4"
    hf_model_types = ("gemma4_text", "gemma4")
    hf_architectures = ("Gemma4ForCausalLM", "Gemma4ForConditionalGeneration")
    gguf_architectures = ("gemma4",)
    gguf_config_tensors = ("rope_freqs.weight",)  # the global layers' proportional rotary, read into the config
    config_class = Gemma4Config

    def replicate_kv_groups(self, name: str, columns, config):
        """Layer by layer: its KV heads copied as `config` has them for that layer."""
        i = int(name.split(".")[1])
        factor = config.layer_kv_heads[i] // self.config.layer_kv_heads[i]
        return replicate_kv_groups(np.asarray(columns), self.config.layer_config(i), factor) if factor > 1 else columns

    @classmethod
    def ignores_tensor(cls, name: str, config) -> bool:
        return super().ignores_tensor(name, config) or name.startswith(
            ("model.vision_tower.", "model.embed_vision.", "model.audio_tower.", "model.embed_audio."))

    @classmethod
    def config_from_hf(cls, cfg: dict, where: str) -> ModelConfig:
        prefix = "model"
        if "text_config" in cfg:  # a whole Gemma 4 checkpoint: its text model
            text = cfg["text_config"] or {}
            cfg = {**text, "tie_word_embeddings": cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", True)),
                   "eos_token_id": text.get("eos_token_id", cfg.get("eos_token_id")),
                   "_name_or_path": cfg.get("_name_or_path", "")}
            prefix = "model.language_model"
        # Gemma4TextConfig's defaults where config.json leaves a key out
        cfg = {"tie_word_embeddings": True, "rms_norm_eps": 1e-6, "sliding_window": 512, "head_dim": 256, **cfg}
        if cfg.get("enable_moe_block"):
            raise UnsupportedModelError(f"{where}: enable_moe_block (Gemma 4's mixture-of-experts block) is not "
                                        "supported yet")
        if cfg.get("use_bidirectional_attention") == "all":
            raise UnsupportedModelError(f"{where}: use_bidirectional_attention 'all' (an embedding model) is not "
                                        "supported")
        if cfg.get("attention_bias"):
            raise UnsupportedModelError(f"{where}: attention_bias is not supported for Gemma 4")
        act = check_activation(cfg, where, GELU, key="hidden_activation")
        fields = hf_fields({**cfg, "rope_parameters": None, "rope_scaling": None}, where, cls.name)
        n, hd, kvh = fields["num_layers"], fields["head_dim"], fields["num_kv_heads"]
        types = list(cfg.get("layer_types") or
                     ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n)])[:n]
        types[-1] = "full_attention"  # as Gemma4TextConfig forces it
        k_eq_v = bool(cfg.get("attention_k_eq_v", False))
        # per-layer head size / KV heads: per_layer_config as saved, else derived as Gemma4TextConfig does
        overrides = cfg.get("per_layer_config")
        if overrides is None:
            full = {"head_dim": int(cfg.get("global_head_dim") or 512)}
            if k_eq_v and cfg.get("num_global_key_value_heads") is not None:
                full["num_key_value_heads"] = int(cfg["num_global_key_value_heads"])
            overrides = {i: full for i, t in enumerate(types) if t == "full_attention"}
        overrides = {int(k): dict(v or {}) for k, v in overrides.items()}
        head_dims, kv_heads = [hd] * n, [kvh] * n
        for i, o in overrides.items():
            unknown = set(o) - {"head_dim", "num_key_value_heads"}
            if unknown:
                raise UnsupportedModelError(f"{where}: per_layer_config of layer {i} overrides {sorted(unknown)}, "
                                            "which is not supported")
            if i < n:
                head_dims[i] = int(o.get("head_dim", hd))
                kv_heads[i] = int(o.get("num_key_value_heads", kvh))
        source = _kv_sources(types, head_dims, kv_heads, int(cfg.get("num_kv_shared_layers", 0) or 0), where)
        double = bool(cfg.get("use_double_wide_mlp", False))
        width = fields["intermediate_size"]
        params = cfg.get("rope_parameters") or {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}}
        full_hd = next((head_dims[i] for i in range(n) if types[i] == "full_attention"), hd)
        rope = _gemma4_rope(params.get("full_attention") or {}, full_hd, where)
        local = _gemma4_rope(params.get("sliding_attention") or {}, hd, where)
        window = cfg.get("sliding_window")
        softcap = cfg.get("final_logit_softcapping")
        per_layer = int(cfg.get("hidden_size_per_layer_input") or 0)
        fields.update(
            sliding_window=int(window) if window else None,
            layer_types=tuple("sliding" if t == "sliding_attention" else "full" for t in types),
            activation=act, query_pre_attn_scalar=1.0, attn_softcap=None,
            final_softcap=float(softcap) if softcap else None, rope=rope, local_rope=local, qk_norm=True,
            head_dims=tuple(head_dims), layer_kv_heads=tuple(kv_heads),
            k_eq_v=tuple(k_eq_v and t == "full_attention" for t in types), kv_source=tuple(source),
            mlp_widths=tuple(width * (2 if double and source[i] is not None else 1) for i in range(n)),
            per_layer_dim=per_layer,
            per_layer_vocab=int(cfg.get("vocab_size_per_layer_input") or fields["vocab_size"]) if per_layer else 0,
            hf_prefix=prefix)
        return Gemma4Config(**fields)

    @classmethod
    def config_from_gguf(cls, meta: GGUFMeta, where: str) -> ModelConfig:
        hd_full = int(meta.key("attention.key_length", required=True))
        hd = int(meta.key("attention.key_length_swa", hd_full))
        fields = gguf_fields(meta, cls.name, head_dim=hd)
        n = fields["num_layers"]
        sliding = [bool(s) for s in meta.per_layer("attention.sliding_window_pattern", n, True)]
        types = ["sliding_attention" if s else "full_attention" for s in sliding]
        head_dims = [hd if s else hd_full for s in sliding]
        kv_heads = [int(k) for k in meta.per_layer("attention.head_count_kv", n, fields["num_heads"])]
        source = _kv_sources(types, head_dims, kv_heads, int(meta.key("attention.shared_kv_layers", 0) or 0), where)
        factors = meta.read("rope_freqs.weight").reshape(-1) if meta.has("rope_freqs.weight") else None
        rope = Rope(theta=float(meta.key("rope.freq_base", 1_000_000.0)), dim=hd_full,
                    freq_factors=None if factors is None else tuple(float("inf") if f > 1e29 else float(f)
                                                                    for f in factors))
        window, softcap = meta.key("attention.sliding_window"), meta.key("final_logit_softcapping")
        widths = [int(f) for f in meta.per_layer("feed_forward_length", n)]
        per_layer_dim = int(meta.key("embedding_length_per_layer_input", 0) or 0)
        fields.update(
            num_kv_heads=kv_heads[sliding.index(True)] if True in sliding else kv_heads[0],
            sliding_window=int(window) if window else None,
            layer_types=tuple("sliding" if s else "full" for s in sliding), activation="gelu_pytorch_tanh",
            query_pre_attn_scalar=1.0, attn_softcap=None, final_softcap=float(softcap) if softcap else None,
            rope=rope, local_rope=Rope(theta=float(meta.key("rope.freq_base_swa", 10_000.0)), dim=hd), qk_norm=True,
            head_dims=tuple(head_dims), layer_kv_heads=tuple(kv_heads),
            k_eq_v=tuple(source[i] is None and not meta.has(f"blk.{i}.attn_v.weight") for i in range(n)),
            kv_source=tuple(source), mlp_widths=tuple(widths),
            intermediate_size=widths[0],  # (the layers' before any double-wide one)
            per_layer_dim=per_layer_dim,
            per_layer_vocab=meta.tensors["per_layer_token_embd.weight"][0] if per_layer_dim else 0)
        return Gemma4Config(**fields)

    # ---------------------------------------------------------------- weights
    @classmethod
    def global_weights(cls, c: Gemma4Config):
        v, d, p = c.vocab_size, c.hidden_size, c.hf_prefix
        out = {
            "embed": Weight((v, d), ("vocab", "embed"), *paired(f"{p}.embed_tokens.weight", "token_embd.weight", (v, d),
                                                                matrix=False), lookup=True),
            "final_norm": norm(d, f"{p}.norm.weight", "output_norm.weight"),
        }
        if not c.tie_word_embeddings:
            out["lm_head"] = Weight((d, v), ("embed", "vocab"), *paired("lm_head.weight", "output.weight", (v, d)),
                                    quantize=True)
        if c.per_layer_dim:
            lp = c.num_layers * c.per_layer_dim
            out["ple_embed"] = Weight((c.per_layer_vocab, lp), (None, None),
                                      *paired(f"{p}.embed_tokens_per_layer.weight", "per_layer_token_embd.weight",
                                              (c.per_layer_vocab, lp), matrix=False))
            out["ple_model_proj"] = Weight((d, lp), ("embed", None),
                                           *paired(f"{p}.per_layer_model_projection.weight",
                                                   "per_layer_model_proj.weight", (lp, d)))
            out["ple_proj_norm"] = Weight((c.per_layer_dim,), (None,),
                                          *paired(f"{p}.per_layer_projection_norm.weight", "per_layer_proj_norm.weight",
                                                  (c.per_layer_dim,)), init="ones")
        return out

    @classmethod
    def layer_weights(cls, c: Gemma4Config, i: int):
        hf, gg, d = f"{c.hf_prefix}.layers.{i}", f"blk.{i}", c.hidden_size
        lc = c.layer_config(i)
        out = {name: norm(d, f"{hf}.{stored}.weight", f"{gg}.{gguf_name}.weight") for name, stored, gguf_name in (
            ("attn_norm", "input_layernorm", "attn_norm"), ("post_attn_norm", "post_attention_layernorm",
                                                            "post_attention_norm"),
            ("mlp_norm", "pre_feedforward_layernorm", "ffn_norm"), ("post_mlp_norm", "post_feedforward_layernorm",
                                                                    "post_ffw_norm"))}
        attn = f"{hf}.self_attn"
        if c.kv_source[i] is not None:  # queries only: keys and values come from the source layer
            q = lc.q_size
            out["wq"] = Weight((d, q), ("embed", "heads"), *paired(f"{attn}.q_proj.weight", f"{gg}.attn_q.weight",
                                                                   (q, d)), quantize=True)
            out["q_norm"] = Weight((lc.head_dim,), ("head_dim",), *paired(f"{attn}.q_norm.weight",
                                                                          f"{gg}.attn_q_norm.weight", (lc.head_dim,)),
                                   init="ones")
            out["wo"] = Weight((q, d), ("heads", "embed"), *paired(f"{attn}.o_proj.weight", f"{gg}.attn_output.weight",
                                                                   (d, q)), quantize=True)
        else:
            out.update(attention_weights(lc, hf=attn, gguf=gg))
            if c.k_eq_v[i]:  # values are the key projection: the fused matrix reads k_proj / attn_k twice
                r, g = out["wqkv"].hf, out["wqkv"].gguf
                out["wqkv"] = dataclasses.replace(
                    out["wqkv"], hf=FusedQKV(r.q, r.k, r.k, r.num_heads, r.num_kv_heads, r.head_dim),
                    gguf=FusedQKV(g.q, g.k, g.k, g.num_heads, g.num_kv_heads, g.head_dim))
        out.update(mlp_weights(d, c.mlp_widths[i], hf=f"{hf}.mlp", gguf=gg))
        if c.per_layer_dim:
            pd = c.per_layer_dim
            out["ple_gate"] = Weight((d, pd), ("embed", None), *paired(f"{hf}.per_layer_input_gate.weight",
                                                                       f"{gg}.inp_gate.weight", (pd, d)), quantize=True)
            out["ple_proj"] = Weight((pd, d), (None, "embed"), *paired(f"{hf}.per_layer_projection.weight",
                                                                       f"{gg}.proj.weight", (d, pd)), quantize=True)
            out["ple_norm"] = norm(d, f"{hf}.post_per_layer_input_norm.weight", f"{gg}.post_norm.weight")
        out["layer_scalar"] = Weight((1,), (None,), *paired(f"{hf}.layer_scalar", f"{gg}.layer_output_scale.weight",
                                                            (1,)), init="ones")
        return out

    # ---------------------------------------------------------------- forward
    def embed_tokens(self, input_ids):
        """(B, T) -> (B, T, D) scaled embeddings, with the (L * P) per-layer token embeddings
        (scaled by sqrt(P)) after them when the model has per-layer inputs."""
        hidden = super().embed_tokens(input_ids)
        c = self.config
        if not c.per_layer_dim:
            return hidden
        rows = self.ple_embed[...][input_ids]
        rows = rows * jnp.asarray(c.per_layer_dim ** 0.5, rows.dtype)
        return jnp.concatenate([hidden, rows.astype(self.dtype)], axis=-1)

    def decode_layers(self, hidden, positions, cache, final_norm: bool = True):
        c = self.config
        per_layer = None
        if c.per_layer_dim:
            d, lp = c.hidden_size, (c.num_layers, c.per_layer_dim)
            hidden, tokens = hidden[..., :d], hidden[..., d:].reshape(*hidden.shape[:-1], *lp)
            proj = linear(hidden, self.ple_model_proj[...]) * (d ** -0.5)
            proj = _norm(proj.reshape(*hidden.shape[:-1], *lp), self.ple_proj_norm[...], c.rms_norm_eps)
            per_layer = ((proj + tokens) * (2.0 ** -0.5)).astype(hidden.dtype)
        ropes = {c.layer_rope(i) for i in range(c.num_layers)} - {None}
        ctx = Gemma4Context(positions, {r: rope_cos_sin(positions, r, r.dim or c.head_dim) for r in ropes},
                            per_layer=per_layer)
        for i, layer in enumerate(self.layers):
            with jax.named_scope(f"layer_{i}"):
                hidden, cache = self.layer(i, hidden, layer.forward_weights(), cache, ctx)
        return (_norm(hidden, self.final_norm[...], c.rms_norm_eps) if final_norm else hidden), cache

    def _attention(self, i, x, w, cache, ctx: Gemma4Context):
        c = self.config
        lc = c.layer_config(i)
        b, t, _ = x.shape
        cos_sin = ctx.rope(c, i)
        src = c.kv_source[i]
        if src is None:
            q, k, v = project_qkv(lc, x, w)  # q, k normed per head
            v = _norm(v, None, c.rms_norm_eps)
            q, k = apply_rope(q, *cos_sin), apply_rope(k, *cos_sin)
            if i in c.kv_source:
                ctx.shared[i] = (k, v)
        else:
            q = linear(x, w["wq"], w.get("wq_scale")).reshape(b, t, lc.num_heads, lc.head_dim)
            q = apply_rope(_norm(q, w["q_norm"], c.rms_norm_eps), *cos_sin)
            k, v = ctx.shared[src]
        with jax.named_scope("attention"):
            attn, cache = cache.attend(c.kv_index(i), q, k, v, ctx.positions, c.attention_spec(i), None)
        return linear(attn.reshape(b, t, -1), w["wo"], w.get("wo_scale")), cache

    def layer(self, i, x, w, cache, ctx: Gemma4Context):
        c = self.config
        eps = c.rms_norm_eps
        h, cache = self._attention(i, _norm(x, w["attn_norm"], eps), w, cache, ctx)
        x = x + _norm(h, w["post_attn_norm"], eps)
        h = mlp(_norm(x, w["mlp_norm"], eps), w, c.activation)
        x = x + _norm(h, w["post_mlp_norm"], eps)
        if ctx.per_layer is not None:
            g = gated_input(linear(x, w["ple_gate"], w.get("ple_gate_scale")), ctx.per_layer[:, :, i], c.activation)
            h = linear(g, w["ple_proj"], w.get("ple_proj_scale"))
            x = x + _norm(h, w["ple_norm"], eps)
        return x * w["layer_scalar"].astype(x.dtype), cache


def gated_input(gate, per_layer_input, activation: str):
    """activation(gate) * the layer's per-layer input."""
    act = jax.nn.gelu(gate, approximate=activation != "gelu")
    return act * per_layer_input.astype(gate.dtype)
