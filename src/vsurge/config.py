"""Model configuration shared by every layer: frozen, hashable dataclasses.

A config is static under `jax.jit`, so every field must be hashable (tuples, not
lists). `ModelConfig` holds what every decoder family has; a family adds its own
fields in a subclass (models/families/<family>.py) and overrides the per-layer methods
below. Configs are built from an HF `config.json` or GGUF metadata by the
family's `config_from_hf` / `config_from_gguf`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

# Weight quantizations at load (vsurge.load's `quantization`, the CLI's --quantization).
# Kinds held as GGUF blocks for the block kernel -> (format, weights per scale):
BLOCK_QUANTIZATIONS = {"int4": ("q4_0", 32), "int4_g64": ("q4_0", 64), "int4_g128": ("q4_0", 128),
                       "q8_0": ("q8_0", 32), "int8_g64": ("q8_0", 64), "int8_g128": ("q8_0", 128)}
# blocks: keep a GGUF file's / an AWQ or GPTQ checkpoint's blocks; none: dequantize them; int8 / fp8:
# per-channel scales (fp8: float8_e4m3fn, for accelerators with fp8 arithmetic)
QUANTIZATIONS = ("blocks", "none", "int8", "fp8", *BLOCK_QUANTIZATIONS)


@dataclass(frozen=True)
class Rope:
    """Rotary position embedding of one layer.

    kind: "default", "linear" (positions divided by `factor`), "llama3" (Llama 3.1
    piecewise wavelength scaling), "yarn" (NTK-by-parts interpolation, DeepSeek /
    GPT-OSS / Qwen long context) or "longrope" (Phi-3 per-frequency factors).
    dim: how many leading dims of each head rotate (partial rotary); None = all.
    """

    kind: str = "default"
    theta: float = 10000.0
    dim: int | None = None
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    original_max_position_embeddings: int | None = None  # llama3, yarn, longrope
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    mscale: float | None = None  # yarn (DeepSeek): attention scaling numerator
    mscale_all_dim: float | None = None  # yarn (DeepSeek): ... and denominator
    attention_factor: float | None = None  # yarn / longrope: explicit cos/sin scaling
    truncate: bool = True  # yarn: round the correction range to whole dims (GPT-OSS: False)
    short_factor: tuple[float, ...] | None = None  # longrope, within the original context
    long_factor: tuple[float, ...] | None = None  # longrope, beyond it
    use_long_factor: bool = False  # longrope: which set this model runs with
    freq_factors: tuple[float, ...] | None = None  # per-frequency divisors (GGUF `rope_freqs.weight`)


@dataclass(frozen=True)
class AttentionSpec:
    """How one layer attends (static: part of the compiled program).

    scale: multiplies q.k (1/sqrt(head_dim) unless the family says otherwise).
    window: keys with q_pos - k_pos >= window are hidden (sliding-window layers).
    chunk: keys in another chunk of `chunk` positions than the query's are hidden (k_pos // chunk
        != q_pos // chunk: Llama 4's chunked local attention).
    softcap: scores become softcap * tanh(scores / softcap) (Gemma 2).
    sinks: the layer has a learned per-head sink logit in the softmax (GPT-OSS)."""

    scale: float
    window: int | None = None
    chunk: int | None = None
    softcap: float | None = None
    sinks: bool = False


@dataclass(frozen=True)
class KVLayer:
    """Shape of one layer's KV cache entries: `heads` KV heads of `k_dim` key and `v_dim`
    value dims (a latent cache is one head of the latent's width)."""

    heads: int
    k_dim: int
    v_dim: int


@dataclass(frozen=True)
class StateLayer:
    """Shapes of one recurrent layer's per-sequence state (kv/recurrent.py): name -> shape, e.g.
    ("conv", (K-1, C)) for a short convolution's window of inputs and ("ssm", (H, dk, dv)) for a
    linear-attention or Mamba-2 state. Held in float32, one row per sequence slot."""

    parts: tuple[tuple[str, tuple[int, ...]], ...]


@dataclass(frozen=True)
class ModelConfig:
    """Architecture hyper-parameters every decoder family has. Families subclass it."""

    architecture: str  # the family class's `name` (models/families/)
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope: Rope = Rope()
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False  # RMSNorm over head_dim of q and k before RoPE
    sliding_window: int | None = None
    # per layer "full" or "sliding" (None: every layer is sliding when sliding_window is set)
    layer_types: tuple[str, ...] | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    name: str = ""

    def __post_init__(self):
        if self.num_kv_heads and self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})"
            )
        if self.layer_types is not None and len(self.layer_types) != self.num_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries for {self.num_layers} layers")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def rope_theta(self) -> float:
        return self.rope.theta

    # ---------------------------------------------------------------- per layer (families override)
    def is_sliding(self, layer: int) -> bool:
        if self.sliding_window is None:
            return False
        return self.layer_types is None or self.layer_types[layer] == "sliding"

    def attention_spec(self, layer: int) -> AttentionSpec:
        return AttentionSpec(scale=self.head_dim**-0.5,
                             window=self.sliding_window if self.is_sliding(layer) else None)

    def layer_rope(self, layer: int) -> Rope | None:
        """The rotary embedding of `layer` (None: the layer uses no positions, NoPE)."""
        return self.rope

    def layer_kind(self, layer: int) -> str:
        """"attention" (a KV cache), a recurrent kind holding a fixed-size state per sequence
        ("linear_attention", "mamba2", "short_conv"), "attention+mamba2" (both side by side in one
        layer: Falcon-H1), or "mlp" (neither: Nemotron-H's MLP-only layers); hybrid families override."""
        return "attention"

    @property
    def attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.num_layers) if self.layer_kind(i).startswith("attention"))

    @property
    def recurrent_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.num_layers) if self.layer_kind(i) not in ("attention", "mlp"))

    def kv_index(self, layer: int) -> int:
        """The layer's entry in `kv_layout` (its index among the attention layers)."""
        attention = self.attention_layers
        return layer if len(attention) == self.num_layers else attention.index(layer)

    def state_index(self, layer: int) -> int:
        """The layer's entry in `state_layout` (its index among the recurrent layers)."""
        return self.recurrent_layers.index(layer)

    @property
    def kv_layout(self) -> tuple[KVLayer, ...]:
        """One entry per attention layer."""
        return tuple(KVLayer(self.num_kv_heads, self.head_dim, self.head_dim) for _ in self.attention_layers)

    @property
    def state_layout(self) -> tuple[StateLayer, ...]:
        """One entry per recurrent layer (hybrid families override)."""
        return ()

    def for_tensor_parallel(self, tp: int) -> "ModelConfig":
        """The config to run at tensor-parallel size tp: query heads and MLP units split evenly; KV
        heads are replicated up to lcm(KV heads, tp) when tp does not divide them (as vLLM does),
        which needs that many query-head groups."""
        if self.num_heads % tp:
            raise ValueError(f"tensor_parallel_size {tp} must divide the model's {self.num_heads} attention heads")
        for what, size in self.split_sizes().items():
            if size % tp:
                raise ValueError(f"tensor_parallel_size {tp} must divide the model's {what} {size}")
        kv = math.lcm(self.num_kv_heads, tp)
        if self.num_heads % kv:
            raise ValueError(f"tensor_parallel_size {tp}: the {self.num_kv_heads} KV heads would be replicated "
                             f"to {kv}, which does not divide the {self.num_heads} query heads")
        return self.replace(num_kv_heads=kv)

    def split_sizes(self) -> dict[str, int]:
        """The widths tensor parallelism splits besides the heads (what -> size)."""
        return {"intermediate size": self.intermediate_size}

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)
