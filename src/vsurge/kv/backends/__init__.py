"""Attention backends: each owns its KV page layout, its K/V write and its decode / mixed-prefill attention.

    cpu   pages laid out for the CPU: keys (P, KVH, dk, ps), values (P, KVH, ps, dv) (kv/paged.py), read by
          vsurge's C++ decode kernel where it serves (kv/cpu_attention.py), XLA's page-column loop elsewhere
    xla   the same layout, XLA's page-column loop only (any device; the reference the others are tested against)
    gpu   the same layout; decode rows through JAX's Triton paged-attention kernel (kv/kernels.py), which
          re-lays the layer's pages every step: opt-in
    tpu   pages in the ragged-paged-attention layout (P, ps, 2 KVH / f, f dk): keys and values interleaved, written
          in place, every row of a step (decode and prompt chunks) in one call of JAX's Pallas kernel (tpu.py)

`EngineConfig.attention_backend` chooses one ("auto": tpu on a TPU, cpu on a CPU, xla elsewhere); the
engine's `PagedAttentionCache` carries the choice (a static field) and asks its backend for the pools'
shapes (`init_pools`) and for each layer's write + attention (`attend`). Everything that moves whole pages
(prefix copies, tiers, transfers) takes and puts pages along the first axis, which every layout shares.
"""

from __future__ import annotations

from .. import ATTENTION_BACKENDS as CHOICES
from . import columns, tpu

BACKENDS = {"cpu": columns.CPU, "xla": columns.XLA, "gpu": columns.GPU, "tpu": tpu.TPU}


def resolve(name: str | None, platform: str | None = None) -> str:
    """The backend `name` stands for on `platform` (jax.default_backend() when None): "auto" / None picks
    tpu on a TPU, cpu on a CPU and xla elsewhere."""
    if name not in (None, "auto"):
        if name not in BACKENDS:
            raise ValueError(f"attention_backend must be one of {', '.join(CHOICES)}, got {name!r}")
        return name
    if platform is None:
        import jax

        platform = jax.default_backend()
    return {"tpu": "tpu", "cpu": "cpu"}.get(platform, "xla")


def get(name: str):
    """The backend object of a resolved name."""
    return BACKENDS[name]
