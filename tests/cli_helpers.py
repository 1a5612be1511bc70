"""Running the real `vsurge` command in tests: offline, on CPU, all sharing one compilation cache.

The cache directory is made once per test session (VSURGE_TEST_COMPILATION_CACHE names a lasting one), so
the first `vsurge chat`/`generate` compiles the CLI engine's programs and every later one loads them.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import vsurge
from xla_flags import at_default_level


def _cache_dir() -> str:
    lasting = os.environ.get("VSURGE_TEST_COMPILATION_CACHE")
    if lasting:
        return lasting
    made = tempfile.mkdtemp(prefix="vsurge-cli-xla-")
    atexit.register(shutil.rmtree, made, ignore_errors=True)
    return made


CACHE_DIR = _cache_dir()
SRC_DIR = str(Path(vsurge.__file__).resolve().parents[1])  # the vsurge under test, also in subprocesses
ENV = at_default_level({**os.environ, "HF_HUB_OFFLINE": "1", "JAX_PLATFORMS": "cpu",
                        "VSURGE_COMPILATION_CACHE": CACHE_DIR,
                        "PYTHONPATH": os.pathsep.join(p for p in (SRC_DIR, os.environ.get("PYTHONPATH")) if p)})
VSURGE = [sys.executable, "-m", "vsurge.cli"]


def run_cli(*args: str, stdin: str | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([*VSURGE, *args], input=stdin, capture_output=True, text=True, timeout=timeout, env=ENV)


def as_from_a_terminal() -> None:
    """In a `vsurge` child before it starts: SIGINT unblocked and at its default, as a terminal's
    program gets it. A child inherits its parent's signal mask and ignored signals, and in the full
    suite (2 workers) a pytest worker had SIGINT blocked: a `vsurge chat` started from it ignored
    Ctrl-C (three fresh-clone runs in three on a 2-core AMD EPYC), never when its test ran alone."""
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def popen_cli(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([*VSURGE, *args], text=True, env=ENV, preexec_fn=as_from_a_terminal, **kwargs)
