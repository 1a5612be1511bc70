"""One engine's programs compiled one at a time (no other compile running), each timed by phase, and whether
each serializes for vsurge's program store: where a TPU's start-up compile goes.

    python benchmarks/compile_probe.py [--model default|1b] [--max-slots 64] [--max-length 1024]
        [--attention-backend auto|tpu|xla] [--skip-engine] [--only decode|mixed] [--trace DIR]

--attention-backend xla against tpu: how much of a program's XLA time is the ragged kernel's (compiled once per
layer); --skip-engine compiles only the programs timed alone.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import vsurge  # noqa: E402
from vsurge.engine import compile_counts  # noqa: E402
from vsurge.engine.core import EngineCore  # noqa: E402
from vsurge.engine.engine_config import EngineConfig  # noqa: E402
from vsurge.engine.pools import make_pool  # noqa: E402


def compiler_events():
    """Profiler options that record the compiler's own passes (host level 3), not Python's calls."""
    options = jax.profiler.ProfileOptions()
    options.host_tracer_level, options.python_tracer_level = 3, 0
    return options


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="default")
    p.add_argument("--max-slots", type=int, default=64)
    p.add_argument("--max-length", type=int, default=1024)
    p.add_argument("--programs", type=int, default=4, help="how many programs to compile alone")
    p.add_argument("--attention-backend", default="auto")
    p.add_argument("--skip-engine", action="store_true", help="not the engine's whole compile first")
    p.add_argument("--only", default=None, help="time only programs of this kind (decode, mixed, ...)")
    p.add_argument("--trace", default=None, help="a perfetto trace of the first program's compile (XLA's passes)")
    args = p.parse_args()
    from vsurge.hardware.compilation_cache import use_compilation_cache

    use_compilation_cache(Path("/tmp/probe-cache"))
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.model == "default":
        model = vsurge.load("default", dtype=jnp.bfloat16, progress=False)[0]
    else:
        import roofline

        model = roofline.random_llama(roofline.SHAPES[args.model])
    processor = vsurge.loading.load_processor("default")
    config = EngineConfig(max_slots=args.max_slots, max_length=args.max_length,
                          attention_backend=args.attention_backend)
    engine = EngineCore(model, processor, config, make_pool(model, config, True))
    keys = engine.buckets()
    from vsurge.engine.program_store import ProgramStore

    store = ProgramStore.for_engine(engine)
    print(f"mesh {engine.mesh}; program store {store and store.folder}", flush=True)
    from vsurge.engine.program_store import fingerprint_parts
    import hashlib

    for i, part in enumerate(fingerprint_parts(engine, jax.eval_shape(engine._empty_state))):
        print(f"  part {i}: {hashlib.sha256(part.encode()).hexdigest()[:12]} {part[:300]!r}", flush=True)
    print(f"{len(keys)} programs: {keys}", flush=True)
    from jax.experimental import serialize_executable

    print(f"attention backend {engine.attention_backend}", flush=True)
    began = time.perf_counter()
    if not args.skip_engine:
        engine.compile(progress=False)  # every program through the engine's own path (the store included)
    print(f"engine.compile: {time.perf_counter() - began:.1f} s: {engine.compile_summary}; store "
          f"{engine._store and (engine._store.loaded, engine._store.saved)}", flush=True)
    big = sorted(keys, key=lambda k: (k[0] != "mixed", k[0] != "decode"))[:args.programs]
    if args.only:
        big = [key for key in keys if key[0] == args.only][-args.programs:]
    for i, key in enumerate(big):
        began = time.perf_counter()
        traced = jax.profiler.trace(f"{args.trace}/compile", profiler_options=compiler_events()) if args.trace and i == 0 \
            else contextlib.nullcontext()
        with traced, compile_counts.phases_of_this_thread() as phases:
            program = engine._lower_and_compile(key)
        seconds = time.perf_counter() - began
        print(f"alone: {compile_counts.program_line(key, seconds, phases)}", flush=True)
        try:
            blob, _, _ = serialize_executable.serialize(program)
            print(f"  serializes: {len(blob) / 1e6:.1f} MB", flush=True)
        except Exception:
            print("  does not serialize:", traceback.format_exc(limit=3), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
