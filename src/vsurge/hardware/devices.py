"""Where we run and what dtypes suit it."""

import os

import jax
import jax.numpy as jnp


def platform() -> str:
    return jax.default_backend()


NATIVE_BF16_ISAS = ("avx512_bf16", "amx")  # kernels.cpu_isa() names whose CPUs multiply bfloat16 natively


def xla_cpu_isa_cap() -> str | None:
    """The ISA XLA:CPU is capped to by XLA_FLAGS=--xla_cpu_max_isa=... (lower case), or None."""
    for flag in os.environ.get("XLA_FLAGS", "").split():
        if flag.startswith("--xla_cpu_max_isa="):
            return flag.split("=", 1)[1].lower()
    return None


def cpu_bf16_native() -> bool:
    """Whether XLA:CPU's bfloat16 dots run on native instructions here (AVX512-BF16 or AMX), where
    they are ~2x float32's; elsewhere XLA emulates them and they are slower than float32
    (issue 20: 20.7 vs 26.0 tok/s on an AVX2-only CPU)."""
    from .. import kernels

    cap = xla_cpu_isa_cap()
    if cap is not None and not cap.startswith("avx512"):
        return False  # XLA may not use AVX-512 (so no AVX512-BF16) at all
    return kernels.cpu_isa() in NATIVE_BF16_ISAS


def default_dtype():
    """Weights: bfloat16 on accelerators and on CPUs that multiply it natively (AVX512-BF16, AMX:
    bf16 x bf16 -> f32 dots at twice the float32 rate, half the bytes read; the dots accumulate in
    float32, ops/linear.py); float32 on other CPUs (AVX2-only), where bfloat16 dots are emulated."""
    if platform() == "cpu" and not cpu_bf16_native():
        return jnp.float32
    return jnp.bfloat16


def compute_dtype(param_dtype):
    """Activations (residual stream, norms, attention, KV cache): float32 on CPU, where narrow
    elementwise math is emulated and slow; the weights' dtype on GPU/TPU."""
    return jnp.float32 if platform() == "cpu" else jnp.dtype(param_dtype)


def release_freed_host_memory() -> None:
    """Hands the C heap's free pages back to the OS (glibc's malloc_trim): compiling a model's
    programs leaves hundreds of MB freed but resident (~0.4 GB for a 1B model's 11 programs), which
    would otherwise add to the peak when the KV pool is allocated next. A no-op elsewhere."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        if libc is not None and hasattr(libc, "malloc_trim"):
            libc.malloc_trim(0)
    except OSError:
        pass
