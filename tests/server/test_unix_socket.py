"""`vsurge serve --uds PATH`: the real server on a unix domain socket (no TCP at all), reached by the real
openai SDK and loaded by `vsurge bench serve --uds PATH`; the path checked before the model loads."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile

import pytest

from cli_helpers import run_cli
from server_process import ENV, ServerProcess, client_for, free_port
from tiny_models import write_tiny_model

TINY_NAME = "tiny-uds"
# tests/server/test_server.py's tiny server's engine flags: the same programs, so they load from the compilation cache
TINY_ARGS = ("--max-concurrent-decodes", "16", "--max-length", "128", "--max-prefill-length", "64",
             "--prefill-lengths", "64", "--max-queue", "128")


def _listens(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _free_port_pair() -> int:
    """A port p with p + 1 free too (where the metrics port would go by default)."""
    while True:
        port = free_port()
        if not _listens(port) and not _listens(port + 1):
            return port


def _dead_server_socket(path: str) -> None:
    """Leave a socket file at `path` as a killed server does: bound, then closed without unlinking."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.close()


@pytest.fixture(scope="module")
def socket_dir():
    # not pytest's tmp_path: a unix socket path holds at most 107 bytes
    folder = tempfile.mkdtemp(prefix="vsurge-uds-")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, default_processor_dir):
    folder = tmp_path_factory.mktemp("tiny_uds_model")
    write_tiny_model("llama", folder, default_processor_dir)
    return folder


@pytest.fixture(scope="module")
def uds_server(tiny_dir, cache_dir, socket_dir):
    """A server on a socket path where a dead server left its socket file; --port is given and must lose."""
    path = os.path.join(socket_dir, "vsurge.sock")
    _dead_server_socket(path)
    port = _free_port_pair()
    server = ServerProcess(str(tiny_dir), "--served-model-name", TINY_NAME, "--port", str(port), *TINY_ARGS,
                           cache_dir=cache_dir, uds=path).wait_ready()
    server.port = port
    yield server
    server.stop()


def test_serves_readiness_and_chat_over_the_socket_only(uds_server):
    assert uds_server.get("/readiness").status_code == 200
    reply = client_for(uds_server).chat.completions.create(
        model=TINY_NAME, messages=[{"role": "user", "content": "Hello"}], max_tokens=4, temperature=0)
    assert reply.model == TINY_NAME and reply.usage.completion_tokens >= 1
    assert reply.choices[0].finish_reason in ("length", "stop")
    # --uds wins over --port, and the separate metrics port (default port + 1) is off
    assert not _listens(uds_server.port) and not _listens(uds_server.port + 1)
    assert f"serving {TINY_NAME} on unix socket {uds_server.uds} " in uds_server.output
    assert "metrics on port" not in uds_server.output
    assert b"vsurge:request_success" in uds_server.get("/metrics").content  # /metrics answers on the socket itself


def test_bench_serve_loads_the_socket(uds_server):
    out = subprocess.run(
        [sys.executable, "-m", "vsurge.cli", "bench", "serve", "--uds", uds_server.uds, "--wait-ready", "60",
         "--num-prompts", "2", "--input-len", "8", "--output-len", "4"],
        capture_output=True, text=True, timeout=300, env=ENV)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "| server | done | req/s | output tok/s |" in out.stdout
    assert f"| unix:{uds_server.uds} | 2/2 |" in out.stdout, out.stdout


@pytest.mark.parametrize("what", ["a regular file", "a folder", "a live server's socket"])
def test_a_path_that_is_not_free_is_refused_before_loading(what, uds_server, socket_dir):
    path = {"a live server's socket": uds_server.uds}.get(what, os.path.join(socket_dir, what.replace(" ", "-")))
    if what == "a regular file":
        with open(path, "w") as f:
            f.write("keep me\n")
    elif what == "a folder":
        os.makedirs(path, exist_ok=True)
    out = run_cli("serve", "--uds", path, "--model", "no-such-model-is-ever-loaded", timeout=120)
    assert out.returncode != 0
    assert f"--uds {path}" in out.stderr, out.stderr
    expected = "another server is listening" if what == "a live server's socket" else "exists and is not a socket"
    assert expected in out.stderr
    assert "Loading" not in out.stderr  # refused before the model loads
    assert os.path.exists(path)  # nothing removed: the file, the folder, the live server's socket
    if what == "a regular file":
        assert open(path).read() == "keep me\n"


def test_the_socket_file_is_removed_at_shutdown(uds_server):
    assert os.path.exists(uds_server.uds)
    assert uds_server.stop() == 0
    assert not os.path.exists(uds_server.uds)
