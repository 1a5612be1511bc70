"""Run-time LoRA adapters on Ray Serve (src/vsurge/scale/ray_serve/adapters.py), without Ray: the ingress's
record and two replicas kept to it, over stand-in servers whose models load and drop adapters by name (the
Ray test, test_ray_serve.py, runs them on a real cluster; here every replica ends up holding one, which a real
cluster's router avoids)."""

from __future__ import annotations

import asyncio
import json

import pytest

from vsurge.scale.ray_serve.adapters import LOAD_PATH, UNLOAD_PATH, AdapterRecord, ReplicaAdapters
from vsurge.server.errors import APIError


class StandInModel:
    """The adapter calls of a vSurge (lora/api.py) the replica's side makes: names in a dict."""

    serves_adapters = True

    def __init__(self, given=()):
        self.adapters = {name: "at start" for name in given}

    def load_adapter(self, name, path):
        if "missing" in path:
            raise ValueError(f"{path} is not a directory")
        self.adapters[name] = path

    def unload_adapter(self, name):
        return self.adapters.pop(name, None) is not None


class StandInServer:
    def __init__(self, given=()):
        self.surges = {"base": StandInModel(given)}
        self.router, self.lora_dir = None, None


class Replica:
    def __init__(self, given=()):
        self.server = StandInServer(given)
        self.dropped_in_serve: list[str] = []
        self.adapters = ReplicaAdapters(self.server, self.dropped_in_serve.append)

    @property
    def serving(self) -> dict:
        return self.server.surges["base"].adapters


def _body(name, path=None) -> bytes:
    return json.dumps({"lora_name": name, **({"lora_path": path} if path else {})}).encode()


def _route(record: AdapterRecord, replica: Replica, path: str, body: bytes) -> None:
    """What the load/unload route does on the replica Serve chose, and what the ingress records of its 200."""
    replica.adapters.sync(record.snapshot())
    name = json.loads(body)["lora_name"]
    if path == LOAD_PATH:
        replica.server.surges["base"].load_adapter(name, json.loads(body)["lora_path"])
    else:
        assert replica.server.surges["base"].unload_adapter(name)
    replica.adapters.answered(path, body, 200)
    record.answered(path, body, 200)


def test_an_adapter_loaded_on_one_replica_is_loaded_on_demand_elsewhere_and_unloaded_everywhere():
    record, a, b = AdapterRecord(), Replica(), Replica()
    _route(record, a, LOAD_PATH, _body("ad", "/adapters/ad"))
    assert record.recorded("ad") and a.serving == {"ad": "/adapters/ad"}
    b.adapters.sync(record.snapshot())
    assert b.adapters.recorded("ad") and b.serving == {}  # nothing until a request for it comes
    asyncio.run(b.adapters.ensure("ad"))
    assert b.serving == {"ad": "/adapters/ad"}

    _route(record, a, UNLOAD_PATH, _body("ad"))  # answered on a; b drops it at its next request
    assert not record.recorded("ad") and a.serving == {} and b.serving == {"ad": "/adapters/ad"}
    b.adapters.sync(record.snapshot())
    assert b.serving == {} and b.dropped_in_serve == ["ad"] and not b.adapters.recorded("ad")


def test_a_reload_under_another_path_replaces_it_and_an_unloaded_start_adapter_is_withdrawn():
    record, a, b = AdapterRecord(), Replica(given=["kept", "gone"]), Replica(given=["kept", "gone"])
    _route(record, a, LOAD_PATH, _body("ad", "/v1"))
    b.adapters.sync(record.snapshot())
    asyncio.run(b.adapters.ensure("ad"))
    _route(record, a, LOAD_PATH, _body("ad", "/v2"))
    b.adapters.sync(record.snapshot())  # its copy is the old one: dropped, loaded again on demand
    assert "ad" not in b.serving
    asyncio.run(b.adapters.ensure("ad"))
    assert b.serving["ad"] == "/v2"

    _route(record, a, UNLOAD_PATH, _body("gone"))  # given at start (--lora): not in the record
    b.adapters.sync(record.snapshot())
    assert set(b.serving) == {"kept", "ad"}


def test_a_failed_or_foreign_answer_changes_nothing_and_a_new_ingress_resyncs():
    record, a = AdapterRecord(), Replica()
    version = record.snapshot()["version"]
    for path, body, status in ((LOAD_PATH, _body("ad", "/x"), 400), (LOAD_PATH, b"not json", 200),
                               ("/v1/completions", _body("ad", "/x"), 200)):
        record.answered(path, body, status)
        a.adapters.answered(path, body, status)
    assert record.snapshot()["version"] == version and not a.adapters.loaded
    _route(record, a, LOAD_PATH, _body("ad", "/x"))
    a.adapters.sync(AdapterRecord().snapshot())  # a restarted ingress remembers nothing: neither does a replica
    assert a.serving == {}


def test_an_adapter_that_cannot_be_read_on_demand_is_the_load_routes_400():
    record, b = AdapterRecord(), Replica()
    record.answered(LOAD_PATH, _body("ad", "/adapters/missing"), 200)  # (another replica read it before it went)
    b.adapters.sync(record.snapshot())
    with pytest.raises(APIError) as refused:
        asyncio.run(b.adapters.ensure("ad"))
    assert refused.value.status == 400 and refused.value.param == "lora_path"


def test_a_request_overtaken_by_the_unload_of_its_adapter_is_a_404():
    record, a, b = AdapterRecord(), Replica(), Replica()
    _route(record, a, LOAD_PATH, _body("ad", "/adapters/ad"))
    b.adapters.sync(record.snapshot())
    assert b.adapters.recorded("ad")  # a request for it came with this snapshot ...
    _route(record, a, UNLOAD_PATH, _body("ad"))
    b.adapters.sync(record.snapshot())  # ... and another one's newer snapshot came before it loaded it
    with pytest.raises(APIError) as gone:
        asyncio.run(b.adapters.ensure("ad"))
    assert gone.value.status == 404 and gone.value.param == "model" and b.serving == {}


def test_a_replica_lists_the_recorded_adapters_it_has_not_loaded_as_its_own():
    record, a, b = AdapterRecord(), Replica(), Replica()
    _route(record, a, LOAD_PATH, _body("ad", "/adapters/ad"))
    b.adapters.sync(record.snapshot())
    base = {"id": "base", "object": "model", "created": 7, "owned_by": "vsurge", "root": "base", "parent": None,
            "max_model_len": 256, "status": {"value": "loaded"}}
    own = {**base, "id": "given", "root": "/given", "parent": "base"}
    own.pop("status")
    listed = json.loads(b.adapters.listed(json.dumps({"object": "list", "data": [base, own]}).encode()))
    assert listed["data"] == [base, own, {**own, "id": "ad", "root": "/adapters/ad"}]
    assert a.adapters.listed(b"not json") == b"not json"
