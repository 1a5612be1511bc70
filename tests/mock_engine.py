"""A hand-computable engine for driver tests: no model, no JAX (engine/interface.py's contract).

The real Scheduler plans every step over SlotPages. A prompt row that ends its
prompt samples 10 + sum(prompt) % 7; every decode step adds 1 to a row's
token. A request therefore produces first, first+1, ... until an eos id or
max_tokens. Failures and delays can be injected per call.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np

from vsurge.engine.config import EngineConfig
from vsurge.engine.scheduler import Scheduler
from vsurge.kv.page_manager import SlotPages


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
class MockOutput:
    tokens: np.ndarray
    valid: np.ndarray
    logprobs: None = None
    chunk_offset: int = 0

    def to_host(self, with_logprobs: bool):
        return self


def first_token(prompt_ids) -> int:
    return 10 + sum(prompt_ids) % 7


class MockEngine:
    def __init__(self, slots: int = 3, vocab: int = 1000, decode_delay: float = 0.0, max_length: int = 512,
                 decode_steps: int = 1):
        self.config = EngineConfig(max_slots=slots, max_length=max_length, page_size=16, prefill_tokens=64,
                                   decode_steps=decode_steps)
        self.pool = SlotPages(slots, max_length, 16)
        self.processor = CharProcessor()
        self.vocab_size = vocab
        self.eos_token_ids = [0]
        self.model_name = "mock"
        self.decode_delay = decode_delay
        self.fail_on: dict[str, int] = {}  # method -> call number that raises
        self.calls = {"step": 0}
        self.max_busy = 0
        self.slots_used: set[int] = set()
        self.compiled = False
        self.lock = threading.Lock()

    max_length = property(lambda self: self.config.max_length)
    max_prompt_length = property(lambda self: self.config.prompt_limit)
    max_concurrent_decodes = property(lambda self: self.config.max_slots)

    def new_seed(self) -> int:
        return 0

    def new_scheduler(self) -> Scheduler:
        return Scheduler(self.pool, self.config)

    def compile(self, progress: bool = False) -> None:
        self.compiled = True

    def init_state(self):
        return {}

    def step(self, state, plan, masks=None):
        self.calls["step"] += 1
        if self.fail_on.get("step") == self.calls["step"]:
            raise RuntimeError("injected step failure")
        if self.decode_delay:
            time.sleep(self.decode_delay)
        self.max_busy = max(self.max_busy, len(plan.sequences))
        self.slots_used.update(s.slot for s in plan.sequences)
        d = len(plan.decode)
        k = plan.num_steps if not plan.chunks else 1
        tokens = np.zeros((k, d + len(plan.chunks)), np.int64)
        valid = np.zeros_like(tokens, bool)
        for i, seq in enumerate(plan.decode):
            token, made = seq.tokens[-1], len(seq.generated)
            for step in range(k):
                # a one-token prompt decodes straight away: its first sample follows the prompt rule
                token = first_token(seq.tokens) - 1 if made == 0 and step == 0 else token
                token += 1
                tokens[step, i], valid[step, i] = token, True
                made += 1
                if token in seq.request.eos_token_ids or made >= seq.request.max_new_tokens:
                    break
        for j, chunk in enumerate(plan.chunks):
            if chunk.samples:
                tokens[0, d + j], valid[0, d + j] = first_token(chunk.seq.tokens), True
        return state, MockOutput(tokens, valid, chunk_offset=d)


def expected_tokens(prompt_ids, max_tokens, eos=()):
    """What a request must receive from the mock engine."""
    token = first_token(prompt_ids)
    out = []
    while True:
        out.append(token)
        if token in eos or len(out) >= max_tokens:
            return out
        token += 1
