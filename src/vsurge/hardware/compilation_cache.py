"""JAX's persistent compilation cache, pointed at a directory: what the CLI's --compilation-cache, a
saved vInference (seed/vinference/persistence.py) and the test session use, so a later process loads
the compiled executables instead of compiling again."""

from __future__ import annotations

from pathlib import Path

import jax


def use_compilation_cache(directory: Path) -> None:
    """Point JAX's persistent compilation cache at `directory`, caching every executable."""
    from jax.experimental.compilation_cache import compilation_cache

    directory.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    compilation_cache.reset_cache()  # the cache binds its directory on first use


def stop_using_compilation_cache() -> None:
    from jax.experimental.compilation_cache import compilation_cache

    jax.config.update("jax_compilation_cache_dir", None)
    compilation_cache.reset_cache()
