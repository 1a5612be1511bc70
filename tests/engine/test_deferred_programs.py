"""Step programs compiled after the engine is ready (engine/deferred_programs.py): start-up compiles what every
step can fall back to, steps never wait for a background compile, and the tokens are the reference's."""

from __future__ import annotations

import asyncio
import threading

import jax.numpy as jnp
import pytest

PROMPTS = ["one two three one two three one two", "The ducks of the river ran past the mill",
           "a b c d e f g h i j k l m n o p q r s t u v w x y z a b c d e f g h i j k l m n o p", "Hi"]


def surge_of(tiny_checkpoints, compile_at_start: str):
    import vsurge
    from vsurge import EngineConfig, vSurge

    model, processor = vsurge.load(tiny_checkpoints["llama"][0], dtype=jnp.float32, progress=False)
    config = EngineConfig(max_slots=8, max_length=96, prefill_tokens=256, page_size=16, decode_steps=2,
                          compile_at_start=compile_at_start)
    return vSurge.create_odriver(model, processor, config=config), model, processor


def test_steps_use_only_compiled_programs_until_the_background_is_done(tiny_checkpoints):
    from vsurge import SamplingParams
    from vsurge.engine import deferred_programs
    from vsurge.engine.program_kinds import DECODE, MIXED, kind_of
    from vsurge.server.stats import programs_compiling
    from dense_generator import greedy_generate

    surge, model, processor = surge_of(tiny_checkpoints, "serving")
    engine = surge.engine
    gate, requested = threading.Event(), []
    build, built = engine._build, engine._built

    def held_build(key):  # the background compiles wait until the test lets them go
        if threading.current_thread().name.startswith("vsurge-deferred"):
            gate.wait(120)
        return build(key)

    def recorded_built(key):  # what a step asks for, and whether it was compiled then
        requested.append((key, key in engine._compiled))
        return built(key)

    engine._build, engine._built = held_build, recorded_built
    surge.compile()
    start = {key for key in engine.buckets() if deferred_programs.at_start(engine, key)}
    assert set(engine._compiled) == start  # nothing else yet: the rest is held
    assert engine.deferred.pending == len(engine.buckets()) - len(start) > 0
    assert programs_compiling(surge) == engine.deferred.pending  # what /v1/stats says
    c = engine.config
    assert {key for key in start if kind_of(key) is DECODE} == {DECODE.key(max(c.decode_rows), w) for w in c.page_windows}
    assert {key[2] for key in start if kind_of(key) is MIXED} == deferred_programs.start_shapes(c)

    surge.start()
    try:
        params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
        want = [greedy_generate(model, processor.encode(p), 12) for p in PROMPTS]
        got = [r.token_ids for r in asyncio.run(surge.generate(PROMPTS, params))]
        assert got == want
        (alone,) = asyncio.run(surge.generate(PROMPTS[3], params))  # one row: would take the 2-row programs
        assert alone.token_ids == want[3]
        stepped = [key for key, _ in requested if kind_of(key) in (DECODE, MIXED)]
        assert stepped and all(key in start for key in stepped), stepped  # no step waited for a compile
        assert all(ready for key, ready in requested if kind_of(key) in (DECODE, MIXED))

        gate.set()
        assert engine.deferred.wait(120) and engine.deferred.pending == 0 == programs_compiling(surge)
        assert set(engine._compiled) == set(engine.buckets())
        requested.clear()
        (alone,) = asyncio.run(surge.generate(PROMPTS[3], params))
        assert alone.token_ids == want[3]
        smallest = DECODE.key(min(c.decode_rows), max(c.page_windows))
        assert smallest in [key for key, _ in requested]  # now the one-row step takes its own program
    finally:
        gate.set()
        surge.stop(5)


def test_stopping_drops_the_queued_compiles_and_waits_for_the_running_one(tiny_checkpoints):
    """A server stopping while programs compile: an XLA compile running at interpreter exit aborted the process
    (a TPU, SIGTERM), so stop waits for the running compiles and fails the queued ones by name."""
    surge, _, _ = surge_of(tiny_checkpoints, "serving")
    engine, gate, running = surge.engine, threading.Event(), threading.Event()
    build = engine._build

    def held_build(key):
        if threading.current_thread().name.startswith("vsurge-deferred"):
            running.set()
            gate.wait(120)
        return build(key)

    engine._build = held_build
    surge.compile()
    surge.start()
    assert running.wait(60)
    stopping = threading.Thread(target=surge.stop, args=(5,))
    stopping.start()
    stopping.join(1.0)
    assert stopping.is_alive()  # waiting for the compile that runs
    dropped = [f for f in engine.deferred.futures if f.done() and f.exception() is not None]
    assert dropped and all("the engine stopped" in str(f.exception()) for f in dropped)
    gate.set()
    stopping.join(120)
    assert not stopping.is_alive() and not any(t.is_alive() for t in engine.deferred._threads)
    assert engine.deferred.wait(30) and engine.deferred.stopped


def test_a_cpu_compiles_every_program_before_it_is_ready_by_default(tiny_checkpoints):
    surge, _, _ = surge_of(tiny_checkpoints, "auto")
    surge.compile()
    assert set(surge.engine._compiled) == set(surge.engine.buckets())
    assert not surge.engine.deferred.active and surge.engine.deferred.wait(0)


def test_the_flag_takes_the_three_modes_and_names_a_bad_one(capsys):
    from vsurge.cli.arguments import build_parser

    assert build_parser().parse_args(["serve", "--compile-at-start", "serving"]).compile_at_start == "serving"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--compile-at-start", "later"])
    assert "--compile-at-start" in capsys.readouterr().err
