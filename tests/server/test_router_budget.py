"""server/router.py's memory budget and per-model adapters, on stand-in models (no JAX): which models it
unloads to fit `--models-memory-budget`, that a model above the budget is refused naming it, that a model
measured above its estimate makes idle ones go, and that an unloaded model's adapters come back with it."""

from __future__ import annotations

import asyncio
import time
import types

import pytest

from vsurge.server.errors import APIError
from vsurge.server.router import LOADED, UNLOADED, ModelRouter, weight_file_bytes

GIB = 2**30


class StandIn:
    """A started model: its bytes, requests in flight, and the adapters it was built with."""

    def __init__(self, name, size, adapters):
        self.name, self.size, self.adapters = name, size, dict(adapters)
        self.driver = types.SimpleNamespace(num_live=0, engines=[])
        self.stopped = False

    def adapter(self, name):
        return self.adapters.get(name)

    def stop(self, timeout):
        self.stopped = True


class Server:
    def __init__(self):
        self.surges = {}

    def adopt(self, name, surge):
        self.surges[name] = surge


def make_router(sizes: dict, budget_gib: float, files: dict | None = None):
    """A router over models name -> GiB they hold once loaded (`files`: what their weight files weigh)."""
    server = Server()
    router = ModelRouter(server, memory_budget=int(budget_gib * GIB), footprint=lambda s: int(s.size * GIB))
    built = []

    def builder(name):
        def build(programs, adapters):
            built.append((name, dict(adapters)))
            return StandIn(name, sizes[name], {a: p for a, p in adapters.items() if p != "missing"})
        return build

    for name in sizes:
        router.add(name, f"/nowhere/{name}", builder(name))
        router.entries[name].memory_bytes = None if files is None else int(files[name] * GIB)
    return server, router, built


def loaded(router):
    return sorted(e.name for e in router.entries.values() if e.state == LOADED)


def test_models_are_unloaded_least_recently_used_first_until_the_next_fits():
    async def run():
        server, router, _ = make_router({"a": 3, "b": 3, "c": 5}, budget_gib=8, files={"a": 3, "b": 3, "c": 5})
        await router.ensure_loaded("a")
        await router.ensure_loaded("b")
        assert loaded(router) == ["a", "b"]  # 6 of 8 GiB
        router.entries["a"].last_used = time.monotonic()  # b is now the least recently used
        await router.ensure_loaded("c")  # 5 more: b goes, a (3) + c (5) fit
        assert loaded(router) == ["a", "c"]
        assert router.entries["b"].state == UNLOADED
        assert [e["memory_bytes"] for e in router.describe()] == [3 * GIB, 3 * GIB, 5 * GIB]

    asyncio.run(run())


def test_a_model_above_the_budget_is_refused_naming_it():
    async def run():
        _, router, built = make_router({"small": 1, "huge": 9}, budget_gib=8, files={"small": 1, "huge": 9})
        await router.ensure_loaded("small")
        with pytest.raises(APIError) as caught:
            await router.ensure_loaded("huge")
        assert caught.value.status == 503 and "huge" in str(caught.value.message)
        assert "--models-memory-budget" in caught.value.message
        assert loaded(router) == ["small"] and [n for n, _ in built] == ["small"]

    asyncio.run(run())


def test_a_model_bigger_than_its_files_makes_idle_models_go_after_loading():
    async def run():
        # before its first load a model is counted at its files' size; its KV pool shows only once loaded
        _, router, _ = make_router({"a": 4, "b": 6}, budget_gib=8, files={"a": 4, "b": 2})
        await router.ensure_loaded("a")
        await asyncio.sleep(0.6)  # (past the grace in which a just-loaded model counts as busy)
        router.entries["b"].memory_bytes = None
        router.entries["b"].path = "/nowhere"  # (no files: counted as 0 before its load)
        await router.ensure_loaded("b")  # 4 + 0 fits; measured 6: a (idle) goes
        assert loaded(router) == ["b"]

    asyncio.run(run())


def test_a_busy_model_is_not_unloaded_to_make_room():
    async def run():
        server, router, _ = make_router({"a": 5, "b": 5}, budget_gib=8, files={"a": 5, "b": 5})
        router.load_timeout = 0.3
        await router.ensure_loaded("a")
        server.surges["a"].driver.num_live = 2
        with pytest.raises(APIError) as caught:
            await router.ensure_loaded("b")
        assert caught.value.status == 503 and loaded(router) == ["a"]

    asyncio.run(run())


def test_an_unloaded_models_adapters_come_back_with_it():
    async def run():
        server, router, built = make_router({"a": 1, "b": 1}, budget_gib=1.5, files={"a": 1, "b": 1})
        router.entries["a"].adapters = {"sql": "/adapters/sql"}
        await router.ensure_loaded("a")
        router.adapter_loaded("a", "poet", "/adapters/poet")  # loaded at run time
        router.adapter_loaded("a", "gone", "missing")  # its files vanish before the reload
        assert router.base_of("poet") == "a" and router.base_of("nobody") is None
        await router.ensure_loaded("b")  # a goes to make room
        assert loaded(router) == ["b"] and router.base_of("poet") == "a"
        await router.ensure_loaded("a")
        assert built[-1] == ("a", {"sql": "/adapters/sql", "poet": "/adapters/poet", "gone": "missing"})
        assert sorted(router.entries["a"].adapters) == ["poet", "sql"]  # the unreadable one is dropped
        assert router.adapter_unloaded("a", "poet") and not router.adapter_unloaded("a", "poet")

    asyncio.run(run())


def test_weight_file_bytes(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"x" * 100)
    (tmp_path / "config.json").write_bytes(b"{}" * 50)
    (tmp_path / "one.gguf").write_bytes(b"x" * 7)
    assert weight_file_bytes(str(tmp_path)) == 107
    assert weight_file_bytes(str(tmp_path / "one.gguf")) == 7
    assert weight_file_bytes(str(tmp_path / "absent")) == 0


def test_a_model_that_failed_to_load_is_not_tried_on_every_request():
    """Within RETRY_FAILED_AFTER its requests get its error without a new try (each try would unload a good
    model under --max-loaded-models); POST /models/load tries at once."""
    async def run():
        server, router, built = make_router({"good": 1, "bad": 1}, budget_gib=8, files={"good": 1, "bad": 1})
        router.max_loaded = 1
        tries = []

        def broken(programs, adapters):
            tries.append(1)
            raise OSError("bad.gguf: not a GGUF file")

        router.entries["bad"].build = broken
        await router.ensure_loaded("good")
        for _ in range(3):
            with pytest.raises(APIError, match="not a GGUF file") as caught:
                await router.ensure_loaded("bad")
            assert caught.value.status == 503
        assert len(tries) == 1
        await router.load("good")
        with pytest.raises(APIError, match="not a GGUF file"):
            await router.load("bad")  # the explicit route tries again
        assert len(tries) == 2

    asyncio.run(run())
