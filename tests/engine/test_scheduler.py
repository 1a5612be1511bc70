"""The scheduler alone: pure Python over a real page pool, no JAX, milliseconds per test.

A fake step (`run`) plays the device: prompt rows that end their sequence and
decode rows sample token 7, so plans and page tables can be checked by hand.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from vsurge.engine.engine_config import EngineConfig
from vsurge.engine.request import ActiveRequest, ReturnChannel
from vsurge.engine.scheduler import Scheduler
from vsurge.engine.sequence import Sequence, Status
from vsurge.kv.page_manager import HBMPageManager
from vsurge.kv.slot_pages import SlotPages
from vsurge.sampling.params import SamplingParams


class Letters:
    """token i <-> letter chr(97 + i % 26); eos 0."""

    eos_token_ids = [0]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(97 + int(i) % 26) for i in ids)


def seq(prompt_len: int, max_tokens: int = 4, first: int = 1, priority: int = 0) -> Sequence:
    prompt = list(range(first, first + prompt_len))
    request = ActiveRequest(prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, priority=priority), 0,
                            max_tokens, [0], ReturnChannel())
    return Sequence.of(request, Letters())


class Out:
    def __init__(self, plan, token=7):
        rows = plan.decode_row_count + len(plan.chunks)
        self.tokens = np.full((plan.num_steps, rows), token)
        self.valid = np.ones((plan.num_steps, rows), bool)
        self.logprobs = None
        self.chunk_offset = plan.decode_row_count


def run(scheduler, steps=1):
    plans = []
    for _ in range(steps):
        plan = scheduler.schedule()
        scheduler.postprocess(plan, Out(plan))
        plans.append(plan)
    return plans


def make(pages=64, page_size=4, slots=4, prefill_tokens=16, chunk_lengths=(4, 16), paged=True, decode_steps=1,
         policy="fcfs"):
    config = EngineConfig(max_slots=slots, max_length=32, page_size=page_size, prefill_tokens=prefill_tokens,
                          chunk_lengths=chunk_lengths, decode_steps=decode_steps, scheduling_policy=policy)
    pool = HBMPageManager(pages, page_size) if paged else SlotPages(slots, 32, page_size)
    return Scheduler(pool, config)


def test_no_jax_is_imported():
    code = ("import sys; import vsurge.engine.scheduler, vsurge.kv.page_manager, vsurge.engine.sequence; "
            "assert 'jax' not in sys.modules, 'jax was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_admission_is_fifo_and_prompts_share_a_step():
    s = make()
    a, b, c = seq(5), seq(3, first=20), seq(9, first=40)
    for x in (a, b, c):
        s.add(x)
    plan = s.schedule()
    assert plan.chunk_shape == (4, 4)  # 4 rows of 4 tokens schedule 16 prompt tokens, more than 1 row of 16
    assert [(r.seq, r.start, r.length) for r in plan.chunks] == [(a, 0, 4), (a, 4, 1), (b, 0, 3), (c, 0, 4)]
    assert [x.slot for x in (a, b, c)] == [0, 1, 2] and not plan.decode
    assert [r.samples for r in plan.chunks] == [False, True, True, False]
    s.postprocess(plan, Out(plan))
    assert a.tokens[-1] == 7 and b.tokens[-1] == 7 and c.remaining == 5
    plan = s.schedule()
    # 5 tokens left either way: the longer row wins the tie (one gather of c's pages, not two)
    assert plan.decode == [a, b] and [(r.seq, r.start, r.length) for r in plan.chunks] == [(c, 4, 5)]


def test_a_long_prompt_is_cut_to_the_budget_and_resumes():
    s = make(chunk_lengths=(16,))
    long = seq(40)
    s.add(long)
    first, second, third = run(s, 3)
    assert [(r.start, r.length) for r in first.chunks] == [(0, 16)]
    assert [(r.start, r.length) for r in second.chunks] == [(16, 16)]
    assert [(r.start, r.length) for r in third.chunks] == [(32, 8)]  # ends the prompt: it samples
    assert long.generated == [7] and long.num_computed == 40


def test_one_token_prompt_decodes_at_once():
    s = make()
    one = seq(1)
    s.add(one)
    plan = s.schedule()
    assert plan.decode == [one] and not plan.chunks


def test_finished_sequences_free_slot_and_pages():
    s = make(decode_steps=4)
    a = seq(3, max_tokens=3)
    s.add(a)
    run(s, 3)  # prompt, the second token (a new sequence's first decode call is one step), the last
    assert a.status is Status.FINISHED and a.output.finish_reason == "length" and a.generated == [7, 7, 7]
    assert s.pool.num_used_pages == 0 and not s.running and s._free_slots == [0, 1, 2, 3]


def test_decode_steps_shrink_to_what_rows_may_still_generate():
    s = make(decode_steps=8)
    a, b = seq(3, max_tokens=10), seq(3, max_tokens=4, first=9)
    s.add(a), s.add(b)
    run(s, 2)  # the prompts, then each one's second token
    plan = s.schedule()
    assert plan.num_steps == 2  # b may make 2 more tokens


def test_preemption_takes_the_newest_and_recomputes_it():
    s = make(pages=5, page_size=4, slots=2, chunk_lengths=(8,), prefill_tokens=8)
    old, new = seq(8, max_tokens=12), seq(8, max_tokens=12, first=30)
    s.add(old), s.add(new)
    for _ in range(12):  # 5 pages cannot hold both at 9+ tokens each
        run(s)
        if s.num_preemptions:
            break
    assert s.num_preemptions == 1 and new.status is Status.WAITING and new.num_computed == 0
    assert old.status is Status.RUNNING and new.generated  # what it made is kept for the recompute
    kept = list(new.generated)
    while s.has_work:
        run(s)
    assert old.generated == [7] * 12 and new.generated == [7] * 12 and new.generated[: len(kept)] == kept
    assert s.pool.num_used_pages == 0


def test_prefix_cache_hit_skips_the_cached_pages():
    s = make(page_size=4)
    a = seq(10)
    s.add(a)
    run(s, 2)
    b = seq(10)
    s.add(b)
    plan = s.schedule()
    assert b.num_computed == 8 and [(r.start, r.length) for r in plan.chunks if r.seq is b] == [(8, 2)]
    assert s.pool.prefix_hits == 8


def test_dense_pool_gives_each_slot_its_own_pages():
    s = make(paged=False, page_size=8)
    a, b = seq(3), seq(3, first=9)
    s.add(a), s.add(b)
    run(s)
    assert a.pages.pages == [0, 1, 2, 3] and b.pages.pages == [4, 5, 6, 7]


def test_abort_while_waiting_or_running():
    s = make(slots=1)
    running, waiting = seq(3), seq(3, first=9)
    s.add(running), s.add(waiting)
    run(s)
    assert s.abort(waiting).finish_reason == "abort" and waiting not in s.waiting
    assert s.abort(running).finish_reason == "abort" and not s.running and s.pool.num_used_pages == 0


@pytest.mark.parametrize("prompt_len", [1, 4, 5, 17])
def test_every_prompt_token_is_computed_once(prompt_len):
    s = make(chunk_lengths=(4,))
    a = seq(prompt_len)
    s.add(a)
    computed = []
    while not a.generated:
        plan = s.schedule()
        computed += [t for r in plan.chunks for t in range(r.start, r.start + r.length)]
        computed += [len(x.tokens) - 1 for x in plan.decode]
        s.postprocess(plan, Out(plan))
    assert computed == list(range(prompt_len))


def test_a_short_prompt_alone_takes_the_smallest_shape_that_holds_it():
    """A step costs the tokens its shape holds: one 20-token prompt runs in one row of 32, a 100-token
    one in the 128-token shape, a burst of them in the full 512-token ones, and a long prompt in the
    long rows."""
    config = EngineConfig(max_slots=8, max_length=1024, page_size=16)
    assert config.chunk_shapes == [(1, 32), (4, 32), (16, 32), (1, 512)]

    def first_shape(*lengths):
        s = Scheduler(HBMPageManager(512, 16), config)
        for i, n in enumerate(lengths):
            s.add(seq(n, first=1 + 1000 * i))
        return s.schedule().chunk_shape

    assert first_shape(100) == (4, 32)
    assert first_shape(100, 100, 100) == (16, 32)
    assert first_shape(300) == (1, 512)
    # 130 tokens: the 128-token shape now and 2 tokens next (256 tokens' work), not a quarter-full 512
    assert first_shape(130) == (4, 32)
    assert first_shape(20) == (1, 32)  # a lone chat turn: one short row
    assert first_shape(10) == (1, 32)  # nothing is half full: the most tokens, in the smallest shape


def test_a_burst_of_short_prompts_is_prefilled_in_one_step():
    """32 chat turns of 12 tokens arriving together: one step of 32 rows of 16 tokens (in rows of 32
    they took two steps of 512 tokens, 40% of them prompt); fewer slots than rows: no such shape."""
    config = EngineConfig(max_slots=32, max_length=1024, page_size=16)
    s = Scheduler(HBMPageManager(512, 16), config)
    burst = [seq(12, first=1 + 100 * i) for i in range(32)]
    for x in burst:
        s.add(x)
    plan = s.schedule()
    assert plan.chunk_shape == (32, 16) and [c.seq for c in plan.chunks] == burst
    assert all(c.length == 12 and c.samples for c in plan.chunks)
    assert (32, 16) not in EngineConfig(max_slots=16).chunk_shapes
    assert (32, 16) not in EngineConfig(max_slots=32, chunk_lengths=(32, 512)).chunk_shapes  # chosen lengths stay


def test_decode_calls_are_cut_to_the_time_budget():
    """A multi-step call's tokens reach clients together and a new prompt waits for it: at the measured
    step time, a call runs at most decode_call_ms (at least one step); new sequences' first decode
    calls are single steps (a burst's later prompts are likely arriving)."""
    config = EngineConfig(max_slots=4, max_length=64, page_size=4, prefill_tokens=16, chunk_lengths=(4,),
                          decode_steps=8, decode_call_ms=100)
    s = Scheduler(HBMPageManager(64, 4), config)
    rows = [seq(4, max_tokens=40, first=1 + 10 * i) for i in range(3)]
    for x in rows:
        s.add(x)
    first, second, third = run(s, 3)
    assert first.chunks and second.num_steps == 1  # each row's second token: one step
    assert third.num_steps == 8  # nothing measured yet: the configured steps
    s.decode_budget.observe(3, 8, 8 * 0.030)  # 30 ms a step at 3 rows (kept for 4: a power of two)
    assert run(s)[0].num_steps == 3  # 100 ms // 30 ms
    s.decode_budget.observe(3, 3, 3 * 0.250)  # slower steps: one at a time
    assert run(s)[0].num_steps == 1
    assert s.decode_budget.step_seconds[4] == pytest.approx(0.7 * 0.030 + 0.3 * 0.250)
    with pytest.raises(ValueError, match="decode_call_ms"):
        EngineConfig(decode_call_ms=0)


def test_only_the_two_smallest_chunk_shapes_have_programs_without_decode_rows():
    """A lone prompt's step runs without decode rows; larger shapes pad them, which saves programs.
    prefill_first engines (vInference) never have decode rows beside a prompt."""
    config = EngineConfig(max_slots=32, max_length=2048)
    assert config.chunk_shapes == [(32, 16), (1, 32), (4, 32), (16, 32), (1, 512)]
    assert [config.mixed_rows(s) for s in config.chunk_shapes] == [[32], [0, 32], [0, 32], [32], [32]]
    assert config.page_windows == [16] and config.dynamic_window(16)
    first = config.replace(prefill_first=True)
    assert all(first.mixed_rows(s) == [0] for s in first.chunk_shapes)


# ---------------------------------------------------------------- priority scheduling
def test_priority_orders_the_queue_lower_values_first_then_arrival():
    s = make(slots=1, policy="priority")
    first = seq(3)
    s.add(first)
    run(s)  # `first` holds the only slot
    late_low, urgent, early_low, urgent_too = (seq(3, priority=5, first=10), seq(3, priority=-1, first=20),
                                               seq(3, priority=5, first=30), seq(3, priority=-1, first=40))
    for x in (late_low, urgent, early_low, urgent_too):
        s.add(x)
    assert list(s.waiting) == [urgent, urgent_too, late_low, early_low]


def test_fcfs_ignores_priority():
    s = make(slots=1)
    a, b = seq(3, first=10), seq(3, first=20)
    s.add(seq(3)), run(s)
    s.add(a), s.add(b)
    assert list(s.waiting) == [a, b]


def test_a_waiting_high_priority_sequence_preempts_a_low_priority_one():
    s = make(slots=2, policy="priority")
    low_old, low_new = seq(3, max_tokens=20, priority=3), seq(3, max_tokens=20, priority=3, first=10)
    s.add(low_old), s.add(low_new)
    run(s, 2)
    assert s.running == [low_old, low_new] and low_new.generated
    urgent = seq(3, max_tokens=2, priority=-5, first=20)
    s.add(urgent)
    plan = s.schedule()
    # the victim is the lowest-ranked running sequence (same priority: the later arrival)
    assert low_new.status is Status.WAITING and low_new.num_computed == 0 and s.num_preemptions == 1
    assert urgent.slot is not None and any(r.seq is urgent for r in plan.chunks)
    s.postprocess(plan, Out(plan))
    while not urgent.finished:
        run(s)
    assert low_new.status is Status.WAITING  # it waits until a slot frees; nothing of lower rank to take
    while s.has_work:
        run(s)
    # the preempted sequence was recomputed and kept what it had made
    assert low_old.generated == [7] * 20 and low_new.generated == [7] * 20 and urgent.generated == [7] * 2


def test_equal_or_lower_priority_never_preempts():
    s = make(slots=1, policy="priority")
    running = seq(3, max_tokens=20, priority=0)
    s.add(running), run(s)
    for priority in (0, 4):
        s.add(seq(3, priority=priority, first=10 + priority))
        run(s)
        assert s.running == [running] and s.num_preemptions == 0


def test_page_pressure_preempts_the_lowest_priority_not_the_newest():
    s = make(pages=5, page_size=4, slots=2, chunk_lengths=(8,), prefill_tokens=8, policy="priority")
    low, high = seq(8, max_tokens=12, priority=9), seq(8, max_tokens=12, first=30, priority=0)
    s.add(low), s.add(high)
    for _ in range(12):
        run(s)
        if s.num_preemptions:
            break
    assert s.num_preemptions == 1 and low.status is Status.WAITING and high.status is Status.RUNNING


def test_priority_without_the_priority_policy_is_refused():
    from mock_engine import MockEngine

    from vsurge.engine.validation import prepare_requests

    with pytest.raises(ValueError, match="--scheduling-policy priority") as info:
        prepare_requests(MockEngine(), [1, 2], SamplingParams(priority=1), ReturnChannel())
    assert info.value.param == "priority"


def _shared_preamble_run(wait_steps: int):
    """16 prompts with the same 24-token preamble (6 pages) and their own 3-token tail, all at once."""
    config = EngineConfig(max_slots=16, max_length=48, page_size=4, prefill_tokens=32, chunk_lengths=(4, 32),
                          prefix_wait_steps=wait_steps)
    s = Scheduler(HBMPageManager(256, 4), config)
    seqs = [seq(27, first=1) for _ in range(16)]
    for i, x in enumerate(seqs):
        x.tokens[24:] = [100 + 3 * i, 101 + 3 * i, 102 + 3 * i]
        s.add(x)
    computed = 0
    while s.has_work:
        plan = s.schedule()
        computed += sum(row.length for row in plan.chunks)
        s.postprocess(plan, Out(plan))
        s.pool.check()
    return s, computed


def test_prompts_wait_for_a_prefix_in_flight_instead_of_computing_it_again():
    s, computed = _shared_preamble_run(wait_steps=64)
    assert s.pool.prefix_hits == 15 * 24  # every later prompt found the whole preamble
    assert computed == 24 + 16 * 3  # the preamble once, then each prompt's tail
    assert s.num_prefix_waits > 0 and not s.pool._inflight
    eager, eager_computed = _shared_preamble_run(wait_steps=0)  # no waiting: the first step's prompts miss
    assert eager.pool.prefix_hits < 15 * 24 and eager_computed > computed


def test_prompts_with_a_cached_preamble_share_a_step_of_short_rows():
    """Waiting prompts whose preamble is cached need only their tails: the shape is chosen by those
    (112-token tails in rows of 32), not by their whole length (600 tokens: a full 512-token row each,
    one prompt per step: the shared-preamble load ran so before)."""
    config = EngineConfig(max_slots=8, max_length=1024, page_size=16)
    assert config.chunk_shapes == [(1, 32), (4, 32), (16, 32), (1, 512)]
    s = Scheduler(HBMPageManager(512, 16), config)
    first = seq(600)
    first.tokens[488:] = [5000 + i for i in range(112)]
    s.add(first)
    while s.has_work:  # computed and finished: its 30 preamble pages stay cached
        s.postprocess(plan := s.schedule(), Out(plan))
    tails = [seq(600) for _ in range(3)]
    for i, x in enumerate(tails):
        x.tokens[488:] = [6000 + 200 * i + j for j in range(112)]
        s.add(x)
    # 30 whole pages, and 8 tokens of the first prompt's page 30 (copied on write: a tail hit)
    assert s.pool.cached_tokens(tails[0].tokens) == 488 and s.pool.inflight_pages(tails[0].tokens) == 0
    plan = s.schedule()
    assert plan.chunk_shape == (16, 32)  # by whole lengths it was (1, 512): one prompt's 112 tokens
    assert [sum(r.length for r in plan.chunks if r.seq is x) for x in tails] == [112, 112, 112]
    assert all(x.num_computed == 488 for x in tails)  # the preamble came from the cache
    assert len(s.pool.take_copies()) == 3


def test_a_prefix_wait_is_bounded():
    s = make(pages=64, slots=4, prefill_tokens=32, chunk_lengths=(4,))
    s.config = s.config.replace(prefix_wait_steps=2)  # rows of 4: room for b beside a's 4 rows
    a, b = seq(13), seq(13)
    s.add(a)
    plan = s.schedule()  # a admitted, its first rows planned, never computed (no postprocess)
    assert a in plan.sequences and s.pool.inflight_pages(b.tokens) == 3
    s.add(b)
    assert b not in s.schedule().sequences and b not in s.schedule().sequences  # waits twice
    assert b in s.schedule().sequences and b.prefix_waits == 2  # then computes it itself


class CachedImages:
    """The engine's MediaEncoder as the scheduler sees it: which images are encoded already."""

    def __init__(self, keys=(), compiling=()):
        self.keys = set(keys)
        self.compiling = set(compiling)  # images whose vision program is not compiled yet
        self.whole_images = False

    def is_cached(self, key):
        return key in self.keys

    def ready(self, item):
        return item.key not in self.compiling


def image_seq(prompt_len: int, images: list[tuple[int, int, int]], first: int = 1) -> Sequence:
    """A prompt whose images (key, first position, embeddings) sit at those positions."""
    from vsurge.multimodal import MediaItem

    prompt = list(range(first, first + prompt_len))
    media = tuple(MediaItem(key, np.arange(at, at + n), np.zeros((1, 2, 2, 3), np.uint8)) for key, at, n in images)
    request = ActiveRequest(prompt, SamplingParams(max_tokens=2, temperature=0.0), 0, 2, [0], ReturnChannel(),
                            media=media)
    return Sequence.of(request, Letters())


def test_an_image_whose_program_compiles_waits_and_others_go_on():
    """An image of a size whose vision program is still compiling: its prompt stops before it (or
    waits whole when it begins there) while another prompt is prefilled; once compiled it goes on."""
    scheduler = make(pages=64, page_size=4, prefill_tokens=16, chunk_lengths=(4, 16))
    scheduler.media = CachedImages(compiling={1, 2})
    a = image_seq(12, [(1, 4, 4)], first=100)  # text first, then the image
    b = image_seq(12, [(2, 0, 4)], first=200)  # the image first
    c = image_seq(8, [], first=300)
    for seq in (a, b, c):
        scheduler.add(seq)
    plan = scheduler.schedule()
    spans = lambda seq: [(ch.start, ch.length) for ch in plan.chunks if ch.seq is seq]  # noqa: E731
    assert (spans(a), spans(b), spans(c)) == ([(0, 4)], [], [(0, 4), (4, 4)])
    scheduler.postprocess(plan, Out(plan))
    scheduler.media.compiling.clear()  # the programs are compiled
    plan = scheduler.schedule()
    assert spans(a)[0] == (4, 4) and spans(b)[0] == (0, 4)


def test_prompts_waiting_for_vision_programs_are_not_preempted_as_blocked():
    """Two admitted prompts that both begin with an image still compiling leave the step empty: that is
    not a page deadlock, so neither is preempted (it used to preempt and re-plan without end)."""
    scheduler = make(pages=64, page_size=4, prefill_tokens=16, chunk_lengths=(4, 16))
    scheduler.media = CachedImages(compiling={1, 2})
    a, b = image_seq(12, [(1, 0, 4)], first=100), image_seq(12, [(2, 0, 4)], first=200)
    scheduler.add(a)
    scheduler.add(b)
    for _ in range(3):
        assert scheduler.schedule().empty
    assert scheduler.num_preemptions == 0 and {a.status, b.status} == {Status.RUNNING}
    scheduler.media.compiling.clear()
    assert {ch.seq.request.prompt_ids[0] for ch in scheduler.schedule().chunks} == {100, 200}


def test_a_step_encodes_images_up_to_its_prompt_token_budget():
    """Prompt budget 16: a prompt's 8-token image goes, its next (10 tokens, 8 left) waits for the next
    step: the chunk stops before it though the row has room. A step's first image goes whatever its
    size, an image begun in an earlier step is not counted again, and one the engine has encoded
    already costs nothing."""
    scheduler = make(pages=64, page_size=4, prefill_tokens=16, chunk_lengths=(4, 16))
    scheduler.media = CachedImages()
    a = image_seq(20, [(1, 1, 8), (2, 9, 10)])
    scheduler.add(a)
    plan = scheduler.schedule()
    assert [(c.start, c.length) for c in plan.chunks] == [(0, 9)]
    scheduler.postprocess(plan, Out(plan))
    plan = scheduler.schedule()
    assert [(c.start, c.length) for c in plan.chunks][0][0] == 9
    big = make(pages=64, page_size=4, prefill_tokens=16, chunk_lengths=(4, 16))
    big.media = CachedImages({6})  # the second image is encoded already
    c = image_seq(30, [(5, 2, 20), (6, 24, 4)])  # a 20-token image alone passes the budget
    big.add(c)
    plan = big.schedule()
    assert [(ch.start, ch.length) for ch in plan.chunks] == [(0, 16)]
    big.postprocess(plan, Out(plan))
    plan = big.schedule()
    assert sum(ch.length for ch in plan.chunks) == 14


def test_a_model_whose_images_attend_both_ways_gets_each_image_in_one_step():
    """Gemma 3's image tokens see their whole image, so no step ends inside one: a 16-token step stops
    before an image at 10-17 rather than at 16, and the next step takes the image whole."""
    scheduler = make(pages=64, page_size=4, prefill_tokens=16, chunk_lengths=(4, 16))
    scheduler.media = CachedImages()
    scheduler.media.whole_images = True
    a = image_seq(20, [(1, 10, 8)])
    scheduler.add(a)
    plan = scheduler.schedule()
    assert sum(c.length for c in plan.chunks) == 10
    scheduler.postprocess(plan, Out(plan))
    plan = scheduler.schedule()
    assert [(c.start, c.start + c.length) for c in plan.chunks][0][0] == 10
    assert sum(c.length for c in plan.chunks) == 10  # 10-19: the image and the rest


def test_decode_row_ladders_follow_what_a_padded_row_costs():
    """Float weights on a CPU: 2, 4, 8, ...; the block kernel (padding rows cost it work): 1, 4, 16, ...; an
    accelerator (a step below ~100 rows costs its weights' bytes, each program a start-up compile): 8, 32, ..."""
    assert EngineConfig(max_slots=64).decode_rows == [2, 4, 8, 16, 32, 64]
    assert EngineConfig(max_slots=64, one_row_decode=True).decode_rows == [1, 4, 16, 64]
    assert EngineConfig(max_slots=64, coarse_rows=True).decode_rows == [8, 32, 64]
    assert EngineConfig(max_slots=128, coarse_rows=True).decode_rows == [8, 32, 128]
    assert EngineConfig(max_slots=4, coarse_rows=True).decode_rows == [4]
    assert EngineConfig(max_slots=64, coarse_rows=True, row_buckets=(2, 64)).decode_rows == [2, 64]


def test_the_engine_takes_the_coarse_ladder_on_an_accelerator(monkeypatch, tiny_checkpoints):
    import jax.numpy as jnp

    import vsurge
    from vsurge.hardware import devices

    model, processor = vsurge.load(tiny_checkpoints["llama"][0], dtype=jnp.float32, progress=False)
    config = EngineConfig(max_slots=64, max_length=64, page_size=16)
    assert vsurge.oEngine(model, processor, config=config).config.decode_rows[0] == 2
    monkeypatch.setattr(devices, "platform", lambda: "tpu")
    assert vsurge.oEngine(model, processor, config=config).config.decode_rows == [8, 32, 64]
