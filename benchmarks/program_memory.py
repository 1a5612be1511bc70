"""Memory each compiled program holds: loads a model, builds a paged engine (32 slots, 2048 tokens,
a small page pool) and compiles its programs one at a time, printing after each the process's
anonymous resident memory and glibc's heap in use (after gc and malloc_trim).

    python benchmarks/program_memory.py --model FILE [--cache-dir DIR]

With --cache-dir the programs go through JAX's persistent compilation cache: run it twice to see
executables loaded from the cache instead of compiled.
"""

from __future__ import annotations

import argparse
import ctypes
import gc


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--cache-dir", default=None)
    args = p.parse_args(argv)

    import jax

    if args.cache_dir:
        jax.config.update("jax_compilation_cache_dir", args.cache_dir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    import vsurge
    from vsurge import kernels
    from vsurge.engine.engine_config import EngineConfig

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2

    def report(label: str) -> None:
        gc.collect()
        libc.malloc_trim(0)
        anon = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("RssAnon"))
        print(f"| {label} | {anon / 1024:.1f} | {libc.mallinfo2().uordblks / 2**20:.1f} |", flush=True)

    print(f"CPU ISA {kernels.cpu_isa()}; persistent cache: {args.cache_dir or 'off'}\n")
    print("| after | RssAnon MiB | heap in use MiB |\n|---|---|---|")
    model, processor = vsurge.load(args.model, progress=False)
    engine = vsurge.oEngine(model, processor, config=EngineConfig(max_slots=32, max_length=2048, num_pages=64))
    report("loading, engine made")
    for key in engine.buckets():
        engine._program(key)
        report(" ".join(str(part) for part in key))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
