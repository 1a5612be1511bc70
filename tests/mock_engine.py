"""A hand-computable engine for driver tests: no model, no JAX.

Prefill's first token is 10 + sum(prompt) % 7; every decode step adds 1 to a
slot's token. A request therefore produces first, first+1, ... until an eos
id or max_tokens. Failures and delays can be injected per call.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np


class CharProcessor:
    """token i <-> the letter chr(97 + i % 26); eos is token 0."""

    eos_token_id = 0
    eos_token_ids = [0]
    pad_token_id = 0
    bos_token_id = None

    def __init__(self):
        self.fail = False

    def encode(self, text, add_special_tokens=True):
        return [ord(c) - 97 for c in text]

    def decode(self, ids, skip_special_tokens=False):
        if self.fail:
            raise RuntimeError("injected detokenizer failure")
        return "".join(chr(97 + int(i) % 26) for i in ids if not (skip_special_tokens and int(i) == 0))


@dataclasses.dataclass
class MockPrefix:
    first: np.ndarray
    done: bool
    k: np.ndarray  # (1, 1, 1, T, 1): only its shape is used
    max_new: int
    eos: tuple


@dataclasses.dataclass
class MockResult:
    tokens: np.ndarray
    valid: np.ndarray


class MockEngine:
    def __init__(self, slots: int = 3, vocab: int = 1000, decode_delay: float = 0.0, max_length: int = 512):
        self.max_concurrent_decodes = slots
        self.max_concurrent_prefill = 1
        self.max_length = max_length
        self.max_prefill_length = 256
        self.prefill_lengths = [256]
        self.processor = CharProcessor()
        self.eos_token_ids = [0]
        self.vocab = vocab
        self.decode_delay = decode_delay
        self.fail_on: dict[str, int] = {}  # method -> call number that raises
        self.calls: dict[str, int] = {"prefill": 0, "insert": 0, "decode": 0}
        self.inserted_slots: list[int] = []
        self.freed_slots: list[int] = []
        self.max_busy = 0
        self.lock = threading.Lock()
        self.compiled = False

    def _count(self, name):
        self.calls[name] += 1
        if self.fail_on.get(name) == self.calls[name]:
            raise RuntimeError(f"injected {name} failure")

    def compile(self, progress: bool = False):
        self.compiled = True

    def new_seed(self):
        return 0

    def init_decode_state(self):
        b = self.max_concurrent_decodes
        return {"tokens": np.zeros(b, np.int64), "active": np.zeros(b, bool), "generated": np.zeros(b, np.int64),
                "max_new": np.zeros(b, np.int64), "eos": [set() for _ in range(b)]}

    def prefill_request(self, request):
        self._count("prefill")
        first = 10 + sum(request.prompt_ids) % 7
        done = first in request.eos_token_ids or request.max_new_tokens <= 1
        return MockPrefix(np.asarray([first]), done, np.zeros((1, 1, 1, len(request.prompt_ids), 1)),
                          request.max_new_tokens, tuple(request.eos_token_ids))

    def insert(self, prefix, state, slot):
        self._count("insert")
        state["tokens"][slot] = prefix.first[0]
        state["active"][slot] = not prefix.done
        state["generated"][slot] = 1
        state["max_new"][slot] = prefix.max_new
        state["eos"][slot] = set(prefix.eos)
        self.inserted_slots.append(slot)
        self.max_busy = max(self.max_busy, int(state["active"].sum()))
        return state

    def set_slot_position(self, slot, position):
        pass

    def free_resource(self, slot):
        self.freed_slots.append(slot)
        return True

    def decode(self, graphstate, graphothers, state, rngs=None):
        self._count("decode")
        if self.decode_delay:
            time.sleep(self.decode_delay)
        valid = state["active"].copy()
        state["tokens"] = np.where(valid, (state["tokens"] + 1) % self.vocab, state["tokens"])
        state["generated"] = state["generated"] + valid
        for slot in np.flatnonzero(valid):
            if state["tokens"][slot] in state["eos"][slot] or state["generated"][slot] >= state["max_new"][slot]:
                state["active"][slot] = False
        return state, MockResult(state["tokens"].copy(), valid)


def expected_tokens(prompt_ids, max_tokens, eos=()):
    """What a request must receive from the mock engine."""
    token = 10 + sum(prompt_ids) % 7
    out = []
    while True:
        out.append(token)
        if token in eos or len(out) >= max_tokens:
            return out
        token += 1
