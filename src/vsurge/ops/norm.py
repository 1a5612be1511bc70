"""RMSNorm and LayerNorm, computed in float32 like the HF references, cast back to the input dtype."""

import jax
import jax.numpy as jnp


def rms_norm(x: jax.Array, weight: jax.Array | None, eps: float) -> jax.Array:
    """x: (..., D), weight: (D,) or None (a norm without weights: Llama 4's q/k) -> (..., D) in x.dtype."""
    x32 = x.astype(jnp.float32)
    variance = jnp.mean(x32 * x32, axis=-1, keepdims=True)
    normed = x32 * jax.lax.rsqrt(variance + eps)
    if weight is None:
        return normed.astype(x.dtype)
    return (normed.astype(x.dtype) * weight.astype(x.dtype)).astype(x.dtype)


def layer_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """Mean-centred LayerNorm without a bias (Cohere): x (..., D), weight (D,) -> (..., D) in x.dtype."""
    x32 = x.astype(jnp.float32)
    centred = x32 - jnp.mean(x32, axis=-1, keepdims=True)
    normed = centred * jax.lax.rsqrt(jnp.mean(centred * centred, axis=-1, keepdims=True) + eps)
    return (weight.astype(jnp.float32) * normed).astype(x.dtype)
