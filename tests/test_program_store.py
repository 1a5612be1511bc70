"""Compiled programs stored on disk: a second engine of the same shape loads them without tracing the
model, runs them to the same tokens, and anything that changes a program misses the store."""

from __future__ import annotations

import asyncio

import jax
import pytest

import vsurge
from vsurge import SamplingParams, vSurge
from vsurge.engine import core, program_store
from vsurge.vinference.persistence import stop_using_compilation_cache, use_compilation_cache
from tiny_models import write_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, default_processor_dir):
    folder = tmp_path_factory.mktemp("tiny_store")
    write_tiny_model("llama", folder, default_processor_dir)
    return vsurge.load(folder, dtype="float32", progress=False)


@pytest.fixture
def store(tmp_path):
    previous = jax.config.jax_compilation_cache_dir
    use_compilation_cache(tmp_path)
    yield tmp_path / program_store.SUBDIR
    if previous:
        use_compilation_cache(type(tmp_path)(previous))
    else:
        stop_using_compilation_cache()


def _greedy(surge) -> list[int]:
    (out,) = asyncio.run(surge.generate("Hello there", SamplingParams(max_tokens=12, temperature=0.0,
                                                                       ignore_eos=True)))
    return out.token_ids


def _surge(tiny, **kwargs):
    return vSurge.create_odriver(*tiny, max_concurrent_decodes=4, max_length=64, prefill_lengths=[16],
                                 num_pages=16, page_size=16, **kwargs)


def test_a_second_engine_loads_every_program_without_tracing(tiny, store, monkeypatch):
    first = _surge(tiny)
    first.compile()
    stored = sorted(p.name for p in store.glob("*.bin"))
    assert len(stored) == len(first.engine.buckets())
    first.start()
    expected = _greedy(first)
    first.stop(timeout=5)

    traced = []
    original = core.EngineCore._lower_and_compile
    monkeypatch.setattr(core.EngineCore, "_lower_and_compile",
                        lambda self, key: traced.append(key) or original(self, key))
    second = _surge(tiny)
    second.compile()
    assert traced == []  # every program came from the store
    second.start()
    assert _greedy(second) == expected
    second.stop(timeout=5)

    other = _surge(tiny, decode_steps=2)  # a different engine config is a different program
    other.compile()
    assert traced and len(list(store.glob("*.bin"))) > len(stored)


def test_a_damaged_file_is_compiled_again(tiny, store):
    _surge(tiny).compile()
    for path in store.glob("*.bin"):
        path.write_bytes(b"not a program")
    surge = _surge(tiny)
    surge.compile()  # warns and compiles; never fails the start
    surge.start()
    assert len(_greedy(surge)) == 12
    surge.stop(timeout=5)


def test_without_a_compilation_cache_nothing_is_stored(tiny, tmp_path):
    previous = jax.config.jax_compilation_cache_dir
    stop_using_compilation_cache()
    try:
        assert program_store.load("anything") is None
        program_store.save("anything", None)  # a no-op, not an error
    finally:
        if previous:
            use_compilation_cache(type(tmp_path)(previous))
