"""`vsurge chat`: read messages, stream replies, keep the conversation.

Input: one line is one message. A line ending with a backslash continues on the
next line; a line starting with three double quotes opens a block that ends at
a line ending with three double quotes. `/reset` forgets the conversation (the
system prompt stays), `/exit` (or Ctrl-D) quits, `/help` lists this. Ctrl-C
while a reply streams stops that reply; Ctrl-C at the prompt quits.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Callable, TextIO

from ..sampling.params import SamplingParams
from .local_engine import LocalEngine, Reply, status

BLOCK = '"""'
CONTINUATION = "\\"
HELP = ("Type a message and press Enter. End a line with \\ to continue on the next line, or wrap several "
        'lines in """ ... """.\n/reset forgets the conversation, /image FILE attaches an image to your next '
        "message (a vision-language model), /exit or Ctrl-D quits, /help shows this. "
        "Ctrl-C stops a reply; at the prompt it quits.")


class LineReader:
    """Lines from the terminal (with a prompt and line editing) or from a pipe (silently)."""

    def __init__(self, stream: TextIO = sys.stdin):
        self.stream = stream
        self.interactive = stream.isatty()
        if self.interactive:
            try:
                import readline  # noqa: F401: gives input() history and line editing
            except ImportError:
                pass

    def __call__(self, prompt: str) -> str | None:
        """The next line without its newline, or None at end of input."""
        if self.interactive:
            try:
                return input(prompt)
            except EOFError:
                return None
        line = self.stream.readline()
        return None if line == "" else line.rstrip("\r\n")


def read_message(read_line: Callable[[str], str | None]) -> str | None:
    """One message, joining continued lines and \"\"\" blocks; None at end of input."""
    line = read_line("> ")
    if line is None:
        return None
    if line.lstrip().startswith(BLOCK):
        first = line.lstrip()[len(BLOCK):]
        if first.rstrip().endswith(BLOCK):  # """one line"""
            return first.rstrip()[: -len(BLOCK)]
        lines = [first] if first else []
        while (line := read_line("... ")) is not None:
            if line.rstrip().endswith(BLOCK):
                lines.append(line.rstrip()[: -len(BLOCK)])
                break
            lines.append(line)
        return "\n".join(lines).strip("\n")
    lines = []
    while line is not None and line.endswith(CONTINUATION):
        lines.append(line[: -len(CONTINUATION)])
        line = read_line("... ")
    lines.append(line or "")
    return "\n".join(lines)


class Conversation:
    """The messages so far; drops the oldest exchanges when the context would overflow."""

    def __init__(self, system: str | None):
        self.system = system
        self.messages: list[dict] = []
        self.images: list[bytes] = []  # attached to the next user message (/image FILE)
        self.reset()

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []

    def add(self, role: str, content: str) -> None:
        """A message; a user message takes the images attached since the last one (/image)."""
        if role == "user" and self.images:
            content = [{"type": "image", "data": data} for data in self.images] + [{"type": "text", "text": content}]
            self.images = []
        self.messages.append({"role": role, "content": content})

    def prompt_ids(self, engine: LocalEngine, room_for_reply: int) -> list[int] | None:
        """Token ids of the conversation, leaving `room_for_reply` tokens; None if even the last
        message alone does not fit."""
        first = 1 if self.system else 0
        alone = self.messages[:first] + self.messages[-1:]
        if len(engine.chat_prompt(alone)) + room_for_reply > engine.max_length:
            return None  # keep the history: dropping it would not make room
        while True:
            ids = engine.chat_prompt(self.messages)
            if len(ids) + room_for_reply <= engine.max_length:
                return ids
            # drop the oldest user message and the reply to it
            del self.messages[first: first + 2]
            status("(the conversation outgrew the context: dropped the oldest exchange)")


def run_chat(engine: LocalEngine, params: SamplingParams, *, system: str | None, as_json: bool,
             first_message: str | None = None, reader: LineReader | None = None) -> int:
    """The chat loop; every reply samples with `params` (max_tokens shrinks to what the context leaves)."""
    reader = reader or LineReader()
    conversation = Conversation(system)
    if reader.interactive:
        status(f"Chat with {engine.surge.vsurge_name}. /help for commands; Ctrl-C stops a reply, /exit or Ctrl-D quits.")
    pending = first_message
    while True:
        try:
            done = _turn(engine, params, conversation, reader, pending, as_json)
        except KeyboardInterrupt:  # Ctrl-C outside a reply (at the prompt): leave, as llama.cpp's CLI does;
            print(file=sys.stderr)  # one during a reply only stops it (LocalEngine.reply)
            return 0
        if done:
            return 0
        pending = None


def _turn(engine: LocalEngine, params: SamplingParams, conversation: Conversation, reader: LineReader,
          pending: str | None, as_json: bool) -> bool:
    """Read one message and answer it; True when the chat should end."""
    message = pending if pending is not None else read_message(reader)
    if message is None:
        return True
    command = message.strip()
    if not command:
        return False
    if command in ("/exit", "/quit"):
        return True
    if command == "/reset":
        conversation.reset()
        status("(conversation cleared)")
        return False
    if command == "/help":
        status(HELP)
        return False
    if command.startswith("/image "):
        path = command[len("/image "):].strip()
        try:
            with open(path, "rb") as f:
                conversation.images.append(f.read())
            status(f"(image {path} attached to your next message)")
        except OSError as e:
            status(f"vsurge: error: cannot read {path}: {e.strerror}")
        return False
    if command.startswith("/") and " " not in command:
        status(f"unknown command {command}: /help lists the commands")
        return False
    conversation.add("user", message)
    ids = None
    try:
        ids = conversation.prompt_ids(engine, room_for_reply=min(params.max_tokens, engine.max_length // 2))
        if ids is None:
            status(f"vsurge: error: that message does not fit in the context of {engine.max_length} tokens")
            conversation.messages.pop()
            return False
        room = params.replace(max_tokens=min(params.max_tokens, engine.max_length - len(ids)))
        reply = engine.reply(ids, room, on_text=None if as_json else write_text)
    except ValueError as e:  # the engine refused the request (its message says why)
        status(f"vsurge: error: {e}")
        conversation.messages.pop()
        return False
    except KeyboardInterrupt:
        # Ctrl-C once the message is read but before its reply started (the chat template and the
        # tokenizer run first: ~20 ms, seconds on a loaded machine) stops that reply, as it would a
        # moment later inside engine.reply; only Ctrl-C while waiting for input quits.
        reply = Reply(prompt_tokens=len(ids or ()), finish_reason="interrupted", seed=params.seed)
        reply.finished_at = time.perf_counter()
    if as_json:
        print(json.dumps(reply.as_json(), ensure_ascii=False), flush=True)
    else:
        write_text("\n")
        status(reply.timing_line())
    conversation.add("assistant", reply.text)
    return False


def write_text(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
