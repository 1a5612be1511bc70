"""A hand-computable engine for driver tests: no model, no JAX (engine/interface.py's contract).

The real Scheduler plans every step over SlotPages. A prompt row that ends its
prompt samples 10 + sum(prompt) % 7; every decode step adds 1 to a row's
token. A request therefore produces first, first+1, ... until an eos id or
max_tokens. Failures and delays can be injected per call.

For disaggregated drivers a prefix is the list of token ids whose K/V the
prefill engine computed; the decode engine checks it against the sequence it
attaches (`inserted`), so a prefix that went to the wrong sequence fails loudly.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np

from vsurge.engine import ActiveRequest, ReturnChannel
from vsurge.engine.engine_config import EngineConfig
from vsurge.engine.scheduler import Scheduler
from vsurge.kv.slot_pages import SlotPages
from vsurge.sampling.params import SamplingParams

TIMEOUT = 20


class CharProcessor:
    """token i <-> the letter chr(97 + i % 26); eos is token 0."""

    eos_token_id = 0
    eos_token_ids = [0]
    pad_token_id = 0
    bos_token_id = None

    def __init__(self):
        self.fail = False
        self.fail_on_token: int | None = None  # decoding this token raises (one request's failure)

    def encode(self, text, add_special_tokens=True):
        return [ord(c) - 97 for c in text]

    def decode(self, ids, skip_special_tokens=False):
        if self.fail or (self.fail_on_token is not None and self.fail_on_token in list(ids)):
            raise RuntimeError("injected detokenizer failure")
        return "".join(chr(97 + int(i) % 26) for i in ids if not (skip_special_tokens and int(i) == 0))


@dataclasses.dataclass
class MockOutput:
    tokens: np.ndarray
    valid: np.ndarray
    logprobs: None = None
    chunk_offset: int = 0
    compute_seconds: float = 0.0  # the "device" time, spent when the host reads the tokens (as JAX's)

    def to_host(self, with_logprobs: bool):
        time.sleep(self.compute_seconds)
        return self


def first_token(prompt_ids) -> int:
    return 10 + sum(prompt_ids) % 7


class MockEngine:
    def __init__(self, slots: int = 3, vocab: int = 1000, decode_delay: float = 0.0, max_length: int = 512,
                 decode_steps: int = 1, step_seconds: float = 0.0, decode_call_ms: float = 100.0):
        """decode_delay: the step call itself blocks this long; step_seconds: "device" time per step
        of a call, spent when its tokens are read."""
        self.config = EngineConfig(max_slots=slots, max_length=max_length, page_size=16, prefill_tokens=64,
                                   decode_steps=decode_steps, decode_call_ms=decode_call_ms)
        self.step_seconds = step_seconds
        self.steps: list[tuple[float, list[int], int]] = []  # (called at, request ids prefilled, steps) per call
        self.pool = SlotPages(slots, max_length, 16)
        self.processor = CharProcessor()
        self.vocab_size = vocab
        self.eos_token_ids = [0]
        self.model_name = "mock"
        self.decode_delay = decode_delay
        self.fail_on: dict[str, int] = {}  # method -> call number that raises
        self.calls = {"step": 0, "export": 0, "receive": 0, "insert": 0}
        self.chunk_rows = 0  # prompt rows computed, over every step
        self.decode_rows = 0
        self.inserted: list[int] = []  # request ids whose prefix this engine received
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
        self.chunk_rows += len(plan.chunks)
        self.decode_rows += len(plan.decode)
        self.slots_used.update(s.slot for s in plan.sequences)
        d = len(plan.decode)
        k = plan.num_steps if not plan.chunks else 1
        self.steps.append((time.perf_counter(), [c.seq.seq_id for c in plan.chunks], k))
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
            if chunk.samples:  # a recomputed (preempted) sequence goes on where it was
                seq = chunk.seq
                token = seq.tokens[-1] + 1 if seq.generated else first_token(seq.tokens)
                tokens[0, d + j], valid[0, d + j] = token, True
        return state, MockOutput(tokens, valid, chunk_offset=d, compute_seconds=self.step_seconds * k)


    # -- disaggregated serving: a "prefix" is the tokens whose K/V were computed
    def export_prefix(self, state, seq):
        self.calls["export"] += 1
        return {"tokens": list(seq.tokens[: seq.num_computed]), "seq": seq.seq_id}

    def receive_prefix(self, prefix):
        self.calls["receive"] += 1
        return dict(prefix)

    def insert_prefix(self, state, prefix, seq):
        self.calls["insert"] += 1
        if prefix["seq"] != seq.seq_id or prefix["tokens"] != seq.tokens[: seq.num_computed]:
            raise AssertionError(f"prefix of request {prefix['seq']} inserted for request {seq.seq_id}")
        self.inserted.append(seq.seq_id)
        return state


def expected_tokens(prompt_ids, max_tokens, eos=()):
    """What a request must receive from the mock engine."""
    token = first_token(prompt_ids)
    out = []
    while True:
        out.append(token)
        if token in eos or len(out) >= max_tokens:
            return out
        token += 1


def make_request(prompt, max_tokens=5, eos=(), stop=None):
    """A greedy ActiveRequest with its own return channel, as a driver receives it."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, stop=stop)
    return ActiveRequest(list(prompt), params, seed=0, max_new_tokens=max_tokens, eos_token_ids=list(eos),
                         channel=ReturnChannel())


def drain(request, timeout=TIMEOUT):
    """All items of one request until its final sample (or an exception)."""
    items = []
    while True:
        item = request.channel.get(timeout=timeout)
        items.append(item)
        if isinstance(item, BaseException) or item.finish_reason is not None:
            return items


def tokens_of(items):
    return [t for s in items for t in s.token_ids]
