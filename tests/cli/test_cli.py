"""The `vsurge` command on the real default model, run as users run it (a subprocess each).

Every command shares one compilation cache (tests/cli_helpers.py), so only the first one compiles the
CLI engine's programs; the others load them from disk.
"""

from __future__ import annotations

import collections
import fcntl
import json
import queue
import signal
import struct
import subprocess
import termios
import threading
import time

from cli_helpers import popen_cli, run_cli

FRANCE = "What is the capital of France?"
POEM = "Write a short poem about the sea."


def test_generate_greedy_answers_with_paris_and_reports_speed():
    out = run_cli("generate", FRANCE, "--temperature", "0", "--max-tokens", "16")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("The capital of France is Paris."), out.stdout
    assert "Loading" in out.stderr and "Compiling" in out.stderr and "Sampling: greedy" in out.stderr
    assert "tok/s]" in out.stderr


def test_generate_json_from_a_file_for_scripts_and_a_raw_prompt_skips_the_template(tmp_path):
    """--file, --json and --raw in one run (a `vsurge` start costs ~9 s): the file's text, its final newline
    dropped, is the whole prompt, no chat template around it."""
    from vsurge.loading import load_processor

    raw = "The capital of France is"
    prompt = tmp_path / "prompt.txt"
    prompt.write_text(raw + "\n")
    out = run_cli("generate", "--file", str(prompt), "--raw", "--json", "--temperature", "0", "--max-tokens", "12")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)  # exactly one JSON object on stdout, nothing else
    assert "Paris" in result["text"], result
    assert result["prompt_tokens"] == len(load_processor("default").encode(raw)), result  # no template
    assert result["finish_reason"] in ("stop", "length") and 0 < len(result["tokens"]) <= 12
    assert result["completion_tokens"] == len(result["tokens"])
    timings = result["timings"]
    assert 0 < timings["first_token_s"] <= timings["total_s"] and timings["decode_tokens_per_s"] > 0


def test_generate_follows_a_json_schema(tmp_path):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                               "is_capital": {"type": "boolean"}},
              "required": ["city", "is_capital"], "additionalProperties": False}
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    out = run_cli("generate", "Describe Paris as JSON.", "--json-schema", str(path), "--temperature", "0",
                  "--max-tokens", "48")
    assert out.returncode == 0, out.stderr
    reply = json.loads(out.stdout)
    assert set(reply) == {"city", "is_capital"} and isinstance(reply["is_capital"], bool), out.stdout
    assert len(reply["city"]) <= 20


def test_default_sampling_does_not_loop_on_a_poem():
    """The issue's loop: plain greedy decoding repeated one line for 256 tokens. The default model's
    shipped settings (greedy with a 1.2 repetition penalty) must not."""
    out = run_cli("generate", POEM, "--system", "You are terse.", "--seed", "0", "--max-tokens", "256", "--json")
    assert out.returncode == 0, out.stderr
    assert "Sampling: greedy, repetition_penalty 1.2" in out.stderr
    text = json.loads(out.stdout)["text"]
    lines = collections.Counter(line.strip() for line in text.splitlines() if line.strip())
    assert lines and max(lines.values()) <= 2, text


def test_chat_keeps_history_joins_multiline_input_obeys_commands_and_drops_its_oldest_exchanges():
    """One chat (a `vsurge` start each costs ~9 s): first history, joined lines and the commands; after a
    /reset, five questions in a 160-token context, where the 3rd outgrows it and the oldest exchanges go."""
    from vsurge.loading import load_processor
    from vsurge.tokenizer.compat import chat_prompt_ids

    countries = [f"What is the capital of {country}?"
                 for country in ("France", "Italy", "Spain", "Germany", "Portugal")]
    stdin = "\n".join([
        FRANCE,
        "And of \\",  # a trailing backslash continues the message on the next line
        "Italy?",
        "/help",
        "/reset",
        '"""',  # a block: everything up to the closing quotes is one message
        "Say hello",
        "",
        "in French.",
        '"""',
        "/reset",
        *countries,
        "/exit",
        "never sent",
    ]) + "\n"
    out = run_cli("chat", "--max-length", "160", "--max-tokens", "48", "--temperature", "0", "--json", stdin=stdin)
    assert out.returncode == 0, out.stderr
    replies = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(replies) == 3 + len(countries), out.stdout  # commands are not sent; "never sent" is not read
    assert "Paris" in replies[0]["text"] and "Rome" in replies[1]["text"], replies
    assert "/reset forgets the conversation" in out.stderr
    # each prompt is exactly the conversation the commands leave: history, joined lines, reset
    processor = load_processor("default")
    first = [{"role": "user", "content": FRANCE}]
    second = first + [{"role": "assistant", "content": replies[0]["text"]},
                      {"role": "user", "content": "And of \nItaly?"}]
    third = [{"role": "user", "content": "Say hello\n\nin French."}]
    assert [r["prompt_tokens"] for r in replies[:3]] == [len(chat_prompt_ids(processor, m))
                                                         for m in (first, second, third)]
    # the countries' conversation starts afresh and keeps within the context by dropping its oldest exchanges
    assert replies[3]["prompt_tokens"] == replies[0]["prompt_tokens"]
    assert "dropped the oldest exchange" in out.stderr
    assert all(r["prompt_tokens"] + 48 <= 160 for r in replies), replies


class _Lines:
    """Lines of a pipe, read on a thread so the test can wait for one with a timeout."""

    def __init__(self, pipe):
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, args=(pipe,), daemon=True).start()

    def _pump(self, pipe):
        for line in pipe:
            self.lines.put(line)

    def wait_for(self, predicate, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        seen = []
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                continue
            seen.append(line)
            if predicate(line):
                return line
        raise AssertionError(f"timed out; saw: {''.join(seen)[-2000:]}")


def _wait_until_read(pipe, timeout: float = 60) -> None:
    """Until the process on the other end has read everything written to `pipe` (FIONREAD: bytes
    still in the pipe)."""
    deadline = time.monotonic() + timeout
    while True:
        left = struct.unpack("i", fcntl.ioctl(pipe.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
        if not left:
            return
        assert time.monotonic() < deadline, f"the chat did not read its input ({left} bytes left)"
        time.sleep(0.01)


def test_ctrl_c_stops_a_reply_and_a_second_at_the_prompt_quits():
    """The race this test once lost: a Ctrl-C after the message was written but before the reply began
    (the chat still reading it, rendering the template, tokenizing: ~20 ms idle, seconds on a loaded
    machine) quit the chat with no JSON line. Now Ctrl-C stops the reply from the moment its message
    is read, and the test signals only after the chat has read it."""
    proc = popen_cli("chat", "--max-tokens", "2000", "--json", "--temperature", "0", stdin=subprocess.PIPE,
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        stdout, stderr = _Lines(proc.stdout), _Lines(proc.stderr)
        stderr.wait_for(lambda line: line.startswith("Sampling:"), timeout=600)  # compiled, warmed up
        proc.stdin.write("Write a very long story about a dragon who learns to cook.\n")
        proc.stdin.flush()
        _wait_until_read(proc.stdin)  # a Ctrl-C before that would quit at the prompt, as it should
        # the reply has begun (a Ctrl-C stops it from the moment its message is read); a short wait, since
        # a greedy story can end within a few seconds at this CPU's ~50 tok/s
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        stopped = json.loads(stdout.wait_for(lambda line: line.startswith("{"), timeout=60))
        assert stopped["finish_reason"] == "interrupted" and proc.poll() is None, (
            f"{stopped['finish_reason']} after {stopped['completion_tokens']} tokens, timings "
            f"{stopped['timings']}; stderr since: {list(stderr.lines.queue)[-5:]}")
        proc.stdin.write(FRANCE + "\n")  # the chat goes on
        proc.stdin.flush()
        answer = json.loads(stdout.wait_for(lambda line: line.startswith("{"), timeout=120))
        assert "Paris" in answer["text"] and answer["finish_reason"] == "stop"
        proc.send_signal(signal.SIGINT)  # at the prompt: quit
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_bad_arguments_fail_cleanly(tmp_path, capsys):
    """Each refusal through the CLI's own main() in this process (a `vsurge` start costs ~3 s), and the
    last as the real command, whose exit status and stderr a user sees."""
    from vsurge.cli import main

    cases = [
        (("generate", "hi", "--max-tokens", "0"), "--max-tokens must be at least 1"),
        (("generate", "hi", "--top-p", "1.5"), "--top-p must be in (0, 1]"),
        (("chat", "--repeat-penalty", "0"), "--repeat-penalty must be in (0, 100]"),
        (("generate",), "give a prompt"),
        (("generate", "--file", str(tmp_path / "absent.txt")), "cannot read --file"),
        (("generate", "hi", "--generation-config", str(tmp_path / "absent.json")), "--generation-config"),
        (("generate", "hi", "--model", str(tmp_path / "missing")), "does not exist"),
        (("generate", "hi", "--json-schema", str(tmp_path / "absent.json")), "cannot read --json-schema"),
        (("generate", "hi", "--json-schema", "-", "--regex", "a+"), "not both"),
        (("generate", "hi", "--tensor-parallel-size", "0"), "--tensor-parallel-size must be at least 1"),
        (("serve", "--speculative-tokens", "17"), "--speculative-tokens must be in [0, 16]"),
    ]
    for args, message in cases[:-1]:
        try:
            code = main(list(args))
        except SystemExit as exit_:
            code = exit_.code
        stderr = capsys.readouterr().err + (code if isinstance(code, str) else "")  # SystemExit(message): printed at exit
        assert code not in (0, None) and "vsurge: error: " in stderr and message in stderr, (args, stderr)
        assert "Loading" not in stderr  # refused before loading
    args, message = cases[-1]
    out = run_cli(*args, timeout=120)
    assert out.returncode != 0 and "vsurge: error: " in out.stderr and message in out.stderr, (args, out.stderr)
    assert "Traceback" not in out.stderr and "Loading" not in out.stderr


def test_ctrl_c_between_reading_a_message_and_its_reply_stops_that_reply(capsys):
    """The race's window, without timing: Ctrl-C lands while the chat template renders."""
    from vsurge.cli.chat_session import run_chat
    from vsurge.cli.local_engine import Reply
    from vsurge.sampling.params import SamplingParams

    class Surge:
        vsurge_name = "fake"

    class Engine:
        max_length, surge, templated = 256, Surge(), 0

        def chat_prompt(self, messages):
            self.templated += 1
            if self.templated == 1:
                raise KeyboardInterrupt  # what the SIGINT handler raises at that moment
            return [1, 2, 3]

        def reply(self, ids, params, on_text=None):
            return Reply(prompt_tokens=len(ids), text="Paris.", token_ids=[7], finish_reason="stop")

    class Lines:
        interactive = False

        def __init__(self, lines):
            self.lines = iter(lines)

        def __call__(self, prompt):
            return next(self.lines, None)

    code = run_chat(Engine(), SamplingParams(max_tokens=16), system=None, as_json=True,
                    reader=Lines(["Tell me a story.", "What is the capital of France?"]))
    replies = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 0 and [r["finish_reason"] for r in replies] == ["interrupted", "stop"]  # the chat went on
    assert replies[1]["text"] == "Paris."
