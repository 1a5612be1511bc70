"""LoRA adapters loaded at run time on Ray Serve, as multiplexed model ids.

POST /v1/load_lora_adapter reaches one replica, which checks it (the admin key, the name, the path, the
adapter itself: `vsurge serve`'s own route and errors) and loads it. Once it answered 200 the ingress records the
adapter (`AdapterRecord`: its name, path and base model) for the whole cluster. Every request carries the
record's snapshot; a request naming a recorded adapter is routed with the adapter as its multiplexed model id,
so it goes to a replica holding it, and a replica that does not hold it loads it on demand
(`ReplicaAdapters.ensure`, through the replica's Serve-multiplexed loader, which tells the router). A replica
that dies takes nothing with it: the record is the ingress's.

POST /v1/unload_lora_adapter also runs on one replica (the route checks the key and answers); on 200 the
ingress drops the adapter from its record, and every replica drops it on the next request it takes (the
snapshot it carries no longer names it), so a later request for it gets the route's 404. Unloading an adapter
given at start (--lora) withdraws it the same way from every replica.
"""

from __future__ import annotations

import asyncio
import json
import uuid

from ...server.errors import APIError

LOAD_PATH, UNLOAD_PATH = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"


def adapter_request(body: bytes) -> tuple[str, dict] | None:
    """(lora_name, spec) of a load/unload request body; spec {"lora_path", "model"} is what a replica needs to
    load it again. None when the body is not one (the replica's route answers its 400)."""
    try:
        data = json.loads(body) if body else None
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("lora_name"), str):
        return None
    return data["lora_name"], {"lora_path": data.get("lora_path"), "model": data.get("model")}


class AdapterRecord:
    """The ingress's record of the adapters loaded at run time, and of adapters given at start then unloaded."""

    def __init__(self):
        self.adapters: dict[str, dict] = {}  # name -> spec
        self.withdrawn: set[str] = set()  # given at start (--lora), unloaded through the API since
        self.version = 0
        self.origin = uuid.uuid4().hex  # a restarted ingress's snapshots never pass for an old one's

    def recorded(self, name: str | None) -> bool:
        return name is not None and name in self.adapters

    def snapshot(self) -> dict:
        return {"version": (self.origin, self.version), "adapters": dict(self.adapters),
                "withdrawn": sorted(self.withdrawn)}

    def answered(self, path: str, body: bytes, status: int) -> None:
        """A replica answered a request: a load or unload that succeeded changes the record."""
        if status != 200 or path not in (LOAD_PATH, UNLOAD_PATH):
            return
        parsed = adapter_request(body)
        if parsed is None:
            return
        name, spec = parsed
        if path == LOAD_PATH:
            self.adapters[name] = spec
            self.withdrawn.discard(name)
        elif self.adapters.pop(name, None) is None:
            self.withdrawn.add(name)
        self.version += 1


class ReplicaAdapters:
    """One replica's side: the adapters it loaded on demand (or through the load route), kept to the ingress's
    snapshot. `forget` drops one from the replica's server and from Serve's record of the models it holds."""

    def __init__(self, server, forget_in_serve):
        self.server = server
        self.forget_in_serve = forget_in_serve  # name -> None: Serve no longer routes `name` here for it
        self.loaded: dict[str, dict] = {}  # name -> spec, loaded here
        self.snapshot = {"version": None, "adapters": {}, "withdrawn": []}
        self._lock = asyncio.Lock()

    def recorded(self, name: str | None) -> bool:
        return name is not None and name in self.snapshot["adapters"]

    def sync(self, snapshot: dict) -> None:
        """Drop what the ingress's record no longer names (or names with another path)."""
        if snapshot["version"] == self.snapshot["version"]:
            return
        self.snapshot = snapshot
        for name, spec in list(self.loaded.items()):
            if snapshot["adapters"].get(name) != spec:
                self.forget(name)
        for name in snapshot["withdrawn"]:
            self.forget(name)

    async def ensure(self, name: str) -> None:
        """Load recorded adapter `name` here unless it is; raises the load route's APIError (its path is gone)."""
        from ...server.lora_routes import load_runtime_adapter

        async with self._lock:
            spec = self.snapshot["adapters"].get(name)
            if name in self.loaded and spec in (None, self.loaded[name]):  # (None: loaded here, not recorded yet)
                return
            if spec is None:  # unloaded by a request that overtook this one
                raise APIError(404, f"The model `{name}` does not exist.", "model", code="model_not_found")
            await load_runtime_adapter(self.server, name, spec["lora_path"], spec["model"])
            self.loaded[name] = spec

    def answered(self, path: str, body: bytes, status: int) -> str | None:
        """The load/unload route answered here: what it loaded is this replica's (-> its name), what it unloaded
        is gone. The snapshot in hand says so too until the ingress's next one (which will)."""
        parsed = adapter_request(body) if status == 200 and path in (LOAD_PATH, UNLOAD_PATH) else None
        if parsed is None:
            return None
        name, spec = parsed
        recorded = dict(self.snapshot["adapters"])
        if path == LOAD_PATH:
            self.loaded[name] = recorded[name] = spec
        else:
            recorded.pop(name, None)
            self.forget(name)
        self.snapshot = {**self.snapshot, "adapters": recorded}
        return name if path == LOAD_PATH else None

    def listed(self, models: bytes) -> bytes:
        """A GET /v1/models answer of this replica's server, with the recorded adapters it has not loaded (yet)
        listed as it lists its own: the cluster serves them. Each copies its base model's entry."""
        try:
            answer = json.loads(models)
            entries = {entry["id"]: entry for entry in answer["data"]}
        except (ValueError, KeyError, TypeError):
            return models
        for name, spec in self.snapshot["adapters"].items():
            base = entries.get(spec["model"]) or next(iter(entries.values()), None)
            if name in entries or base is None:
                continue
            entry = {k: v for k, v in base.items() if k != "status"}
            entries[name] = {**entry, "id": name, "root": spec["lora_path"], "parent": base["id"]}
            answer["data"].append(entries[name])
        return json.dumps(answer).encode()

    def forget(self, name: str) -> None:
        from ...server.lora_routes import forget_adapter

        self.loaded.pop(name, None)
        forget_adapter(self.server, name)
        self.forget_in_serve(name)
