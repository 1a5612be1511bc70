"""Packing prompts for the embed/score passes (engine/encode.py, host side, no JAX): every prompt once,
whole, in one row, never overlapping; short prompts share rows; what does not fit waits."""

from __future__ import annotations

import numpy as np

from vsurge.engine.encode import MAX_SEGMENTS, EncodeRequest, batch_of, pack


def requests(lengths):
    return [EncodeRequest(list(range(1, n + 1)), "embed", None) for n in lengths]


def check(shape, taken, places):
    rows, length = shape
    used = np.zeros((rows, length), bool)
    for request, (row, start) in zip(taken, places):
        span = used[row, start:start + len(request.prompt_ids)]
        assert span.size == len(request.prompt_ids) and not span.any()
        span[:] = True


def test_short_prompts_share_rows_and_the_batch_marks_segments():
    pending = requests([7, 6, 8, 7] * 16)  # 64 prompts, 448 tokens: one call of at most 512
    shape, taken, places = pack(pending, token_budget=512, max_length=512)
    assert len(taken) == 64 and shape[0] * shape[1] <= 512
    check(shape, taken, places)
    batch = batch_of(shape, taken, places)
    assert (batch.segments >= 0).sum() == sum(len(r.prompt_ids) for r in taken)
    for i, (request, (row, start)) in enumerate(zip(taken, places)):
        n = len(request.prompt_ids)
        assert (batch.segments[row, start:start + n] == i).all()
        assert batch.positions[row, start:start + n].tolist() == list(range(n))
        assert batch.targets[row, start:start + n - 1].tolist() == request.prompt_ids[1:]
        assert batch.targets[row, start + n - 1] == -1 and batch.counts[i] == n
        assert batch.last[i] == row * shape[1] + start + n - 1


def test_what_does_not_fit_waits_and_long_prompts_get_long_rows():
    pending = requests([300, 20, 20, 200])
    shape, taken, places = pack(pending, token_budget=512, max_length=2048)
    check(shape, taken, places)
    assert shape[1] >= 300 and shape[0] * shape[1] <= 512
    served = {id(r) for r in taken}
    assert pending[0] in taken and len(served) < 4  # 540 tokens: not all in one 512-token call
    alone = pack(requests([1500]), token_budget=512, max_length=2048)
    assert alone[0] == (1, 2048) and len(alone[1]) == 1  # a prompt over the budget still gets a call


def test_at_most_max_segments_prompts_per_call():
    shape, taken, places = pack(requests([1] * 300), token_budget=512, max_length=512)
    assert len(taken) == MAX_SEGMENTS
    check(shape, taken, places)
