"""README's quick start, run as written: so it cannot drift from what the program does.

Every command of the shell blocks under "## Quick start" runs against the real CLI on the default model:
`vsurge generate` as is, `vsurge chat` with a question on stdin, `vsurge serve` until it is ready (then
the `curl` lines run against it, and SIGTERM must drain it to exit 0). `make` lines are the set-up this
test environment already has. Any other command fails the test until this file learns it.
Also, over README.md and every docs/*.md page (where the README's other sections moved, issue 61): every
`vsurge ...` line of a shell block parses with the real argument parser, and every "N families" is the
registry's count.
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import pytest
from cli_helpers import popen_cli, run_cli
from server_process import DEFAULT_SERVER_ARGS, free_port

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
QUESTION = "What is the capital of France?\n"
README_PORT = "11556"
# The README's `vsurge serve` runs as written plus these: a free port, and the engine of the suite's shared
# default server (the server's default engine is sized for 32 concurrent requests), whose programs the
# run's cache holds by then (conftest.default_server starts earlier in SLOW_FIRST's order).
SERVE_TEST_FLAGS = ["--metrics-port", "-1", *DEFAULT_SERVER_ARGS]


def shell_blocks(section: str | None = None, page: Path = README) -> list[str]:
    text = page.read_text(encoding="utf-8")
    if section is not None:
        text = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)```", text, re.S)


def commands(block: str) -> list[list[str]]:
    """argv of each command in a block (comments dropped, backslash-continued lines joined)."""
    out = []
    for line in block.replace("\\\n", " ").splitlines():
        argv = shlex.split(line, comments=True)
        if argv:
            out.append(argv)
    return out


def quick_start_commands() -> list[list[str]]:
    return [argv for block in shell_blocks("Quick start") for argv in commands(block)]


def test_the_quick_start_has_the_commands_a_new_user_needs():
    firsts = [" ".join(argv[:2]) for argv in quick_start_commands()]
    for needed in ("vsurge generate", "vsurge chat", "vsurge serve", "curl http://127.0.0.1:11556/v1/chat/completions"):
        assert needed in firsts, firsts


def test_the_readme_and_docs_count_the_registrys_families():
    """Every "N families" README.md or a docs/ page says in digits is the registry's count (issue 61: the README
    said twenty-six, thirty and nineteen in words, all stale); counts in words are kept for small subsets
    ("five families"), never for the whole."""
    from vsurge.models.registry import families

    counts = {}
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        counts[page.name] = [int(n) for n in re.findall(r"\b(\d+)(?: model)? families", text)]
        assert not re.search(r"\b(nineteen|twenty|thirty)[\w-]* (model )?families", text, re.IGNORECASE), page.name
    assert counts["README.md"], "the README no longer says how many families vsurge runs"
    wrong = {name: c for name, c in counts.items() if set(c) - {len(families())}}
    assert not wrong, f"the registry has {len(families())} families: {wrong}"


def test_the_models_table_lists_the_registrys_model_types():
    """docs/models.md's "Supported models" table names every HF model_type a family declares and no other, and
    every GGUF architecture one reads (a family added or renamed without its row fails here)."""
    from vsurge.models.registry import gguf_architectures, hf_model_types

    section = (ROOT / "docs" / "models.md").read_text(encoding="utf-8").split("## Supported models", 1)[1]
    table = re.search(r"^\| family \|.*?\n(?=\n)", section, re.M | re.S).group(0)
    rows = [line.split("|")[1:-1] for line in table.splitlines()[2:]]  # (after the header and its rule)
    assert len(rows) > 30, "the table was not found"
    model_types = {name for row in rows for name in re.findall(r"`([^`]+)`", row[1])}
    gguf_names = {name for row in rows for name in re.findall(r"`([^`]+)`", row[2])}
    assert model_types == set(hf_model_types()), "docs/models.md's HF model_type column differs from the registry"
    assert set(gguf_architectures()) <= gguf_names, "GGUF architectures missing from docs/models.md"


def test_every_vsurge_line_in_the_readme_and_docs_parses():
    from vsurge.cli import build_parser

    lines = [(page.name, argv) for page in PAGES for block in shell_blocks(page=page)
             for argv in commands(block) if argv[0] == "vsurge"]
    assert len(lines) > 10 and {name for name, _ in lines} >= {"README.md", "serving.md", "cli.md"}, lines
    for name, argv in lines:
        try:
            build_parser().parse_args(argv[1:])  # a fresh parser: no state carried between lines
        except SystemExit:
            pytest.fail(f"{name}: command does not parse: {shlex.join(argv)}")


class _Server:
    def __init__(self, argv: list[str]):
        self.port = free_port()
        self.log = tempfile.TemporaryFile("w+")  # a file, not a pipe: nobody reads while it serves
        self.proc = popen_cli(*argv[1:], "--port", str(self.port), *SERVE_TEST_FLAGS, stdout=self.log,
                              stderr=subprocess.STDOUT)
        deadline = time.time() + 600
        while time.time() < deadline:
            assert self.proc.poll() is None, f"`{shlex.join(argv)}` exited early:\n{self.output()}"
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/readiness", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.proc.kill()
        pytest.fail(f"`{shlex.join(argv)}` did not become ready:\n{self.output()}")

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()[-3000:]

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


def test_quick_start_commands_run():
    server = None
    try:
        for argv in quick_start_commands():
            shown = shlex.join(argv)
            if argv[0] == "make":
                continue
            if argv[:2] == ["vsurge", "serve"]:
                server = _Server(argv)
                assert "Sampling defaults for unset request fields" in server.output()
            elif argv[0] == "vsurge":
                stdin = QUESTION if argv[1] == "chat" else None
                out = run_cli(*argv[1:], stdin=stdin)
                assert out.returncode == 0, f"`{shown}` failed:\n{out.stderr[-3000:]}"
                assert out.stdout.strip(), f"`{shown}` printed no reply"
                if argv[1] == "generate" and "capital of France" in shown:  # the first answer a user sees
                    assert "Paris" in out.stdout, out.stdout
                assert re.search(r"tok/s(, \w+)?\]", out.stderr) and "Traceback" not in out.stderr, out.stderr[-3000:]
            elif argv[0] == "curl":
                assert server is not None, f"`{shown}` needs the `vsurge serve` of an earlier line"
                argv = [a.replace(f"127.0.0.1:{README_PORT}", f"127.0.0.1:{server.port}") for a in argv]
                out = subprocess.run([*argv, "--silent", "--show-error"], capture_output=True, text=True, timeout=300)
                assert out.returncode == 0, f"`{shown}` failed: {out.stderr}"
                answer = json.loads(out.stdout)["choices"][0]["message"]["content"]
                assert "Paris" in answer, answer
            else:
                pytest.fail(f"the quick start has a command this test does not know how to run: {shown}")
        if server is not None:
            assert server.stop() == 0, server.output()
            server = None
    finally:
        if server is not None and server.proc.poll() is None:
            server.proc.kill()
