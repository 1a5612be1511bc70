"""vsurge's C++ CPU kernels, loaded with ctypes and registered as XLA FFI custom calls.

The shared library `_qmatmul*.so` is built when the package installs (setup.py; optional: without
a compiler the package installs without it). `available()` says whether it loaded; when it did
not, `unavailable_reason()` says why and vsurge's ops use their pure-XLA paths.

Switches (read when the library loads):
  VSURGE_CPU_ISA=avx2|avx512   cap the kernel's ISA (avx2 reproduces an AVX2-only CPU here);
                 none          do not use the kernels at all
  VSURGE_KERNEL=avx2|avx512|avx512_vnni   one kernel variant exactly
  VSURGE_KERNEL_THREADS=N      the kernel's threads (default: the CPUs this process may use)
"""

from __future__ import annotations

import ctypes
import functools
import importlib.machinery
import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

FFI_TARGET = "vsurge_qmatmul"
REAL_ROWS_TARGET = "vsurge_qmatmul_real_rows"  # the same for the rows a mask marks real (a step's padding skipped)
ATTENTION_TARGET = "vsurge_paged_decode"  # paged_attention.cc: decode rows' attention over their pages
KV_WRITE_TARGET = "vsurge_kv_write"  # kv_pages.cc: K/V vectors written into a 16-bit float cache in place
GATHER_PAGES_TARGET = "vsurge_gather_pages"  # kv_pages.cc: pages of a 16-bit float cache read as float32
TAKE_PAGES_TARGET = "vsurge_take_pages"  # kv_pages.cc: whole pages copied out of a cache
PUT_PAGES_TARGET = "vsurge_put_pages"  # kv_pages.cc: whole pages written into a cache in place
GATED_DELTA_TARGET = "vsurge_gated_delta_decode"  # recurrent_decode.cc: decode rows' DeltaNet states updated in place
MOE_TARGET = "vsurge_moe_experts"  # moe_experts.cc: routed experts of a few rows, read in place in their stacks
CONV_TARGET = "vsurge_conv_decode"  # recurrent_decode.cc: decode rows' short-convolution windows updated in place
GREEDY_TARGET = "vsurge_greedy"  # sampling.cc: greedy tokens after the mask and the penalties, in one pass
LAYOUT_VERSION = 9  # vsurge_qmatmul_layout_version() of a library that matches ops/quant_layout.py and its calls
_DISABLED = ("none", "off", "xla")


class _Library:
    def __init__(self):
        self.lib: ctypes.CDLL | None = None
        self.reason: str | None = None
        self._load()

    def _load(self) -> None:
        if os.environ.get("VSURGE_CPU_ISA", "").lower() in _DISABLED or \
                os.environ.get("VSURGE_KERNEL", "").lower() in _DISABLED:
            self.reason = "disabled by VSURGE_CPU_ISA / VSURGE_KERNEL"
            return
        path = library_path()
        if path is None:
            self.reason = (f"no compiled kernel library in {Path(__file__).parent}: it is built when the package "
                           "installs where a C++ compiler is found (the install log says why it was not); "
                           "`python setup.py build_ext --inplace` builds it in a source tree")
            return
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as e:
            self.reason = f"could not load {path.name}: {e}"
            return
        for name, restype, argtypes in (("vsurge_qmatmul_variant", ctypes.c_char_p, []),
                                        ("vsurge_qmatmul_supported", ctypes.c_char_p, []),
                                        ("vsurge_qmatmul_set_variant", ctypes.c_int, [ctypes.c_char_p]),
                                        ("vsurge_qmatmul_threads", ctypes.c_int, []),
                                        ("vsurge_qmatmul_layout_version", ctypes.c_int, []),
                                        ("vsurge_repack", ctypes.c_int, [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64,
                                                                         ctypes.c_int64, ctypes.c_void_p])):
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = restype, argtypes
        if lib.vsurge_qmatmul_layout_version() != LAYOUT_VERSION:
            self.reason = f"{path.name} is from another version of vsurge (rebuild it)"
            return
        if not lib.vsurge_qmatmul_variant():
            self.reason = "the kernels need AVX2 + FMA + F16C (x86-64), which this CPU lacks"
            return
        import jax

        jax.ffi.register_ffi_target(FFI_TARGET, jax.ffi.pycapsule(lib.vsurge_qmatmul_ffi), platform="cpu")
        jax.ffi.register_ffi_target(REAL_ROWS_TARGET, jax.ffi.pycapsule(lib.vsurge_qmatmul_real_rows_ffi),
                                    platform="cpu")
        jax.ffi.register_ffi_target(ATTENTION_TARGET, jax.ffi.pycapsule(lib.vsurge_paged_decode_ffi), platform="cpu")
        jax.ffi.register_ffi_target(KV_WRITE_TARGET, jax.ffi.pycapsule(lib.vsurge_kv_write_ffi), platform="cpu")
        for target, fn in ((GATHER_PAGES_TARGET, lib.vsurge_gather_pages_ffi),
                           (GATED_DELTA_TARGET, lib.vsurge_gated_delta_decode_ffi),
                           (CONV_TARGET, lib.vsurge_conv_decode_ffi), (MOE_TARGET, lib.vsurge_moe_experts_ffi),
                           (TAKE_PAGES_TARGET, lib.vsurge_take_pages_ffi), (PUT_PAGES_TARGET, lib.vsurge_put_pages_ffi),
                           (GREEDY_TARGET, lib.vsurge_greedy_ffi)):
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(fn), platform="cpu")
        self.lib = lib


def library_path() -> Path | None:
    here = Path(__file__).parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = here / f"_qmatmul{suffix}"
        if candidate.exists():
            return candidate
    return None


@functools.cache
def _library() -> _Library:
    lib = _Library()
    if lib.reason:
        logger.info("vsurge CPU kernels not used: %s", lib.reason)
    return lib


def available() -> bool:
    """True when the kernels are loaded and registered with XLA (for the CPU platform)."""
    return _library().lib is not None


def unavailable_reason() -> str | None:
    return _library().reason


def variant() -> str | None:
    """The kernel variant in use: "avx2", "avx512" or "avx512_vnni" (None without the kernels)."""
    lib = _library().lib
    return lib.vsurge_qmatmul_variant().decode() if lib else None


def supported_variants() -> list[str]:
    """Variants this CPU runs, fastest first."""
    lib = _library().lib
    return lib.vsurge_qmatmul_supported().decode().split(",") if lib else []


def set_variant(name: str) -> str:
    """Selects a variant (or "auto") for the following calls, compiled programs included; returns
    the previous one. Raises ValueError for a variant this CPU cannot run."""
    lib = _library().lib
    if lib is None:
        raise RuntimeError(f"vsurge CPU kernels not available: {unavailable_reason()}")
    previous = variant()
    if lib.vsurge_qmatmul_set_variant(name.encode()) != 0:
        raise ValueError(f"kernel variant {name!r} does not run on this CPU (it runs {supported_variants()})")
    return previous


def tracing_for_cpu() -> bool:
    """Whether the program being traced runs on CPU (the default backend, as every kernel choice here).
    Decided when tracing rather than with lax.platform_dependent, which traces and lowers every
    branch: the XLA fallbacks of each matmul and attention call were ~40% of an engine's start-up
    with its programs in the compilation cache."""
    import jax

    return jax.default_backend() == "cpu"


def unsplit() -> bool:
    """Whether the program being traced runs on one device: a custom call would gather a sharded
    array whole before it."""
    import jax

    mesh = jax.sharding.get_abstract_mesh()
    return mesh.empty or mesh.size == 1


def call_serves(dtype, dtypes) -> bool:
    """Whether a kernel's custom call serves an array of `dtype` in the program being traced: a CPU
    program (decided when tracing, by the default backend: under lax.platform_dependent's conditional
    XLA could not update a pool in place), the kernels loaded, `dtype` among `dtypes`, one device."""
    import jax
    import jax.numpy as jnp

    return tracing_for_cpu() and available() and \
        jnp.dtype(dtype) in {jnp.dtype(d) for d in dtypes} and unsplit()


def in_place_usable(states) -> bool:
    """Whether the recurrent-state kernels (recurrent_decode.cc) update `states` (S, ...) in place."""
    import jax.numpy as jnp

    return call_serves(states.dtype, (jnp.float32, jnp.bfloat16))


def repack(format_id: int, raw, n: int, k: int, tiles: int, tile_bytes: int):
    """GGUF blocks (N, bytes per row) uint8 -> tiles (tiles, tile_bytes) uint8 in C++ (None without the
    library: ops/quant_layout.py's numpy repacker writes the same bytes)."""
    import numpy as np

    lib = _library().lib
    if lib is None:
        return None
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    out = np.empty((tiles, tile_bytes), np.uint8)
    if lib.vsurge_repack(format_id, raw.ctypes.data, n, k, out.ctypes.data) != 0:
        raise ValueError(f"cannot repack format {format_id} with (N, K) = ({n}, {k})")
    return out


def threads() -> int:
    lib = _library().lib
    return lib.vsurge_qmatmul_threads() if lib else 0


def cpu_isa() -> str:
    """The CPU's vector ISA as vsurge names it: "amx", "avx512_bf16", "avx512", "avx2" or "baseline"
    (from /proc/cpuinfo; "unknown" where that is not readable). Capped by VSURGE_CPU_ISA=avx2."""
    try:
        flags = set()
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        return "unknown"
    avx2 = {"avx2", "fma", "f16c"} <= flags
    avx512 = avx2 and {"avx512f", "avx512bw", "avx512vl"} <= flags
    if os.environ.get("VSURGE_CPU_ISA", "").lower() == "avx2":
        avx512 = False
    if avx512 and {"amx_tile", "amx_int8", "amx_bf16"} <= flags:
        return "amx"
    if avx512 and "avx512_bf16" in flags:
        return "avx512_bf16"
    if avx512:
        return "avx512"
    return "avx2" if avx2 else "baseline"
