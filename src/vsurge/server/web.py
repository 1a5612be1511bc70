"""The web page for people: a chat page at `/`, a live dashboard at `/dashboard`, and `GET /v1/stats`.

The pages are static files shipped in the package (`server/static/`, no build
step, no CDN: the user may be offline); they talk to the same OpenAI routes as
any client. `/v1/stats` is GUARDED (the API key guards it); the pages and their files are
PUBLIC (the page asks for the key when the API says 401).
"""

from __future__ import annotations

import time
from pathlib import Path

from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from .routes import GUARDED, PUBLIC
from .stats import ServerStats, server_stats

STATIC_DIR = Path(__file__).parent / "static"


def page_url(scheme: str, host: str, port: int) -> str:
    """Where a person on this machine opens the chat page (a wildcard bind is reached on loopback)."""
    if host in ("0.0.0.0", "", "::"):
        host = "127.0.0.1"
    elif ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}/"


def install_web_routes(table, server) -> None:
    """Add the pages, their static files and /v1/stats to the route table (server: the vSurgeApiServer)."""
    started = time.time()
    # no-cache: after an upgrade the browser revalidates instead of mixing old and new scripts
    no_cache = {"Cache-Control": "no-cache"}

    @table.get("/", PUBLIC, include_in_schema=False)
    async def chat_page():
        return FileResponse(STATIC_DIR / "index.html", headers=no_cache)

    @table.get("/dashboard", PUBLIC, include_in_schema=False)
    async def dashboard_page():
        return FileResponse(STATIC_DIR / "dashboard.html", headers=no_cache)

    @table.get("/v1/stats", GUARDED, response_model=ServerStats,
             summary="Engine statistics of every served model (JSON view of /metrics)")
    async def stats() -> ServerStats:
        return server_stats(server, started)

    table.mount("/static", StaticFiles(directory=STATIC_DIR), PUBLIC, name="static")
