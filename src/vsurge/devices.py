"""Where we run and what dtypes suit it."""

import jax
import jax.numpy as jnp


def platform() -> str:
    return jax.default_backend()


def default_dtype():
    """Weights: bfloat16 everywhere. On CPU the dots still accumulate in float32 (ops/linear.py):
    bf16 x bf16 -> f32 runs at twice the float32 rate on AVX512-BF16 CPUs and halves the bytes read."""
    return jnp.bfloat16


def compute_dtype(param_dtype):
    """Activations (residual stream, norms, attention, KV cache): float32 on CPU, where narrow
    elementwise math is emulated and slow; the weights' dtype on GPU/TPU."""
    return jnp.float32 if platform() == "cpu" else jnp.dtype(param_dtype)
