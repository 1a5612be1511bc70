"""Compiled engine programs kept on disk, found without tracing the model again.

JAX's persistent compilation cache skips XLA's compiler, but finding an entry
still means tracing and lowering the program: with 30 unrolled layers that is
~1 s per program, so a 21-program engine took ~25 s to start with a warm cache.
This store keys each serialized executable by what decides the program (vsurge's
source, the JAX version and backend, the model's config and weight shapes, the
engine config and the program's bucket) and loads it directly.

It lives beside JAX's cache (`<jax_compilation_cache_dir>/vsurge-programs`) and is
off when that cache is off. Sharded engines (a mesh) always compile.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import pickle
from pathlib import Path

import jax
import jaxlib

log = logging.getLogger(__name__)

SUBDIR = "vsurge-programs"


@functools.lru_cache(maxsize=1)
def _source_digest() -> str:
    """Every vsurge source file: a code change never loads an old program."""
    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _directory() -> Path | None:
    root = jax.config.jax_compilation_cache_dir
    return Path(root) / SUBDIR if root else None


def program_key(*parts) -> str:
    """A file name for the program decided by `parts` (each turned into text with repr)."""
    device = jax.devices()[0]
    described = [_source_digest(), jax.__version__, jaxlib.__version__,
                 device.platform, getattr(device, "device_kind", ""), jax.device_count(), *map(repr, parts)]
    return hashlib.sha256("\x00".join(map(str, described)).encode()).hexdigest()


def load(key: str):
    """The stored program, or None (absent, store off, or unreadable: then it is compiled again)."""
    directory = _directory()
    path = directory / f"{key}.bin" if directory else None
    if path is None or not path.exists():
        return None
    from jax.experimental.serialize_executable import deserialize_and_load

    try:
        payload, in_tree, out_tree = pickle.loads(path.read_bytes())
        return deserialize_and_load(payload, in_tree, out_tree)
    except Exception as e:  # noqa: BLE001: a stale or damaged file is only a cache miss
        log.warning("compiling again: stored program %s could not be loaded (%s)", path.name, e)
        return None


def save(key: str, compiled) -> None:
    directory = _directory()
    if directory is None:
        return
    from jax.experimental.serialize_executable import serialize

    try:
        directory.mkdir(parents=True, exist_ok=True)
        data = pickle.dumps(serialize(compiled))
        temporary = directory / f".{key}.{os.getpid()}.tmp"
        temporary.write_bytes(data)
        temporary.replace(directory / f"{key}.bin")  # atomic: a concurrent reader sees all or nothing
    except Exception as e:  # noqa: BLE001: not storing only costs the next start its tracing
        log.warning("could not store compiled program %s: %s", key, e)
