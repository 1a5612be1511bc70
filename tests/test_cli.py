"""The `vsurge` command on the real default model, run as users run it."""

from __future__ import annotations

import os
import subprocess
import sys

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "JAX_PLATFORMS": "cpu"}


def run_cli(*args, stdin=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "vsurge.cli", *args], input=stdin, capture_output=True,
                          text=True, timeout=timeout, env=ENV)


def test_generate_answers_with_paris():
    out = run_cli("generate", "What is the capital of France?", "--max-tokens", "16")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("The capital of France is Paris."), out.stdout
    assert "Loading" in out.stderr and "tok/s" in out.stderr


def test_chat_streams_replies_and_keeps_history():
    out = run_cli("chat", "--max-tokens", "24", stdin="What is the capital of France?\nAnd of Italy?\n\n")
    assert out.returncode == 0, out.stderr
    assert "Paris" in out.stdout and "Rome" in out.stdout, out.stdout


def test_raw_prompt_skips_template():
    out = run_cli("generate", "The capital of France is", "--raw", "--max-tokens", "4")
    assert out.returncode == 0, out.stderr
    assert "Paris" in out.stdout


def test_bad_arguments_fail_cleanly(tmp_path):
    out = run_cli("generate", "hi", "--max-tokens", "0")
    assert out.returncode != 0 and "--max-tokens must be at least 1" in out.stderr
    out = run_cli("generate", "hi", "--model", str(tmp_path / "missing"))
    assert out.returncode != 0 and "does not exist" in out.stderr and "Traceback" not in out.stderr
