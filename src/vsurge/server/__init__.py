"""The OpenAI-compatible HTTP server (FastAPI + uvicorn)."""

from .api_server import vSurgeApiServer

__all__ = ["vSurgeApiServer"]
