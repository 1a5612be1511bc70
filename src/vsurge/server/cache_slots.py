"""`POST /v1/cache/save`, `/v1/cache/restore`, `/v1/cache/erase`: named prompt caches, as llama.cpp's
slot save/restore, over the disk tier of the prefix cache (`--kv-cache-dir`, kv/disk_tier.py).

    save     {"name", "prompt"}: the prompt is computed (one short greedy generation: its pages
             land in the disk tier), then its page files are copied under `slots/<name>/` beside
             the cache, out of reach of the cache's LRU
    restore  {"name"}: the saved page files go back into the cache, so the next request that
             starts with that prompt reads them instead of prefilling it (also after a restart)
    erase    {"name"}: the saved copy is deleted

Every page file is checked on read like any other disk-tier file (model, layout, tokens, digest).
They are ADMIN routes (server/routes.py): `--admin-api-key` guards them when set, else `--api-key`.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from pathlib import Path
from typing import Optional

from pydantic import ConfigDict, StrictStr

from .errors import APIError
from .protocol import RequestBody
from .routes import ADMIN

NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class CacheSlotRequest(RequestBody):  # its prompt reaches the tokenizer: valid Unicode only
    model_config = ConfigDict(extra="forbid")

    model: Optional[StrictStr] = None
    name: StrictStr
    prompt: Optional[StrictStr] = None


def _disk_of(surge):
    for engine in getattr(surge.driver, "prefill_engines", []):
        host = getattr(getattr(engine, "pool", None), "host", None)
        if host is not None and host.disk is not None:
            return host.disk
    raise APIError(400, "named prompt caches need the paged engine with a disk tier: start the server with "
                        "--kv-cache-dir DIR")


def _slot_dir(disk, name: str) -> Path:
    if not NAME.match(name) or name in (".", ".."):
        raise APIError(400, "'name' must be 1-64 letters, digits, '_', '-' or '.'", "name")
    return disk.root.parent / "slots" / disk.root.name / name


def _prompt_keys(tokens: list[int], page_size: int) -> list[int]:
    """Chained keys of the prompt's full pages, as the page pool looks them up."""
    from ..kv.tiers import page_key

    keys, key = [], None
    for i in range(max(len(tokens) - 1, 0) // page_size):
        key = page_key(key, tokens[i * page_size : (i + 1) * page_size])
        keys.append(key)
    return keys


async def save(server, body: CacheSlotRequest) -> dict:
    surge = await server.surge_for(body.model)
    disk = _disk_of(surge)
    folder = _slot_dir(disk, body.name)
    if not body.prompt:
        raise APIError(400, "give the 'prompt' to save", "prompt")
    from ..sampling.params import SamplingParams

    # two tokens: the prompt's pages are committed after its first (a sequence that ends there is not)
    try:
        await surge.generate([body.prompt], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    except ValueError as exc:
        raise APIError(400, str(exc), "prompt") from None
    await asyncio.to_thread(disk.flush)
    tokens = surge.processor.encode(body.prompt)
    page_size = surge.driver.prefill_engines[0].pool.page_size
    keys = [k for k in _prompt_keys(tokens, page_size) if disk.has(k)]
    folder.mkdir(parents=True, exist_ok=True)
    for key in keys:
        shutil.copy2(disk.file_of(key), folder / disk.file_of(key).name)
    (folder / "slot.json").write_text(json.dumps({"name": body.name, "fingerprint": disk.fingerprint,
                                                  "tokens": len(tokens), "keys": [f"{k:016x}" for k in keys]}))
    return {"object": "cache.slot", "name": body.name, "prompt_tokens": len(tokens), "pages": len(keys)}


async def restore(server, body: CacheSlotRequest) -> dict:
    surge = await server.surge_for(body.model)
    disk = _disk_of(surge)
    folder = _slot_dir(disk, body.name)
    manifest = _manifest(folder, body.name)
    restored = 0
    for hex_key in manifest["keys"]:
        key = int(hex_key, 16)
        source = folder / disk.file_of(key).name
        if source.exists() and disk.adopt(key, source):
            restored += 1
    return {"object": "cache.slot", "name": body.name, "pages": restored}


async def erase(server, body: CacheSlotRequest) -> dict:
    surge = await server.surge_for(body.model)
    folder = _slot_dir(_disk_of(surge), body.name)
    _manifest(folder, body.name)
    shutil.rmtree(folder)
    return {"object": "cache.slot", "name": body.name, "erased": True}


def _manifest(folder: Path, name: str) -> dict:
    try:
        return json.loads((folder / "slot.json").read_text())
    except FileNotFoundError:
        raise APIError(404, f"no saved prompt cache named '{name}'", "name") from None
    except (OSError, ValueError) as exc:
        raise APIError(400, f"the saved prompt cache '{name}' cannot be read: {exc}", "name") from None


def install_cache_routes(table, server) -> None:
    @table.post("/v1/cache/save", ADMIN)
    async def cache_save(body: CacheSlotRequest):
        return await save(server, body)

    @table.post("/v1/cache/restore", ADMIN)
    async def cache_restore(body: CacheSlotRequest):
        return await restore(server, body)

    @table.post("/v1/cache/erase", ADMIN)
    async def cache_erase(body: CacheSlotRequest):
        return await erase(server, body)
