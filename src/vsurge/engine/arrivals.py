"""New requests on their way to a first token: an idle engine gathers a burst before its first
step, and each request's trace notes when the first step computing its prompt began (the
`vsurge:request_*_time_seconds` histograms: queue, step wait, prefill)."""

from __future__ import annotations

import time
from typing import Callable

from .plan import StepPlan

BURST_QUIET_S = 0.003  # a burst ends when no request arrived for this long
BURST_MAX_S = 0.025  # and is gathered for at most this long


def gather_burst(inbox, keep_going: Callable[[], bool]) -> None:
    """Woken from idle by requests: a burst (a client's 32 at once) reaches the inbox over several
    ms, as the server parses and tokenizes each; wait while it keeps growing, so that one step
    prefills them all instead of a step for the first few with the rest waiting behind it (32
    12-token prompts on 2 cores: TTFT p50 0.65-0.93 s by how the burst split, 0.65-0.80 s
    gathered). A lone request waits BURST_QUIET_S."""
    size, deadline = inbox.qsize(), time.monotonic() + BURST_MAX_S
    while size and keep_going() and time.monotonic() < deadline:
        time.sleep(BURST_QUIET_S)
        grown, size = inbox.qsize() > size, inbox.qsize()
        if not grown:
            return


def prefill_started(plan: StepPlan, at: float) -> None:
    """Trace: the first step computing a prompt began on the device at `at` (dispatched after the
    step before it finished, or when that one finished)."""
    for chunk in plan.chunks:
        if chunk.seq.prefill_started_at is None:
            chunk.seq.prefill_started_at = at
