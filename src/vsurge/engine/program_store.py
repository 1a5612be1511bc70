"""An engine's compiled programs saved whole, so a restart loads them without tracing the model again.

JAX's persistent compilation cache skips XLA's compile but not Python: its key is the lowered program, so
every start still traces and lowers each program first. On a TPU that was most of a cached start: 22
programs of the default model took 27 s from that cache, 18 s of each mixed program in tracing (threads
tracing at once share one interpreter). This store keys a program by what it is built from instead (the
engine's fingerprint below and the program's key) and keeps the executable JAX serializes
(`jax.experimental.serialize_executable`), next to JAX's cache: `<cache dir>/vsurge-programs/<fingerprint>/`.

The fingerprint covers everything that changes what tracing makes: vsurge's own files (source and kernels),
JAX's version, the devices, the environment's VSURGE_* / XLA / JAX variables, JAX's settings, the model's
structure, weights' shapes, dtypes and shardings, the engine's config and its KV state's shapes. Anything
else that could change a program (a module patched at run time) is not seen.

On by default on an accelerator, off on a CPU (VSURGE_PROGRAM_STORE=1 / 0 turns it on / off anywhere): on a CPU,
an executable XLA:CPU serialized in one process and loaded in another failed when run ("NOT_FOUND: Function
wrapped_broadcast.6 not found": the default model's init program, two Ray replicas starting at once, one loading
what the other had just stored), so a start could fail, and a CPU's programs compile in seconds anyway. On a TPU
v5e `vsurge serve` of the default model was ready in 23.5 s from the store against 37.5 s from JAX's cache (63.3 s
cold), its programs answering the same greedy text as freshly compiled ones (`bash benchmarks/tpu.sh server`).
A file that fails to load is compiled again and replaced; a program that cannot be serialized is
simply not stored.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import pickle
import threading
from pathlib import Path

import jax

log = logging.getLogger(__name__)

SWITCH_ENV = "VSURGE_PROGRAM_STORE"  # "1" / "0": programs are / are not stored and loaded (default: accelerators)
FOLDER = "vsurge-programs"
KEEP = 4  # fingerprints kept (engines of several models or configs share one cache folder)
_ENV_PREFIXES = ("VSURGE_", "XLA_", "JAX_", "LIBTPU_", "TPU_")
_JAX_SETTINGS = ("jax_default_matmul_precision", "jax_enable_x64", "jax_default_prng_impl",
                 "jax_threefry_partitionable", "jax_numpy_dtype_promotion")


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """sha256 of vsurge's own files (Python and the C++ kernels' libraries): any edit makes a new store."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".so") and p.is_file()):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _avals(tree) -> str:
    """Shapes, dtypes and shardings of a pytree's leaves, with its structure."""
    leaves, treedef = jax.tree.flatten(tree)
    return repr(treedef) + "".join(f"|{getattr(x, 'shape', ())}{getattr(x, 'dtype', '')}{getattr(x, 'sharding', '')}"
                                   for x in leaves)


# EngineConfig fields no compiled program depends on (the host's side: sizes of host tiers, timings, the
# scheduler's policy, seeds drawn on the host); a byte count only says whether its tier exists. An accelerator's
# default host tier is a quarter of the RAM free at start, different at every start.
_HOST_SIDE = ("decode_call_ms", "hbm_utilization", "prefix_wait_steps", "kv_cache_dir", "seed",
              "scheduling_policy", "step_timeout", "image_cache_mb", "async_scheduling", "compile_at_start")
_TIER_BYTES = ("kv_host_cache_bytes", "kv_disk_cache_bytes", "kv_disk_prefetch_bytes")


def programs_config(config) -> str:
    """The engine config as its programs see it."""
    import dataclasses

    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name not in _HOST_SIDE}
    fields.update({name: bool(fields[name]) for name in _TIER_BYTES if name in fields})
    return repr(sorted(fields.items()))


def fingerprint_parts(engine, abstract_state) -> list[str]:
    from ..hardware.devices import platform

    devices = jax.devices()
    return [
        code_digest(), jax.__version__, getattr(jax.lib, "__version__", ""), platform(),
        repr([(d.platform, getattr(d, "device_kind", ""), d.id) for d in devices]), str(jax.process_count()),
        repr(sorted((k, v) for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES) and k != SWITCH_ENV)),
        repr([(name, getattr(jax.config, name, None)) for name in _JAX_SETTINGS]),
        repr(engine.graphdef), _avals(engine.graphstate), _avals(engine.graphother), programs_config(engine.config),
        repr(engine.model.config), _avals(abstract_state), repr(engine.input_partition_spec), repr(engine.mesh),
    ]


def engine_fingerprint(engine, abstract_state) -> str:
    return hashlib.sha256("\n".join(fingerprint_parts(engine, abstract_state)).encode()).hexdigest()[:24]


def store_folder() -> Path | None:
    """Where programs are stored: beside JAX's persistent cache when one is set (vsurge serve's --compilation-cache,
    vInference's save), on an accelerator or with VSURGE_PROGRAM_STORE=1 (0: never)."""
    from ..hardware.devices import platform

    cache = jax.config.jax_compilation_cache_dir
    switch = os.environ.get(SWITCH_ENV, "")
    if not cache or switch == "0" or (switch != "1" and platform() == "cpu"):
        return None
    return Path(cache).expanduser() / FOLDER


class ProgramStore:
    """Compiled programs of one engine (one fingerprint), one file per program key."""

    def __init__(self, folder: Path, fingerprint: str):
        self.folder = folder / fingerprint
        self.loaded, self.saved = 0, 0
        self._lock = threading.Lock()

    @classmethod
    def for_engine(cls, engine) -> "ProgramStore | None":
        folder = store_folder()
        # sharded programs (and multi-host ones) keep JAX's cache alone; a one-device mesh is what an
        # accelerator's weights are placed on
        if folder is None or jax.process_count() > 1 or (engine.mesh is not None and engine.mesh.size > 1):
            return None
        return cls(folder, engine_fingerprint(engine, jax.eval_shape(engine._empty_state)))

    def _path(self, key: tuple) -> Path:
        return self.folder / (hashlib.sha256(repr(key).encode()).hexdigest()[:32] + ".bin")

    def load(self, key: tuple):
        """The stored program of `key`, or None (not stored, or unreadable: then compiled again)."""
        from jax.experimental import serialize_executable

        path = self._path(key)
        if not path.exists():
            return None
        try:
            stored_key, blob, in_tree, out_tree = pickle.loads(path.read_bytes())
            if stored_key != repr(key):
                return None
            program = serialize_executable.deserialize_and_load(blob, in_tree, out_tree)
        except Exception as exc:  # a truncated file, another jaxlib's executable: compile instead
            log.warning("stored program %s could not be loaded (%r); compiling it", key, exc)
            return None
        with self._lock:
            self.loaded += 1
        return program

    def save(self, key: tuple, program) -> None:
        from jax.experimental import serialize_executable

        try:
            blob, in_tree, out_tree = serialize_executable.serialize(program)
            data = pickle.dumps((repr(key), blob, in_tree, out_tree))
        except Exception as exc:  # e.g. host callbacks: such a program is compiled at every start
            log.warning("program %s is not stored (compiled at every start): %r", key, exc)
            return
        if not self.folder.exists():
            self.folder.mkdir(parents=True, exist_ok=True)
            self._prune()
        path = self._path(key)
        partial = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        partial.write_bytes(data)
        partial.replace(path)  # whole or absent: a reader never sees half a file
        with self._lock:
            self.saved += 1

    def _prune(self) -> None:
        """Keep the KEEP newest fingerprints' folders: an edit or another config makes a new one, and a TPU's
        programs are large (the default model's 22: ~1.3 GB)."""
        import shutil

        folders = sorted((p for p in self.folder.parent.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
        for old in folders[:-KEEP]:
            shutil.rmtree(old, ignore_errors=True)
