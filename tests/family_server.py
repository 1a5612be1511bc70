"""Serve several tiny models, each on its own paged engine, from one `vsurge` HTTP server.

    python tests/family_server.py PORT NAME=DIR [NAME=DIR ...]

Each model gets a small oEngine (one decode and one prompt-chunk program shape, 16-token
pages and chunks, so prompts are prefilled in several steps and pages run short) so that
all of them compile in about a minute; requests choose a model by name.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import vsurge  # noqa: E402
from vsurge import EngineConfig, vSurge, vSurgeApiServer  # noqa: E402

ENGINE = EngineConfig(max_slots=4, max_length=128, prefill_tokens=32, chunk_lengths=(16,), row_buckets=(4,),
                      window_buckets=(8,), prefill_first=True, page_size=16, num_pages=24, decode_steps=4)


def main(port: int, named_dirs: list[str]) -> None:
    surges = {}
    for named in named_dirs:
        name, path = named.split("=", 1)
        model, processor = vsurge.load(path, dtype="float32", progress=False)
        surges[name] = vSurge.create_odriver(model, processor, config=ENGINE, vsurge_name=name)
    vSurgeApiServer(surges).fire(host="127.0.0.1", port=port, metrics_port=-1, log_level="warning")


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2:])
