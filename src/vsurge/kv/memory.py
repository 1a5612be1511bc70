"""How many bytes the paged KV cache may take on this machine."""

from __future__ import annotations

import os

import jax


def _host_available_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def default_host_cache_bytes() -> int:
    """The host tier of the prefix cache when none is asked for: none on CPU (the KV pool is host
    memory already, so a second copy of the same bytes in the same RAM only costs memcpy; a larger
    pool serves the same hits for free), a quarter of the free RAM (at most 64 GiB) on accelerators."""
    if jax.devices()[0].platform == "cpu":
        return 0
    return int(min(_host_available_bytes() // 4, 64 << 30))


def available_kv_bytes(weight_bytes: int, utilization: float) -> int:
    """`utilization` of the accelerator memory left free after the weights are loaded
    (on CPU: of the host memory available now, the weights already counted in it)."""
    if not 0 < utilization <= 1:
        raise ValueError(f"hbm_utilization must be in (0, 1], got {utilization}")
    device = jax.devices()[0]
    stats = device.memory_stats() if device.platform != "cpu" else None
    if stats and "bytes_limit" in stats:
        free = stats["bytes_limit"] - stats.get("bytes_in_use", weight_bytes)
    else:
        free = _host_available_bytes()
    return int(max(0, free) * utilization)
