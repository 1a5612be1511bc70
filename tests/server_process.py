"""Start `vsurge serve` as a real process on loopback and wait until it is ready."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from xla_flags import at_default_level

ENV = at_default_level({**os.environ, "HF_HUB_OFFLINE": "1", "JAX_PLATFORMS": "cpu"})  # tests/xla_flags.py
DEFAULT_NAME = "SmolLM2-135M-Instruct"
# The default model's server of the test suite: small enough to compile fast (conftest.default_server).
DEFAULT_SERVER_ARGS = ("--max-concurrent-decodes", "8", "--max-length", "512", "--prefill-lengths", "128",
                       "--max-queue", "128")


def client_for(server, api_key="unused", **kw):
    import openai

    if getattr(server, "uds", None):  # the real SDK, its every request through the unix socket
        kw.setdefault("http_client", httpx.Client(transport=httpx.HTTPTransport(uds=server.uds)))
    return openai.OpenAI(base_url=server.base + "/v1", api_key=api_key, max_retries=0, **kw)


# Ports for the tests' servers come from below the kernel's ephemeral range (and above Ray's worker ports,
# 10002-19999): a port the OS hands out for bind(0) is free only until the server binds it, seconds later
# after compiling, and meanwhile any outgoing connection (gloo, gRPC, Ray) may take it as its local port;
# a CI run lost the two-process server's metrics port that way ("Address already in use").
_PORTS = (20000, 32767)
_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback port free now, outside the range outgoing connections draw from, not handed out before by
    this process."""
    high = min(_PORTS[1], _ephemeral_low() - 1)
    for _ in range(200 if high > _PORTS[0] else 0):
        port = random.randint(_PORTS[0], high)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as s:  # (a machine whose ephemeral range starts low: the OS's choice)
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, model: str, *extra: str, cache_dir: str, scheme: str = "http", verify=True,
                 env: dict | None = None, preamble: str | None = None, uds: str | None = None):
        """preamble: Python run in the server process before `vsurge serve` (a test's injected fault).
        uds: serve on this unix socket path (`--uds`, no port flags) and send every request through it."""
        self.uds = uds
        self.verify = verify
        if uds:
            self.port = self.metrics_port = None
            self.base = f"{scheme}://localhost"  # the host is ignored: the transport connects to the socket
            listen = ["--uds", uds]
        else:
            self.port, self.metrics_port = free_port(), free_port()
            self.base = f"{scheme}://127.0.0.1:{self.port}"
            listen = ["--port", str(self.port), "--metrics-port", str(self.metrics_port)]
        start = ["-m", "vsurge.cli"] if preamble is None else [
            "-c", preamble + "\nimport sys\nfrom vsurge.cli import main\nsys.exit(main())"]
        cmd = [sys.executable, *start, "serve", "--model", model, *listen, "--compilation-cache", cache_dir, *extra]
        # output goes to a file: nobody reads a pipe while the tests run, and a full pipe blocks the server
        self.log = tempfile.NamedTemporaryFile("w+", prefix="vsurge-serve-", suffix=".log")
        self.proc = subprocess.Popen(cmd, env={**ENV, **(env or {})}, stdout=self.log, stderr=subprocess.STDOUT,
                                     text=True)

    @property
    def output(self) -> str:
        with open(self.log.name) as f:
            return f.read()

    def wait_ready(self, timeout: float = 300) -> "ServerProcess":
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.output[-4000:]}")
            try:
                # ready, and the serving line printed: it follows readiness (the start-up thread prints it)
                if (self.request("GET", "/readiness", timeout=2).status_code == 200
                        and "vsurge: serving " in self.output):
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError("the server did not become ready")

    def request(self, method: str, path: str, timeout: float, **kw) -> httpx.Response:
        if self.uds is None:
            return httpx.request(method, self.base + path, verify=self.verify, timeout=timeout, **kw)
        with httpx.Client(transport=httpx.HTTPTransport(uds=self.uds), timeout=timeout) as client:
            return client.request(method, self.base + path, **kw)

    def get(self, path, **kw):
        return self.request("GET", path, 30, **kw)

    def post(self, path, **kw):
        return self.request("POST", path, 120, **kw)

    def delete(self, path, **kw):
        return self.request("DELETE", path, 30, **kw)

    def metric(self, name: str) -> float:
        """Sum of a metric's samples from /metrics (all label values)."""
        total = 0.0
        for line in self.get("/metrics").text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
