"""Plot serving benchmark summaries: output tok/s and TTFT against concurrency, one line per server.

`plot_summaries` takes what `bench_serve.run` returns, so `vsurge bench serve --plot` and
benchmarks/serve.py draw the same picture. matplotlib is the optional extra `plot`.
"""

from __future__ import annotations

from pathlib import Path


def plot_summaries(series: dict[str, list[tuple[int, dict]]], path: str | Path, title: str | None = None) -> Path:
    """series: {server label: [(concurrency, bench_serve summary), ...]} -> a two-panel PNG at `path`."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("vsurge: error: --plot needs matplotlib (pip install 'vsurge[plot]')") from None

    fig, (throughput, ttft) = plt.subplots(1, 2, figsize=(11, 4.2))
    for label, points in series.items():
        points = sorted(points, key=lambda p: p[0])
        levels = [level for level, _ in points]
        (line,) = throughput.plot(levels, [s["output_throughput"] for _, s in points], marker="o", label=label)
        color = line.get_color()  # one colour per server in both panels
        ttft.plot(levels, [s["ttft"]["median"] for _, s in points], marker="o", color=color, label=f"{label} p50")
        ttft.plot(levels, [s["ttft"]["p99"] for _, s in points], marker="x", linestyle="--", alpha=0.6,
                  color=color, label=f"{label} p99")
    levels = sorted({level for points in series.values() for level, _ in points})
    for axis, ylabel in ((throughput, "output tokens / s"), (ttft, "time to first token (s)")):
        axis.set_xlabel("concurrent requests")
        axis.set_ylabel(ylabel)
        axis.set_xticks(levels)
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    throughput.set_title("Throughput")
    ttft.set_title("Latency to the first token")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
