"""Builds vsurge's C++ CPU kernels (src/vsurge/kernels) while the package installs.

Everything else about the package is in pyproject.toml. The extension is optional: without a C++
compiler, or without the XLA FFI headers (shipped inside jaxlib, which the build environment
installs), the package installs without it and vsurge's ops use their pure-XLA paths
(vsurge.kernels.unavailable_reason() says why).
"""

import os
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

KERNELS = Path("src/vsurge/kernels")


def ffi_include_dir() -> str | None:
    """jaxlib/include (what jax.ffi.include_dir() returns), found without importing jax."""
    try:
        import jaxlib
    except ImportError:
        return None
    include = Path(jaxlib.__file__).parent / "include"
    return str(include) if (include / "xla" / "ffi" / "api" / "ffi.h").exists() else None


class OptionalBuildExt(build_ext):
    """Builds the kernels when it can and says so; never fails the install."""

    def build_extension(self, ext):
        include = ffi_include_dir()
        if include is None:
            self.warn("vsurge kernels not built: jaxlib's XLA FFI headers were not found; "
                      "the pure-XLA path will be used")
            return
        ext.include_dirs.append(include)
        try:
            super().build_extension(ext)
        except Exception as e:  # no compiler, or one that cannot build it: install without the kernels
            self.warn(f"vsurge kernels not built ({type(e).__name__}: {e}); the pure-XLA path will be used")


qmatmul = Extension(
    "vsurge.kernels._qmatmul",
    sources=[str(KERNELS / f) for f in ("qmatmul_ffi.cc", "qmatmul_avx2.cc", "qmatmul_avx512.cc", "repack.cc",
                                           "thread_pool.cc", "paged_attention.cc", "kv_pages.cc", "recurrent_decode.cc", "moe_experts.cc",
                                           "sampling.cc")],
    depends=[str(KERNELS / f) for f in ("qmatmul.h", "qmatmul_body.h", "qmatmul_layout.h", "thread_pool.h", "half.h",
                                         "bf16.h", "isa.h")],
    language="c++",
    extra_compile_args=["-std=c++17", "-O3", "-g0", "-w", "-fvisibility=hidden"],
    extra_link_args=["-pthread"],
    optional=True,
)

ext_modules = [] if os.environ.get("VSURGE_NO_KERNELS") or sys.platform == "win32" else [qmatmul]
setup(ext_modules=ext_modules, cmdclass={"build_ext": OptionalBuildExt})
