"""The gated delta decode step on an accelerator: ops/gated_delta_tpu.py's Pallas kernel (states updated where
they live) against XLA's gather, step and scatter, on the ~0.5B Qwen3.5 shape's layer (16 value heads of 128 x
128, bfloat16 states), against the bytes a layer must read and write.

    python benchmarks/tpu_gated_delta.py [--rows 32] [--slots 64]

Prints the largest difference between the two (outputs and the rows' new states) and each one's time per layer
(18 layers a call, as the shape has: the host's dispatch is not in it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from vsurge.ops.gated_delta import gated_delta_step  # noqa: E402
from vsurge.ops.gated_delta_tpu import gated_delta_pallas  # noqa: E402


def xla_form(inputs, states, slots, fresh, valid):
    """What the engine runs without the kernel (kv/recurrent._at_slots): gather, step, scatter."""
    start = jnp.where(fresh[:, None, None, None], 0.0, states[slots].astype(jnp.float32))
    out, new = gated_delta_step(*inputs, start, valid)
    return out, states.at[slots].set(new.astype(states.dtype))


LAYERS = 18  # the shape's Gated DeltaNet layers: one call runs as many, so the host's dispatch is not timed


def layers(fn):
    """fn applied LAYERS times to the same states in one program (each output kept: summed)."""
    def run(inputs, states, *rest):
        def one(i, carry):
            out, states = fn(inputs, carry[1], *rest)
            return carry[0] + jnp.sum(out.astype(jnp.float32)), states
        return jax.lax.fori_loop(0, LAYERS, one, (jnp.float32(0), states))
    return jax.jit(run, donate_argnums=1)


def timed(fn, args, reps: int = 10) -> float:
    """Median seconds of one layer."""
    many, states = layers(fn), args[1]
    for _ in range(2):
        total, states = many(args[0], states, *args[2:])
    jax.block_until_ready(states)
    times = []
    for _ in range(reps):
        began = time.perf_counter()
        total, states = many(args[0], states, *args[2:])
        jax.block_until_ready(states)
        times.append(time.perf_counter() - began)
    return statistics.median(times) / LAYERS


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--slots", type=int, default=64)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--interpret", action="store_true", help="Pallas interpret mode (a CPU)")
    args = p.parse_args()
    rng = np.random.default_rng(0)
    r, h, d = args.rows, args.heads, 128
    q, k = (x / np.linalg.norm(x, axis=-1, keepdims=True) for x in rng.standard_normal((2, r, h, d), np.float32))
    v = rng.standard_normal((r, h, d), np.float32)
    g = -np.abs(rng.standard_normal((r, h))).astype(np.float32)
    beta = (1 / (1 + np.exp(-rng.standard_normal((r, h))))).astype(np.float32)
    inputs = tuple(jnp.asarray(x) for x in (q, k, v, g, beta))
    states = jnp.asarray(0.5 * rng.standard_normal((args.slots + 1, h, d, d)), jnp.bfloat16)
    slots = jnp.asarray(rng.permutation(args.slots)[:r], jnp.int32)
    fresh = jnp.zeros((r,), bool).at[0].set(True)
    valid = jnp.ones((r,), bool).at[-1].set(False)
    kernel = lambda *a: gated_delta_pallas(*a, interpret=args.interpret)  # noqa: E731
    out_k, new_k = jax.jit(kernel)(inputs, states, slots, fresh, valid)
    out_x, new_x = jax.jit(xla_form)(inputs, states, slots, fresh, valid)
    out_err = float(jnp.max(jnp.abs(out_k - out_x)))
    state_err = float(jnp.max(jnp.abs(new_k.astype(jnp.float32) - new_x.astype(jnp.float32))))
    print(f"{jax.devices()[0].device_kind}: {r} rows, {h} heads of {d} x {d}, bfloat16 states in {args.slots + 1} "
          f"slots; kernel vs XLA: outputs differ by {out_err:.2e}, states by {state_err:.2e}", flush=True)
    layer_bytes = 2 * r * h * d * d * 2  # each row's state read and written once
    for name, fn in (("Pallas kernel, in place", kernel), ("XLA gather, step, scatter", xla_form)):
        seconds = timed(fn, (inputs, states.copy(), slots, fresh, valid))
        print(f"| {name} | {seconds * 1e6:.1f} us a layer | {layer_bytes / seconds / 1e9:.0f} GB/s of the "
              f"states' {layer_bytes / 2**20:.0f} MiB |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
