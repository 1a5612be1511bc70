"""Serving benchmark: `vsurge serve` (no flags) against llama.cpp's own server, same model, same loads, one run.

The peer is llama.cpp's C++ `llama-server --parallel 32` (continuous batching),
built from the llama.cpp sources of the llama-cpp-python sdist by
../shared/peers/build-llama-server.sh when missing (~6-10 minutes, cached).
Each server runs alone on the machine while it is measured. Loads, all with
128-word random prompts, 128 greedy output tokens (end token banned), streamed
with usage (`vsurge bench serve`):

    1 stream          4 requests one after another
    16 / 32 conc.     16 / 32 requests at once
    16 conc. shared   16 requests at once, all starting with the same ~500-word preamble

It also times vsurge's start to readiness with a warm compilation cache, the
first request after start-up, and prints the table with vsurge/llama-server
ratios (`--write-readme` puts it into the page that holds its marker: docs/performance.md).

    python benchmarks/serve.py [--skip-llama] [--vsurge-args "--quantization int8"] [--loads "1 stream,32"]
                               [--write-readme]

The CPU's ISA (vsurge.kernels.cpu_isa(), the block kernel's variant and any XLA_FLAGS ISA cap)
heads the output and the table: run it under `XLA_FLAGS=--xla_cpu_max_isa=AVX2 VSURGE_CPU_ISA=avx2`
to measure what an AVX2-only CPU gets, with LLAMA_SERVER=<a llama-server built for AVX2 only> for the peer
(the shared script builds it for the machine's own ISA).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from vsurge import kernels
from vsurge.cli.bench_serve import TABLE_HEADER, async_client, format_summary, format_trace, http_client, run
from vsurge.hardware.devices import xla_cpu_isa_cap
from vsurge.loading import default_model_path

ROOT = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = ROOT.parent / "shared" / "peers" / "build-llama-server.sh"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}
LOADS = [  # (name, prompts, max concurrency, shared preamble words)
    ("1 stream", 4, 1, 0),
    ("8 concurrent", 8, 8, 0),
    ("16 concurrent", 16, 16, 0),
    ("32 concurrent", 32, 32, 0),
    ("16 conc. + shared 500-word preamble", 16, 16, 500),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def llama_server_binary() -> str:
    """$LLAMA_SERVER if set (e.g. a build for another ISA), else the shared script's build (made if missing)."""
    if os.environ.get("LLAMA_SERVER"):
        return os.environ["LLAMA_SERVER"]
    found = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, check=True)
    return found.stdout.strip().splitlines()[-1]


def die_with_parent() -> None:
    """In a server's child process: end it when the benchmark ends, however it ends (a benchmark killed
    mid-run left its vsurge server running, and its ~16% of a core skewed the next runs' numbers)."""
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Server:
    """A server process on loopback, or with uds=True on a unix socket (`{socket}` in cmd; the TPU machine here
    has no TCP); its output goes to a file (an unread pipe would block it)."""

    def __init__(self, name: str, cmd: list[str], ready_path: str, uds: bool = False):
        self.name = name
        self.uds = tempfile.mktemp(prefix="serve-bench-", suffix=".sock") if uds else None
        self.port = None if uds else free_port()
        self.base = "http://localhost" if uds else f"http://127.0.0.1:{self.port}"
        self.ready_url = self.base + ready_path
        self.log = tempfile.NamedTemporaryFile("w", prefix="serve-bench-", suffix=".log", delete=False)
        self.started = time.perf_counter()
        cmd = [c.replace("{port}", str(self.port)).replace("{socket}", str(self.uds)) for c in cmd]
        self.proc = subprocess.Popen(cmd, env=ENV, stdout=self.log, stderr=subprocess.STDOUT, text=True,
                                     preexec_fn=die_with_parent)

    def client(self, **kwargs) -> httpx.Client:
        return http_client(self.uds, **kwargs)

    def async_client(self, **kwargs) -> httpx.AsyncClient:
        return async_client(self.uds, base_url=self.base, **kwargs)

    def wait_ready(self, timeout: float = 1200) -> float:
        """Seconds from start to ready."""
        deadline = time.time() + timeout
        with self.client(timeout=2) as client:
            while time.time() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"server exited: {Path(self.log.name).read_text()[-3000:]}")
                try:
                    if client.get(self.ready_url).status_code == 200:
                        return time.perf_counter() - self.started
                except httpx.HTTPError:
                    pass
                time.sleep(0.25)
        raise TimeoutError(self.ready_url)

    def wait_compiled(self, timeout: float = 600) -> float:
        """Seconds waited until no program compiles in the background (vsurge's /v1/stats
        `programs_compiling`; a server without it, llama-server, is taken as compiled)."""
        began, deadline = time.perf_counter(), time.time() + timeout
        with self.client(timeout=10) as client:
            while time.time() < deadline:
                r = client.get(self.base + "/v1/stats")
                if r.status_code != 200 or not any(m.get("programs_compiling") for m in r.json().get("models", [])):
                    return time.perf_counter() - began
                time.sleep(1.0)
        raise TimeoutError(f"{self.name}: programs still compiling after {timeout} s")

    def model(self) -> str:
        with self.client(timeout=30) as client:
            return client.get(self.base + "/v1/models").json()["data"][0]["id"]

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def isa_line() -> str:
    cap = xla_cpu_isa_cap()
    return (f"CPU ISA {kernels.cpu_isa()}, block kernel {kernels.variant() or 'unavailable'}"
            + (f", XLA capped at {cap}" if cap else ""))


def measure(server: Server, args) -> dict:
    model = server.model()
    first = asyncio.run(run(server.base, model, 1, args.input_len, 16, float("inf"), 1, None, 2, seed=99))
    results = {"first request TTFT s": first["ttft"]["median"]}
    for index, (name, prompts, concurrency, preamble) in enumerate(args.loads):
        # each load its own prompts: with one seed for all, a load's first prompts were the previous load's,
        # answered from both servers' prompt caches (the 32-prompt load's TTFT p50 1.2 s, alone 4.1 s)
        summary = asyncio.run(run(server.base, model, prompts, args.input_len, args.output_len, float("inf"),
                                  concurrency, None, 2, seed=100 + index, shared_prefix_len=preamble))
        print(format_summary(f"{server.name} · {name}", summary), flush=True)
        if summary.get("server_trace"):
            print(format_trace(summary), flush=True)
        if summary["failed"]:  # a failed request's tokens are missing from the row's tok/s
            print(f"  {summary['failed']} failed: {summary['errors']}", file=sys.stderr, flush=True)
        results[name] = summary
    return results


def vsurge_cmd(extra: str, uds: bool = False) -> list[str]:
    """`vsurge serve` on Server's port, or with uds on its unix socket."""
    where = ["--uds", "{socket}"] if uds else ["--port", "{port}"]
    return [sys.executable, "-m", "vsurge.cli", "serve", *where, "--metrics-port", "-1", *shlex.split(extra)]


def table(vs: dict, peer: dict | None, start_s: float, command: str, loads=LOADS, model: str = "default model",
          input_len: int = 128, output_len: int = 128) -> str:
    lines = [f"`{command}`, {model}, {input_len}-word prompts, {output_len} output tokens, streamed; "
             f"{time.strftime('%Y-%m-%d')}, this {os.cpu_count()}-core machine ({isa_line()}), one run.", "",
             "| load | vsurge tok/s | llama-server tok/s | ratio | vsurge TTFT p50 s | llama-server TTFT p50 s | "
             "TTFT ratio | chunk gap p50 ms (vsurge / llama-server) |", "|---|---|---|---|---|---|---|---|"]
    for name, *_ in loads:
        v = vs[name]
        p = peer[name] if peer else None
        tok = f"{p['output_throughput']:.1f}" if p else "-"
        ratio = f"{v['output_throughput'] / p['output_throughput']:.2f}x" if p else "-"
        ttft = f"{p['ttft']['median']:.2f}" if p else "-"
        tratio = f"{v['ttft']['median'] / p['ttft']['median']:.2f}x" if p else "-"
        gap = f"{v['itl']['median'] * 1000:.0f}" + (f" / {p['itl']['median'] * 1000:.0f}" if p else "")
        lines.append(f"| {name} | {v['output_throughput']:.1f} | {tok} | {ratio} | {v['ttft']['median']:.2f} | "
                     f"{ttft} | {tratio} | {gap} |")
    lines += ["", f"vsurge start to ready with a warm compilation cache: {start_s:.1f} s; "
              f"first request after start-up: TTFT {vs['first request TTFT s']:.2f} s."]
    return "\n".join(lines)


def write_readme(text: str, marker: str = "serve-table") -> None:
    """Puts `text` between the <!-- marker --> and <!-- /marker --> lines of README.md or the docs/ page that
    holds them (the tables moved from the README to docs/ in issue 61; the flag kept its name)."""
    pattern = re.compile(rf"(<!-- {marker} -->\n).*?(<!-- /{marker} -->)", re.S)
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        body = page.read_text()
        if pattern.search(body):
            page.write_text(pattern.sub(lambda m: m.group(1) + text + "\n" + m.group(2), body))
            return
    raise SystemExit(f"neither README.md nor docs/*.md has a <!-- {marker} --> section")


def main(argv=None, argv_command: str = "") -> int:
    """argv_command: the command to print with the table (a script that calls this one)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--vsurge-args", default="", help="extra `vsurge serve` flags (default: none, the fast path)")
    p.add_argument("--skip-llama", action="store_true")
    p.add_argument("--write-readme", action="store_true")
    p.add_argument("--readme-marker", default="serve-table", help="the marked section --write-readme replaces (README.md or docs/)")
    p.add_argument("--loads", default="", help="comma list of load names' beginnings (default: all but 8 concurrent)")
    p.add_argument("--model", default="", help="a GGUF file both servers run (default: the default model)")
    args = p.parse_args(argv)
    wanted = [w.strip() for w in args.loads.split(",") if w.strip()]
    args.loads_arg = args.loads
    args.loads = [load for load in LOADS if (any(load[0].startswith(w) for w in wanted) if wanted
                                             else not load[0].startswith("8 "))]
    model_path = Path(args.model) if args.model else default_model_path()
    if args.model:
        args.vsurge_args = f"--model {shlex.quote(str(model_path))} {args.vsurge_args}".strip()
    print(isa_line())
    print(TABLE_HEADER)
    # vsurge: a first start fills the compilation cache, the second is timed warm
    warmup = Server("vsurge", vsurge_cmd(args.vsurge_args), "/readiness")
    cold = warmup.wait_ready()
    warmup.stop()
    server = Server("vsurge", vsurge_cmd(args.vsurge_args), "/readiness")
    warm = server.wait_ready()
    print(f"vsurge ready in {cold:.1f} s (first start), {warm:.1f} s (warm compilation cache)", flush=True)
    try:
        vs = measure(server, args)
    finally:
        server.stop()
    peer = None
    if not args.skip_llama:
        binary = llama_server_binary()
        llama = Server("llama-server", [binary, "-m", str(model_path), "--host", "127.0.0.1", "--port",
                                        "{port}", "-np", "32", "-c", "32768", "-t", str(os.cpu_count() or 2)],
                       "/health")
        llama.wait_ready()
        try:
            peer = measure(llama, args)
        finally:
            llama.stop()
    extra = args.vsurge_args.split(str(model_path), 1)[-1].strip() if args.model else args.vsurge_args
    command = argv_command or ("python benchmarks/serve.py" + (f" --vsurge-args {shlex.quote(extra)}" if extra else ""))
    if args.loads_arg and not argv_command:
        command += f" --loads {shlex.quote(args.loads_arg)}"
    if args.input_len != 128 and not argv_command:
        command += f" --input-len {args.input_len}"
    text = table(vs, peer, warm, command, args.loads, model_path.name if args.model else "default model",
                 args.input_len, args.output_len)
    print("\n" + text)
    if args.write_readme:
        write_readme(text, args.readme_marker)
    return 0


if __name__ == "__main__":
    sys.exit(main())
