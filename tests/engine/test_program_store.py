"""Compiled programs stored whole (engine/program_store.py): a second engine of the same model and config
loads every program without tracing and answers the same; anything else that differs compiles anew; a
broken file is compiled again; the switch turns it off."""

from __future__ import annotations

import asyncio
import logging

import jax
import pytest

import vsurge
from vsurge import vSurge
from vsurge.engine.engine_config import EngineConfig
from vsurge.engine.program_store import FOLDER, SWITCH_ENV, store_folder
from vsurge.sampling.params import SamplingParams
from vsurge.hardware.compilation_cache import stop_using_compilation_cache, use_compilation_cache
from tiny_models import write_tiny_model

CONFIG = EngineConfig(max_slots=2, max_length=64, prefill_tokens=32)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, default_processor_dir):
    path = tmp_path_factory.mktemp("store_model")
    write_tiny_model("llama_tied_mha", path, default_processor_dir)
    return vsurge.load(path, dtype="float32", progress=False)


@pytest.fixture
def store_on(tmp_path, monkeypatch):
    monkeypatch.setenv(SWITCH_ENV, "1")
    use_compilation_cache(tmp_path / "xla")
    yield tmp_path / "xla" / FOLDER
    stop_using_compilation_cache()


def surge_of(model, processor, config=CONFIG):
    surge = vSurge.from_config(model, processor, config)
    surge.compile()
    return surge


def greedy(surge, processor) -> list[list[int]]:
    surge.start()
    try:
        params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
        prompts = ["Hello there", "The capital of France is a city that"]
        return [r.token_ids for r in asyncio.run(surge.generate(prompts, params))]
    finally:
        surge.stop(5)


def traced(fn) -> int:
    """How many jaxprs JAX traced while `fn` ran."""
    count = [0]

    def listen(name, seconds, **_):
        if name == "/jax/core/compile/jaxpr_trace_duration":
            count[0] += 1

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        fn()
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    return count[0]


def test_a_second_engine_loads_every_program_untraced_and_answers_the_same(tiny, store_on, caplog):
    model, processor = tiny
    holder = {}
    first_traces = traced(lambda: holder.setdefault("first", surge_of(model, processor)))
    first = holder["first"]
    programs = len(first.engine.buckets())
    assert first.engine._store.saved == programs and first.engine._store.loaded == 0
    assert len(list(store_on.glob("*/*.bin"))) == programs
    expected = greedy(first, processor)

    # no program traced again: what is left is the engine's own set-up (its state's shapes)
    assert traced(lambda: holder.setdefault("second", surge_of(model, processor))) <= first_traces - programs
    second = holder["second"]
    assert second.engine._store.loaded == programs and second.engine._store.saved == 0
    assert f"{programs} from vsurge's program store" in second.engine.compile_summary
    assert greedy(second, processor) == expected

    broken = sorted(store_on.glob("*/*.bin"))[0]  # cut short: compiled again and replaced
    broken.write_bytes(broken.read_bytes()[:100])
    with caplog.at_level(logging.WARNING, logger="vsurge.engine.program_store"):
        third = surge_of(model, processor)
    assert "could not be loaded" in caplog.text
    assert third.engine._store.loaded == programs - 1 and third.engine._store.saved == 1
    assert greedy(third, processor) == expected


def test_another_config_has_its_own_fingerprint(tiny, store_on):
    model, processor = tiny
    def folder(config):
        return vSurge.from_config(model, processor, config).engine._program_store().folder

    folders = {folder(config) for config in (CONFIG, CONFIG, CONFIG.replace(max_length=96),
                                             CONFIG.replace(prefill_tokens=16))}
    assert len(folders) == 3
    # what only the host sees keeps the programs: a TPU's default host tier (a quarter of the RAM free at
    # start) differed at every start, and so did the fingerprint
    assert folder(CONFIG.replace(seed=5, decode_call_ms=50.0, step_timeout=9.0)) == folder(CONFIG)
    tiered = folder(CONFIG.replace(kv_host_cache_bytes=1 << 20))
    assert tiered == folder(CONFIG.replace(kv_host_cache_bytes=2 << 20)) and tiered != folder(CONFIG)


def test_the_switch_and_no_cache_turn_it_off(tiny, store_on, monkeypatch):
    model, processor = tiny
    assert store_folder() == store_on
    monkeypatch.setenv(SWITCH_ENV, "0")
    assert store_folder() is None and vSurge.from_config(model, processor, CONFIG).engine._program_store() is None
    monkeypatch.delenv(SWITCH_ENV)  # on a CPU off unless asked for (accelerators: on)
    assert store_folder() is None
    monkeypatch.setenv(SWITCH_ENV, "1")
    stop_using_compilation_cache()
    assert store_folder() is None


def test_only_the_newest_fingerprints_are_kept(tmp_path):
    import os

    from vsurge.engine.program_store import KEEP, ProgramStore

    for i in range(KEEP + 2):  # older engines' folders, oldest first
        (tmp_path / f"old{i}").mkdir()
        os.utime(tmp_path / f"old{i}", (1000 + i, 1000 + i))
    store = ProgramStore(tmp_path, "new")
    store.save(("add",), jax.jit(lambda x: x + 1).lower(1.0).compile())
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["new"] + [f"old{i}" for i in range(3, KEEP + 2)])
    assert float(store.load(("add",))(1.0)) == 2.0 and store.load(("other",)) is None


def test_weights_that_differ_only_in_how_the_kernel_multiplies_them_differ_in_fingerprint(store_on):
    """The default model's GGUF blocks carry the block kernel's passes (1: llama.cpp's arithmetic, 2: with the
    activations' rounding residual) as static data of each weight: a program of one must not serve the other."""
    model, processor = vsurge.load("default", progress=False)
    two = vSurge.from_config(model, processor, CONFIG).engine._program_store().folder
    one = vSurge.from_config(model.use_activation_passes(1), processor, CONFIG).engine._program_store().folder
    assert model.activation_passes == 1 and one != two
