"""vSurge's LoRA methods (a mixin): register adapters with its engines and read them back."""

from __future__ import annotations

from .adapter import Adapter, AdapterError, load_peft


class AdapterAPI:
    """Mixed into vSurge (self.engine, self._driver)."""

    def _adapter_engines(self) -> list:
        engines = list(getattr(self._driver, "engines", None) or [self.engine])
        return [e for e in engines if getattr(e, "adapters", None) is not None]

    @property
    def serves_adapters(self) -> bool:
        return bool(self._adapter_engines())

    def load_adapter(self, name: str, path: str) -> Adapter:
        """Read a PEFT LoRA adapter (a directory) and serve it as `name` (replacing an adapter of that name:
        requests in flight keep the one they started with). Raises AdapterError naming the problem."""
        engines = self._adapter_engines()
        if not engines:
            raise AdapterError("this server serves no LoRA adapters: start it with --enable-lora, --lora or "
                               "--max-loras")
        if not name or not isinstance(name, str):
            raise AdapterError("an adapter needs a name")
        adapter = load_peft(name, path, engines[0].model, engines[0].config.max_lora_rank)
        for engine in engines:
            engine.adapters.register(adapter)
        return adapter

    def unload_adapter(self, name: str) -> bool:
        """Stop serving adapter `name` (requests already submitted with it finish); False if unknown."""
        found = [e.adapters.unregister(name) for e in self._adapter_engines()]
        return any(a is not None for a in found)

    def adapter(self, name: str) -> Adapter | None:
        engines = self._adapter_engines()
        return engines[0].adapters.get(name) if engines else None

    @property
    def adapter_names(self) -> list[str]:
        engines = self._adapter_engines()
        return engines[0].adapters.names if engines else []

    def resident_adapters(self) -> dict[str, int]:
        """Adapters in a device slot of any engine -> requests running with them (summed over replicas)."""
        out: dict[str, int] = {}
        for engine in self._adapter_engines():
            for name, count in engine.adapters.resident().items():
                out[name] = out.get(name, 0) + count
        return out

    @property
    def adapter_slot_loads(self) -> int:
        """Adapters copied into a device slot so far (slot misses), over every engine."""
        return sum(engine.adapters.loads for engine in self._adapter_engines())
