"""Serve a model data- and tensor-parallel over HTTP on loopback, for test_scale_serving.py.

    XLA_FLAGS=--xla_force_host_platform_device_count=4 python tests/scale_server.py MODEL PORT TP DP

The same server as `vsurge serve`, with a small engine (one decode and one prefill program
shape) so that each replica compiles in seconds.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import vsurge  # noqa: E402
from vsurge import EngineConfig, vSurge, vSurgeApiServer  # noqa: E402

SERVED_NAME = "tiny"


def main(model_path: str, port: int, tp: int, dp: int) -> None:
    model, processor = vsurge.load(model_path, dtype="float32", progress=False, tensor_parallel_size=tp,
                                   data_parallel_size=dp)
    config = EngineConfig(max_slots=4, max_length=128, prefill_tokens=128, chunk_lengths=(32,), row_buckets=(4,),
                          window_buckets=(1,), prefill_first=True, page_size=128, num_pages=8, decode_steps=4)
    surge = vSurge.create_odriver(model, processor, config=config, tensor_parallel_size=tp, data_parallel_size=dp,
                                  vsurge_name=SERVED_NAME)
    print(f"replicas: {len(surge.driver.engines)}, devices per replica: "
          f"{[e.mesh.devices.size for e in surge.driver.engines]}", file=sys.stderr, flush=True)
    vSurgeApiServer({SERVED_NAME: surge}).fire(host="127.0.0.1", port=port, metrics_port=-1, log_level="warning")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
