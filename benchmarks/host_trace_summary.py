"""Sum a perfetto trace's host events by name (XLA's compiler passes during a compile):

    python benchmarks/host_trace_summary.py TRACE.json.gz [TOP]
"""

from __future__ import annotations

import collections
import gzip
import json
import re
import sys


def main(path: str, top: int = 40) -> None:
    data = json.load(gzip.open(path))
    events = data["traceEvents"] if isinstance(data, dict) else data
    procs = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    total, count = collections.defaultdict(float), collections.Counter()
    for e in events:
        if e.get("ph") != "X" or "TPU:" in procs.get(e["pid"], ""):
            continue
        name = re.sub(r"\.\d+$", "", e["name"])[:90]  # (numbered instances as one)
        total[name] += e.get("dur", 0)
        count[name] += 1
    for name, us in sorted(total.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{us / 1e6:9.2f} s  x{count[name]:<6d} {name}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40)
