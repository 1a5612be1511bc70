"""/v1/stats' `memory` object and the start-up line's memory clause: where the server process's
resident memory goes.

Two kinds of part, so that they check each other: the bytes known exactly (the weights as held,
the KV pool, the recurrent states: the models' own arrays), and the growth of the resident set
while a start-up phase ran (memory_ledger.py: the runtime, what loading left beside the weights,
the compiled programs). `unattributed` is the resident set less every part: what building the
engine, warming it up and serving since then added, and any error in the parts (a second copy of
the weights would show here). On an accelerator the weights and the KV pool are device memory:
they move to `device` and the host's parts leave them out.
"""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, Field

from ..engine import memory_ledger

# where the high-water mark was reached: the phase that ends at each mark (memory_ledger.PHASES)
_REACHED_WHILE = {"start": "starting", "runtime": "importing", "load_begin": "importing",
                  "loaded": "loading", "compile_begin": "building the engine", "compiled": "compiling",
                  "ready": "making the KV pool"}


class MemoryParts(BaseModel):
    """The host's resident memory by part, bytes; null where the phase was not seen in this process."""

    python: Optional[int] = Field(description="the interpreter and the CLI when `vsurge serve` began")
    runtime: Optional[int] = Field(description="JAX, XLA and the server's modules imported, the backend started")
    weights: int = Field(description="the weights as held (on CPU; 0 where they are device memory)")
    loading: Optional[int] = Field(
        description="what loading left beside the weights: the tokenizer, modules imported on the way, any "
                    "copy of the weights kept (the resident set's growth while loading, less the weights)")
    programs: Optional[int] = Field(
        description="the compiled programs (the resident set's growth while compiling, after glibc's freed "
                    "pages were returned)")
    kv_pool: int = Field(description="the KV page pools (on CPU; 0 where they are device memory)")
    recurrent_states: int = Field(description="hybrid models' recurrent states and their snapshots (on CPU)")
    serving: Optional[int] = Field(
        description="the resident set's growth since the server was ready: requests' state, the allocator's "
                    "caches, the tokenizer's (0 until it has served; null before it is ready)")


class DeviceMemory(BaseModel):
    weights: int = Field(description="the weights' bytes on the devices")
    kv_pool: int = Field(description="the KV pools' bytes on the devices")
    recurrent_states: int
    bytes_in_use: Optional[int] = Field(description="the devices' allocator: bytes in use now (all devices)")
    peak_bytes_in_use: Optional[int]


class MemoryStats(BaseModel):
    rss_bytes: Optional[int] = Field(description="the process's resident set now (VmRSS)")
    peak_rss_bytes: Optional[int] = Field(description="its high-water mark (VmHWM): the peak since the start")
    peak_reached_while: Optional[str] = Field(
        description="the start-up phase in which the peak was reached (importing, loading, building the "
                    "engine, compiling, making the KV pool), serving, or now (the resident set is within 1% "
                    "of the peak)")
    parts: MemoryParts
    unattributed: Optional[int] = Field(
        description="rss_bytes less every part: engine buffers, warm-up, growth while serving, and the parts' "
                    "error; may be negative")
    transients: dict[str, int] = Field(
        description="how far the peak rose above the resident set at the end of a phase (load, compile): "
                    "memory a phase held only while it ran")
    weights_by_format: dict[str, int] = Field(
        description="the weights' bytes by how they are held: a GGUF block format (q4_k, q8_0, ...) or a dtype")
    jax_arrays_bytes: int = Field(description="bytes of every live JAX array (weights, pools, anything else)")
    device: Optional[DeviceMemory] = Field(description="accelerators only: the device memory's parts")


def weights_by_format(models) -> dict[str, int]:
    from ..ops.quantized import held_bytes, is_quantized

    out: dict[str, int] = {}
    for model in models:
        for w in model.named_weights().values():
            key = w.format if is_quantized(w) else w.dtype.name
            out[key] = out.get(key, 0) + held_bytes(w)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def memory_fields(surge) -> dict:
    """weight_bytes, kv_cache_bytes, kv_cache_pages and state_cache_bytes of a vSurge's engines (each
    model and pool once)."""
    from ..engine.pools import state_cache_bytes
    from ..kv.paged import pool_page_bytes

    engines = surge_engines(surge)
    # a remote (other-process) decode engine holds no model here: its pool is of the same model
    models = {id(e.model): e.model for e in engines if hasattr(e, "model")}
    same = next(iter(models.values()), None)
    pools = {id(e.pool): (e.pool, getattr(e, "model", same), e.config) for e in engines}
    return dict(weight_bytes=sum(m.weight_bytes for m in models.values()),
                kv_cache_bytes=sum(p.num_pages * pool_page_bytes(m, config) for p, m, config in pools.values()),
                kv_cache_pages=sum(p.num_pages for p, _, _ in pools.values()),
                state_cache_bytes=sum(state_cache_bytes(m, config, _snapshot_rows(p))
                                      for p, m, config in pools.values()))


def surge_engines(surge) -> list:
    """A vSurge's engines, each once (a disaggregated model's prefill and decode engines; none before it runs)."""
    return list(dict.fromkeys(getattr(getattr(surge, "driver", None), "engines", [])))


def _snapshot_rows(pool) -> int:
    snapshots = getattr(pool, "snapshots", None)
    return snapshots.rows if snapshots is not None else 0


def _models(surges) -> list:
    models = {}
    for surge in surges:
        for engine in getattr(getattr(surge, "driver", None), "engines", []):
            if hasattr(engine, "model"):
                models[id(engine.model)] = engine.model
    return list(models.values())


def _grew(marks: dict, begin: str, end: str) -> Optional[int]:
    if begin not in marks or end not in marks:
        return None
    return marks[end].rss - marks[begin].rss


def _transient(marks: dict, begin: str, end: str) -> int:
    """The high-water mark's rise above the end's resident set, when the phase raised it."""
    if begin not in marks or end not in marks or marks[end].hwm <= marks[begin].hwm:
        return 0
    return marks[end].hwm - marks[end].rss


def _peak_phase(marks: dict, now: memory_ledger.Reading) -> str:
    if now.hwm - now.rss <= now.rss // 100:
        return "now"  # the resident set is its peak (within 1%): no phase's transient set it
    for phase in memory_ledger.PHASES:
        if phase in marks and marks[phase].hwm >= now.hwm:
            return _REACHED_WHILE[phase]
    return "serving"


def _device_memory(weights: int, kv: int, states: int) -> DeviceMemory:
    used, peak = memory_ledger.device_bytes_in_use()
    return DeviceMemory(weights=weights, kv_pool=kv, recurrent_states=states, bytes_in_use=used,
                        peak_bytes_in_use=peak)


def memory_stats(surges) -> MemoryStats:
    """The breakdown for the vSurges a server holds (each model and pool once)."""
    fields = [memory_fields(s) for s in surges]
    weights = sum(f["weight_bytes"] for f in fields)
    kv = sum(f["kv_cache_bytes"] for f in fields)
    states = sum(f["state_cache_bytes"] for f in fields)
    on_host = memory_ledger.arrays_on_host()
    host_weights, host_kv, host_states = (weights, kv, states) if on_host else (0, 0, 0)
    marks, now = memory_ledger.marks(), memory_ledger.read()
    loaded = _grew(marks, "load_begin", "loaded")
    parts = MemoryParts(
        python=marks["start"].rss if "start" in marks else None, runtime=_grew(marks, "start", "runtime"),
        weights=host_weights, loading=None if loaded is None else loaded - host_weights,
        programs=_grew(marks, "compile_begin", "compiled"), kv_pool=host_kv, recurrent_states=host_states,
        serving=max(0, now.rss - marks["ready"].rss) if now and "ready" in marks else None)
    known = [v for v in parts.model_dump().values() if v is not None]
    return MemoryStats(
        rss_bytes=now and now.rss, peak_rss_bytes=now and now.hwm,
        peak_reached_while=_peak_phase(marks, now) if now else None, parts=parts,
        unattributed=now.rss - sum(known) if now else None,
        transients={"load": _transient(marks, "load_begin", "loaded"),
                    "compile": _transient(marks, "compile_begin", "compiled")},
        weights_by_format=weights_by_format(_models(surges)),
        jax_arrays_bytes=memory_ledger.jax_arrays_bytes(),
        device=None if on_host else _device_memory(weights, kv, states))


def describe(stats: MemoryStats) -> str:
    """The start-up line's clause: resident now, the peak and where it was reached, the largest parts."""
    if stats.rss_bytes is None:
        return ""
    parts = {"KV pool": stats.parts.kv_pool + stats.parts.recurrent_states, "programs": stats.parts.programs,
             "runtime": (stats.parts.runtime or 0) + (stats.parts.python or 0), "weights": stats.parts.weights,
             "loading": stats.parts.loading, "other": stats.unattributed}
    listed = ", ".join(f"{name} {value / 2**30:.2f}" for name, value in parts.items() if value)
    peak = ("its peak so far" if stats.peak_reached_while == "now" else
            f"peak {stats.peak_rss_bytes / 2**30:.2f} GiB while {stats.peak_reached_while}")
    return f"memory {stats.rss_bytes / 2**30:.2f} GiB resident, {peak} ({listed} GiB)"
