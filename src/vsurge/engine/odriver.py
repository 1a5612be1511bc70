"""oDriver: the host side of the paged engine, as two threads.

    submit_request -> inbox
    schedule thread:   new requests -> Scheduler (waiting queue); drops cancelled and finished
                       sequences (freeing their pages); plans a step (decodes + one prefill
                       chunk), loads admitted sequences' sampling state, runs oEngine.forward,
                       appends the sampled tokens and hands them to the detokenizer
    detokenize thread: tokens -> text, stop strings -> ReturnSamples; sequences it ends
                       (stop strings) go back to the schedule thread to be freed

The same failure rules as vDriver: a thread that raises fails every live request
and marks the driver not ready.
"""

from __future__ import annotations

import queue
import threading
import time

import jax

from ..metrics import EngineMetrics
from ..paged.scheduler import Scheduler, Sequence
from .driver_base import _STOP, ThreadedDriver, _offer
from .oengine import oEngine
from .outputs import SequenceOutput
from .request import ActiveRequest


class oDriver(ThreadedDriver):  # noqa: N801 (the seed's name)
    def __init__(self, engine: oEngine, detokenizing_blocks: int = 8, max_queue: int | None = None,
                 metrics: EngineMetrics | None = None, token_budget: int | None = None):
        self.engine = engine
        self.scheduler = Scheduler(engine.manager, engine.max_concurrent_decodes, engine.max_prefill_length,
                                   token_budget)
        self._inbox: queue.Queue = queue.Queue()
        self._ended: queue.Queue = queue.Queue()  # request ids the detokenizer finished
        self._detok: queue.Queue = queue.Queue(maxsize=detokenizing_blocks)
        self._wake = threading.Event()
        self._sequences: dict[int, Sequence] = {}  # the schedule thread's view
        self._outputs: dict[int, SequenceOutput] = {}  # the detokenizer's view
        self._reported = {"preemptions": 0, "queries": 0, "hits": 0}
        super().__init__(engine, max_queue, metrics)

    # ------------------------------------------------------------ public
    @property
    def processor(self):
        return self.engine.processor

    @property
    def primary_engine(self):
        return self.engine

    @property
    def driver_name(self) -> str:
        return f"oDriver({self.metrics.model_name})"

    def get_total_concurrent_requests(self) -> int:
        return self.engine.max_concurrent_decodes

    @property
    def num_used_slots(self) -> int:
        return len(self.scheduler.running)

    def compile(self) -> None:
        self.engine.compile()

    def start(self) -> None:
        if self._running:
            return
        self._start_threads([("schedule", self._schedule_loop, ()), ("detokenize", self._detokenize_loop, ())])

    def _enqueue(self, request: ActiveRequest) -> None:
        self._inbox.put(request)
        self._wake.set()

    def _wake_threads(self) -> None:
        self._wake.set()
        _offer(self._detok, _STOP)

    # ------------------------------------------------------------ schedule thread
    def _schedule_loop(self) -> None:
        engine, scheduler = self.engine, self.scheduler
        state = engine.init_decode_state()
        while self._running:
            self._take_new()
            self._drop_ended()
            if not scheduler.has_work:
                self._wake.wait()  # idle until a request or a stop arrives
                self._wake.clear()
                continue
            plan = scheduler.schedule()
            self._report_pool()
            if plan.empty:  # everything admitted waits for pages held by nobody runnable: cannot last
                self._wake.wait(0.01)
                self._wake.clear()
                continue
            for seq in scheduler.running:
                if seq.needs_slot_setup:
                    state = engine.set_slot(state, seq)
                    seq.needs_slot_setup = False
            start = time.perf_counter()
            state, out = engine.forward(None, None, state, plan)
            rows = {seq: i for i, seq in enumerate(plan.decode)}
            if plan.prefill_samples:
                rows[plan.prefill] = out.prefill_row
            want = any(s.request.params.logprobs is not None for s in rows)
            tokens, lp = jax.device_get((out.tokens, (out.logprob, out.top_ids, out.top_logprobs) if want else None))
            self.metrics.stage("step", time.perf_counter() - start)
            sampled = {seq: int(tokens[i]) for seq, i in rows.items()}
            scheduler.step_done(plan, sampled)
            emitted, closed = [], []
            for seq, token in sampled.items():
                i = rows[seq]
                emitted.append((seq.request, token, (lp[0][i], lp[1][i], lp[2][i]) if lp else None))
                if token in seq.request.eos_token_ids or len(seq.generated) >= seq.request.max_new_tokens:
                    self._forget(seq)
                    closed.append(seq.seq_id)
            if emitted:
                self._put(self._detok, ("tokens", emitted, closed))

    def _take_new(self) -> None:
        while True:
            try:
                request = self._inbox.get_nowait()
            except queue.Empty:
                return
            seq = Sequence(request, list(request.prompt_ids), len(request.prompt_ids))
            self._sequences[request.request_id] = seq
            self.scheduler.add(seq)

    def _drop_ended(self) -> None:
        closed = []
        while True:
            try:
                seq = self._sequences.get(self._ended.get_nowait())
            except queue.Empty:
                break
            if seq is not None:
                self._forget(seq)
                closed.append(seq.seq_id)
        if closed:
            self._put(self._detok, ("tokens", [], closed))
        for seq in [s for s in self._sequences.values() if s.request.is_cancelled]:
            self._forget(seq)
            self._put(self._detok, ("abort", seq.request, [seq.seq_id]))

    def _forget(self, seq: Sequence) -> None:
        self.scheduler.finish(seq)
        self._sequences.pop(seq.seq_id, None)

    def _report_pool(self) -> None:
        manager, scheduler, seen = self.engine.manager, self.scheduler, self._reported
        self.metrics.set_kv_usage(manager.usage)
        self.metrics.set_running(len(scheduler.running))
        self.metrics.set_waiting(len(scheduler.waiting))
        if scheduler.num_preemptions > seen["preemptions"]:
            self.metrics.preempted(scheduler.num_preemptions - seen["preemptions"])
        if manager.prefix_queries > seen["queries"]:
            self.metrics.prefix_cache(manager.prefix_queries - seen["queries"], manager.prefix_hits - seen["hits"])
        seen.update(preemptions=scheduler.num_preemptions, queries=manager.prefix_queries, hits=manager.prefix_hits)

    # ------------------------------------------------------------ detokenize thread
    def _detokenize_loop(self) -> None:
        """Outputs stay registered until the schedule thread says it sends nothing more for them
        ("closed" ids ride behind their last tokens), so a late token never reopens a sequence."""
        processor = self.processor
        while self._running:
            item = self._detok.get()
            if item is _STOP:
                return
            kind, payload, closed = item
            if kind == "abort":
                out = self._outputs.get(payload.request_id) or SequenceOutput(payload, processor)
                if not out.finished:
                    self._emit(out, out.abort("abort"))
            else:
                for request, token, logprobs in payload:
                    self._add_token(request, token, logprobs, processor)
            for request_id in closed:
                self._outputs.pop(request_id, None)

    def _add_token(self, request, token, logprobs, processor) -> None:
        out = self._outputs.get(request.request_id)
        if out is None:
            out = self._outputs[request.request_id] = SequenceOutput(request, processor)
            self.metrics.first_token(time.perf_counter() - request.submitted_at)
        if out.finished:
            return
        previous = out.last_token_at
        sample = out.add([token], [logprobs] if logprobs is not None else None)
        if previous is not None:
            self.metrics.inter_token(out.last_token_at - previous)
        self._emit(out, sample)

    def _emit(self, out: SequenceOutput, sample) -> None:
        if not out.finished:
            if sample is not None:
                out.request.channel.put(sample)
            return
        self._settle(out)
        if sample is not None:
            out.request.channel.put(sample)
        self._ended.put(out.request.request_id)
        self._wake.set()
