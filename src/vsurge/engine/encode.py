"""Whole-prompt passes that generate nothing: embeddings and prompt log-probabilities (host side).

An `EncodeRequest` is one prompt whose final hidden states (pooled: the mean over its
tokens and its last token) or whose tokens' log-probabilities are wanted. The driver's
thread batches every waiting one: prompts are packed into rows of one of a few lengths
(first fit, longest first), several short prompts per row, each a segment with its own
positions that attends only to itself, so one device call serves many requests
(`pack`). The device programs are `embed` and `score` in programs.py.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time

import numpy as np

MAX_SEGMENTS = 128  # prompts one call holds (its pooled outputs are (MAX_SEGMENTS, D))
MIN_LENGTH = 16  # the shortest row length
KINDS = ("embed", "score")

_ids = itertools.count()


@dataclasses.dataclass(eq=False)
class EncodeRequest:
    """One prompt to encode; its result (or an exception) is put on `channel`.

    kind "embed": the result is {"mean": (D,), "last": (D,)} float32 (the final hidden states,
    after the final norm, averaged over the prompt / of its last token). kind "score": the
    result is a PromptScores: for every prompt token after the first, its log-probability
    given the ones before, its rank, and the 20 likeliest tokens there."""

    prompt_ids: list[int]
    kind: str
    channel: object  # a ReturnChannel
    request_id: int = dataclasses.field(default_factory=lambda: next(_ids))
    submitted_at: float = dataclasses.field(default_factory=time.perf_counter)
    cancelled: threading.Event = dataclasses.field(default_factory=threading.Event)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")

    def cancel(self) -> None:
        self.cancelled.set()

    @property
    def is_cancelled(self) -> bool:
        return self.cancelled.is_set()


@dataclasses.dataclass
class EncodeBatch:
    """Inputs of one embed/score call: R rows of C tokens holding up to MAX_SEGMENTS prompts."""

    tokens: np.ndarray  # (R, C) i32
    positions: np.ndarray  # (R, C) i32 position within its own prompt
    segments: np.ndarray  # (R, C) i32 which prompt of the call (-1: padding)
    targets: np.ndarray  # (R, C) i32 the prompt's next token (-1: none, its last token or padding)
    last: np.ndarray  # (MAX_SEGMENTS,) i32 flat index (row * C + column) of each prompt's last token
    counts: np.ndarray  # (MAX_SEGMENTS,) f32 tokens of each prompt (0: unused)


def _pow2_at_least(n: int, low: int) -> int:
    size = low
    while size < n:
        size *= 2
    return size


def row_lengths(longest: int) -> list[int]:
    """Row lengths of the programs, MIN_LENGTH and its doublings up to one holding `longest` tokens."""
    lengths, n = [], MIN_LENGTH
    while True:
        lengths.append(n)
        if n >= longest:
            return lengths
        n *= 2


def _fill(order: list[EncodeRequest], length: int, max_rows: int, one_per_row: bool = False):
    """First fit of `order` (longest first) into rows of `length` -> (rows used, taken, places);
    one_per_row: each request in a row of its own."""
    free: list[int] = []  # room left in each row
    taken, places = [], []
    for request in order:
        if len(taken) == MAX_SEGMENTS:
            break
        need = len(request.prompt_ids)
        row = None if one_per_row else next((i for i, room in enumerate(free) if room >= need), None)
        if row is None:
            if len(free) == max_rows:
                continue
            free.append(length)
            row = len(free) - 1
        places.append((row, length - free[row]))
        free[row] -= need
        taken.append(request)
    return len(free), taken, places


def pack(requests: list[EncodeRequest], token_budget: int, max_length: int, one_per_row: bool = False):
    """Plan ONE call over the waiting requests: -> ((rows, length), the requests it holds, their
    (row, start) places). Requests are taken longest first, each into the first row with room.
    Row lengths from the smallest that holds the longest request up to the token budget are tried
    (rows: as many as the budget allows, at least one, padded to a power of two): the one that
    serves the most prompt tokens for the fewest computed wins, the shorter on ties (attention is
    quadratic in it). What does not fit waits for the next call. one_per_row: never two prompts in one
    row (a model with recurrent layers carries its state along a row, kv/recurrent.py)."""
    order = sorted(requests, key=lambda r: -len(r.prompt_ids))
    shortest = _pow2_at_least(len(order[0].prompt_ids), MIN_LENGTH)
    best, best_key = None, None
    for length in row_lengths(max(shortest, min(token_budget, _pow2_at_least(max_length, MIN_LENGTH)))):
        if length < shortest:
            continue
        max_rows = max(1, token_budget // length)
        used, taken, places = _fill(order, length, max_rows, one_per_row)
        rows = min(max_rows, _pow2_at_least(used, 1))
        served = sum(len(r.prompt_ids) for r in taken)
        key = (served, -rows * length, -length)
        if best_key is None or key > best_key:
            best, best_key = ((rows, length), taken, places), key
    return best


def batch_of(shape: tuple[int, int], requests: list[EncodeRequest], places: list[tuple[int, int]]) -> EncodeBatch:
    rows, length = shape
    tokens = np.zeros((rows, length), np.int32)
    positions = np.zeros((rows, length), np.int32)
    segments = np.full((rows, length), -1, np.int32)
    targets = np.full((rows, length), -1, np.int32)
    last = np.zeros(MAX_SEGMENTS, np.int32)
    counts = np.zeros(MAX_SEGMENTS, np.float32)
    for i, (request, (row, start)) in enumerate(zip(requests, places)):
        ids = np.asarray(request.prompt_ids, np.int32)
        end = start + len(ids)
        tokens[row, start:end], positions[row, start:end], segments[row, start:end] = ids, np.arange(len(ids)), i
        targets[row, start:end - 1] = ids[1:]
        last[i], counts[i] = row * length + end - 1, len(ids)
    return EncodeBatch(tokens, positions, segments, targets, last, counts)


def embed_results(mean: np.ndarray, last: np.ndarray, count: int) -> list[dict]:
    """The embed program's (MAX_SEGMENTS, D) outputs -> one result per request of the call."""
    return [{"mean": mean[i], "last": last[i]} for i in range(count)]


@dataclasses.dataclass
class PromptScores:
    """Entry t is about prompt token t+1, scored from the tokens before it."""

    logprobs: np.ndarray  # (T-1,) f32
    ranks: np.ndarray  # (T-1,) i32, 1 = the likeliest
    top_ids: np.ndarray  # (T-1, 20) i32
    top_logprobs: np.ndarray  # (T-1, 20) f32


def score_results(batch: EncodeBatch, places, requests, chosen, rank, top_ids, top_values) -> list[PromptScores]:
    """The score program's (R, C[, K]) outputs -> one PromptScores per request of the call."""
    out = []
    for request, (row, start) in zip(requests, places):
        end = start + len(request.prompt_ids) - 1
        out.append(PromptScores(chosen[row, start:end], rank[row, start:end], top_ids[row, start:end],
                                top_values[row, start:end]))
    return out
