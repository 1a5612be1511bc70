"""Where we run and what dtype suits it."""

import jax
import jax.numpy as jnp


def platform() -> str:
    return jax.default_backend()


def default_dtype():
    # XLA:CPU runs bfloat16 matmuls ~4x slower than float32; accelerators prefer bfloat16.
    return jnp.float32 if platform() == "cpu" else jnp.bfloat16
