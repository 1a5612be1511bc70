"""The XLA flags of the processes the suite starts.

Tests compile thousands of small programs and run most a few times, so LLVM's optimisation passes
cost more than they save: at level 0 XLA:CPU compiles ~30% faster (tests/models/test_models_vs_transformers.py:
43 -> 30 s of compiling on a 2-core Xeon; level 1 saves nothing). The HLO passes (fusion, layout) are
unchanged and the float arithmetic is the same (no fast-math at any level), so results do not move.
XLA:CPU's older elemental emitters (--xla_cpu_use_fusion_emitters=false) compile the same fusions in
about half the time again: two hybrid families' engine tests (tests/models/test_hybrid_families.py) 28-31 ->
12-15 s of compiling, 2026-12-06 on a 2-core AMD EPYC.
The pytest workers and the check scripts (sharding, disaggregation, the family server) run at level 0.
`vsurge serve` and the CLI run as users run them, at XLA's default level: they answer many requests
(the schemathesis run over a tiny server took 92 s at level 0, 53 s at the default); a server that
compiles the default model cold to answer one request passes env={"XLA_FLAGS": xla_flags()} (test_lora_server's
--enable-lora start: 19.7 -> 17.0 s of compiling). Benchmarks never set it. VSURGE_TEST_XLA_OPTIMIZE=1 runs everything at the default level.
"""

from __future__ import annotations

import os

SUITE_FLAGS = "" if os.environ.get("VSURGE_TEST_XLA_OPTIMIZE") == "1" else \
    "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"


def xla_flags(*extra: str) -> str:
    """The suite's flags followed by `extra` (device counts, ISA caps)."""
    return " ".join(flag for flag in (SUITE_FLAGS, *extra) if flag)


def at_default_level(env: dict) -> dict:
    """`env` with the suite's flags taken out of XLA_FLAGS (a served process or a CLI run)."""
    flags = [f for f in env.get("XLA_FLAGS", "").split() if f not in SUITE_FLAGS.split()]
    out = {k: v for k, v in env.items() if k != "XLA_FLAGS"}
    return {**out, "XLA_FLAGS": " ".join(flags)} if flags else out
