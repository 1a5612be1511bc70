"""Drivers: one scheduling thread per engine replica, each looping

    plan = scheduler.schedule()
    state, out = engine.step(state, plan)
    for seq, update in scheduler.postprocess(plan, out.to_host()): send update

overlapped (EngineConfig.async_scheduling): step N+1 is dispatched before step N's tokens are read.
A request whose own host work fails (its set-up, its slot's sampling state, its rows of a step, its
mask, its text: engine/faults.py) fails alone, with a RequestFailed naming it; the others go on.
`submit_request` hands a request to the least loaded replica (several replicas
of one model are data parallelism; each records its metrics under its own
`replica` label). The thread blocks on its inbox when idle
(no spinning). A thread that raises otherwise (the device step itself) fails every live request with its error
and marks the driver not ready; so does a step that outlasts `EngineConfig.step_timeout` (a watchdog
thread sees it: the stuck thread cannot be interrupted, its callers are not left waiting on it);
callers never hang. `stop()` drains, then
fails what is left. vDriver (dense engines) and oDriver (a paged engine), in seed/drivers.py,
are this driver with the seed's constructor signatures.

With separate prefill and decode engines (`vDriver(prefill_engines=[...],
decode_engines=[...])`) the driver is disaggregated: requests go to the prefill
engines, whose threads hand finished prefixes to the decode engines' threads
through bounded transfer backlogs (engine/disaggregated.py).
"""

from __future__ import annotations

import logging
import queue
import threading
import time

from .metrics import EngineMetrics
from .arrivals import gather_burst, prefill_started
from .disaggregated import TRANSFER_BACKLOG, Handover, check_disaggregated
from .encode import EncodeRequest
from .faults import RequestFailed, SequenceFault
from .request import ActiveRequest, DriverNotReadyError, QueueFullError
from .plan import StepPlan
from .sequence import Sequence, Status

log = logging.getLogger(__name__)


class Replica:
    """One engine with its scheduler, inbox and the live sequences its thread owns."""

    def __init__(self, engine, index: int):
        self.engine = engine
        self.index = index
        self.role = engine.config.role  # "both" (interleaved), "prefill" or "decode"
        self.scheduler = engine.new_scheduler()
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.wake = threading.Event()
        self.live: dict[int, Sequence] = {}  # request id -> sequence (the thread's view)
        self.encodes: list[EncodeRequest] = []  # prompts waiting for an embed/score pass (the thread's view)
        self.load = 0  # requests routed here and not finished (the router's view)
        self.metrics: EngineMetrics | None = None  # this replica's series (set by the driver)
        # counters already recorded
        self.reported = {"preemptions": 0, "queries": 0, "hits": 0, "drafts": 0, "accepted": 0}
        self.state = None  # the engine state, when made (and warmed) before the thread starts
        self.last_step_at = 0.0  # when the thread last read a step's results
        self.busy_since: float | None = None  # monotonic time the thread entered a step call or a read
        self.overlapped_steps = 0  # steps dispatched before the previous one's tokens were read


class Driver:
    def __init__(self, engines, max_queue: int | None = None, metrics: EngineMetrics | None = None,
                 decode_engines=None, transfer_backlog: int = TRANSFER_BACKLOG):
        """engines: the replicas (each prefills and decodes in its own steps); with `decode_engines`,
        `engines` are prefill engines and the driver is disaggregated (prefill -> transfer -> decode)."""
        engines, decode_engines = list(engines), list(decode_engines or [])
        if not engines:
            raise ValueError("a driver needs at least one engine")
        if decode_engines:
            check_disaggregated(engines, decode_engines)
            for engine, role in [(e, "prefill") for e in engines] + [(e, "decode") for e in decode_engines]:
                if engine.config.role != role:  # the role decides the programs and the scheduling
                    engine.config = engine.config.replace(role=role)
        self.replicas = [Replica(engine, i) for i, engine in enumerate(engines + decode_engines)]
        self.max_queue = max_queue
        self.metrics = metrics or EngineMetrics(engines[0].model_name)
        for replica in self.replicas:
            replica.metrics = self.metrics.for_replica(replica.index, replica.role)
        self.handover = (Handover(self, [r for r in self.replicas if r.role == "prefill"],
                                  [r for r in self.replicas if r.role == "decode"], transfer_backlog)
                         if decode_engines else None)
        self._lock = threading.Lock()
        self._live: set[ActiveRequest] = set()
        self._uncounted: set = set()  # live encodes that are not queue entries (all but the first of a call)
        self._threads: list[threading.Thread] = []
        self._running = self._accepting = False
        self._stopped = threading.Event()
        self._error: BaseException | None = None
        # notified after compile() (listener.compiled(driver)) and when the driver stops or fails
        # (listener.stopped(driver, error)): the multi-host leader (scale/multihost.py)
        self.listeners: list = []

    # ------------------------------------------------------------ public
    @property
    def primary_engine(self):
        return self.replicas[0].engine

    @property
    def disaggregated(self) -> bool:
        return self.handover is not None

    @property
    def prefill_engines(self) -> list:
        return [r.engine for r in self.replicas if r.role != "decode"]

    @property
    def decode_engines(self) -> list:
        return [r.engine for r in self.replicas if r.role != "prefill"]

    @property
    def engines(self) -> list:
        return [r.engine for r in self.replicas]

    @property
    def processor(self):
        return self.primary_engine.processor

    @property
    def driver_name(self) -> str:
        return f"{type(self).__name__}({self.metrics.model_name})"

    @property
    def ready(self) -> bool:
        return self._running and self._accepting and self._error is None

    @property
    def error(self) -> BaseException | None:
        return self._error

    def get_total_concurrent_requests(self) -> int:
        return sum(e.max_concurrent_decodes for e in self.decode_engines)

    @property
    def num_live(self) -> int:
        """Requests submitted and not yet finished (waiting or running)."""
        with self._lock:
            return len(self._live)

    @property
    def num_used_slots(self) -> int:
        return sum(len(r.scheduler.running) for r in self.replicas if r.role != "prefill")

    @property
    def num_waiting(self) -> int:
        with self._lock:
            return max(0, len(self._live) - self.num_used_slots)

    def compile(self) -> None:
        """Compile every program; in one process, then make each replica's state (zeroing the KV
        pages: ~1 s for 3 GB) and warm it, so that readiness (which follows) means the first
        request runs as fast as the later ones. The states come after compiling, once the
        compiler's freed memory is back with the OS, so the two never add up to the process's peak.
        Multi-host engines publish every program call to their followers, so their states are made
        by the engine threads."""
        local = all(getattr(r.engine, "on_call", None) is None and hasattr(r.engine, "warm_up")
                    for r in self.replicas)
        from . import memory_ledger

        memory_ledger.mark("compile_begin", trim=True)
        for engine in dict.fromkeys(self.engines):
            engine.compile()
        memory_ledger.mark("compiled", trim=True)  # (the trim also keeps the compiler's freed heap out of the peak)
        init = [threading.Thread(target=self._make_state, args=(r,), daemon=True)
                for r in self.replicas if local and r.state is None]
        for thread in init:  # one thread per replica: each zeroes its own pages
            thread.start()
        for thread in init:
            thread.join()  # (a warm-up of a role runs what that role runs: engine/transfer.py)
        for replica in self.replicas if local else ():
            if replica.state is None:
                raise RuntimeError(f"replica {replica.index}: the engine state could not be made (see the log)")
            replica.state = replica.engine.warm_up(replica.state)
            s = replica.scheduler  # the warm-up's prefix-cache lookups are not the users'
            replica.reported.update(preemptions=s.num_preemptions, queries=s.pool.prefix_queries,
                                    hits=s.pool.prefix_hits, **_tier_totals(s))
            self._prefetch(replica)  # (its disk reads are reported as the tiers' traffic)
        memory_ledger.mark("ready")
        for listener in self.listeners:
            listener.compiled(self)

    @staticmethod
    def _prefetch(replica: Replica) -> None:
        """A restarted server's most recent prefixes from its disk tier into the device pool, so
        readiness means they hit as warm ones do."""
        prefetch = getattr(replica.engine, "prefetch_prefixes", None)
        if prefetch is None:
            return
        start = time.perf_counter()
        replica.state, pages = prefetch(replica.state)
        if pages:
            log.info("KV disk cache: %d pages (%.0f MiB) read into replica %d's pool in %.2f s", pages,
                     pages * replica.engine.page_nbytes / 2**20, replica.index, time.perf_counter() - start)

    @staticmethod
    def _make_state(replica: Replica) -> None:
        try:
            replica.state = replica.engine.init_state()
        except Exception:  # noqa: BLE001: compile() reports it
            log.exception("replica %d: init_state failed", replica.index)

    def start(self) -> None:
        if self._running:
            return
        self._running = self._accepting = True
        self._stopped = threading.Event()  # wakes the watchdog at a stop (it would sleep out its period)
        self._error = None
        for replica in self.replicas:
            thread = threading.Thread(target=self._guarded_call, args=(self._loop, replica),
                                      name=f"vsurge-engine-{replica.index}", daemon=True)
            self._threads.append(thread)
            thread.start()
        if any(r.engine.config.step_timeout for r in self.replicas):
            watchdog = threading.Thread(target=self._watch_steps, name="vsurge-step-watchdog", daemon=True)
            self._threads.append(watchdog)
            watchdog.start()
        if self.handover is not None:
            self.handover.start()
            self._threads += self.handover.threads

    def submit_encode(self, request: EncodeRequest) -> None:
        """Queue a prompt for an embed/score pass (engine/encode.py): batched with every other one
        waiting on its replica, between generation steps."""
        self.submit_encodes([request])

    def submit_encodes(self, requests: list[EncodeRequest]) -> None:
        """Queue one call's prompts (an embeddings request's 2,048 inputs) as ONE entry of the queue."""
        if not all(isinstance(r, EncodeRequest) for r in requests):
            raise TypeError("submit_encodes takes EncodeRequests")
        self._enqueue(*requests)

    def submit_request(self, request: ActiveRequest) -> None:
        if not isinstance(request, ActiveRequest):
            raise TypeError(f"submit_request takes an ActiveRequest, got {type(request).__name__}")
        self._enqueue(request)

    def _enqueue(self, *requests) -> None:
        """Several requests are one entry of the queue (the max_queue check counts the first)."""
        with self._lock:  # the same lock as _shutdown: a request is either failed by it or never taken
            if not self.ready:
                raise DriverNotReadyError(f"the driver is not ready: {self._error or 'not running'}")
            waiting = len(self._live) - len(self._uncounted) - self.num_used_slots
            if self.max_queue is not None and waiting >= self.max_queue:
                raise QueueFullError(f"the request queue is full ({waiting} waiting, limit {self.max_queue}); "
                                     f"retry later")
            placed = []
            for request in requests:
                self._live.add(request)
                replica = self._least_loaded_prefill()
                replica.load += 1
                replica.metrics.set_waiting(len(replica.scheduler.waiting) + replica.inbox.qsize() + 1)
                placed.append(replica)
            self._uncounted.update(requests[1:])
        for request, replica in zip(requests, placed):
            replica.inbox.put(request)
            replica.wake.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop accepting work, let in-flight requests finish (up to `timeout` s), then stop the
        threads; whatever is still unfinished is failed, never silently dropped."""
        self._accepting = False
        deadline = time.monotonic() + timeout
        while self._live and self._error is None and time.monotonic() < deadline:
            time.sleep(0.02)
        self._shutdown(DriverNotReadyError("the driver stopped before this request finished"))
        for engine in self.engines:  # an XLA compile still running at interpreter exit aborts the process
            deferred = getattr(engine, "deferred", None)
            if deferred is not None:
                deferred.stop()

    def _least_loaded_prefill(self) -> Replica:
        return min((r for r in self.replicas if r.role != "decode"), key=lambda r: (r.load, r.index))

    # ------------------------------------------------------------ the engine threads
    def _guarded_call(self, loop, replica: Replica) -> None:
        try:
            loop(replica)
        except BaseException as exc:  # noqa: BLE001: any failure must reach the callers
            log.exception("%s thread of replica %d failed", type(self).__name__, replica.index)
            self._error = RuntimeError(f"{type(self).__name__} engine thread {replica.index} failed: {exc!r}")
            self._shutdown(self._error)

    def _loop(self, replica: Replica) -> None:
        engine, scheduler = replica.engine, replica.scheduler
        state, replica.state = (replica.state if replica.state is not None else engine.init_state()), None
        # the overlapped loop: step N+1 is planned and dispatched before step N's tokens are read (JAX
        # dispatches asynchronously; N+1 is fed N's tokens on the device), so reading, detokenizing and
        # streaming N's tokens and planning N+2 run while N+1 computes
        inflight = None  # (plan, output, dispatched at) of the step whose tokens are not read yet
        while self._running:
            self._take_new(replica)
            self._drop_cancelled(replica)
            if replica.encodes:
                self._encode(replica)
            if replica.role == "prefill":
                self.handover.hand_over(replica, state)
            elif replica.role == "decode":
                state = self.handover.take_arrivals(replica, state)
            if not scheduler.has_work and inflight is None:
                if not replica.encodes:
                    self._report(replica)  # (the last step's counters, before going idle)
                    replica.wake.wait()  # idle until a request, a prefix, room in the backlog or a stop arrives
                    replica.wake.clear()
                    gather_burst(replica.inbox, lambda: self._running)
                continue
            plan = None
            try:  # a request whose own host work fails ends alone; the plan is made again without it
                if inflight is None or scheduler.can_plan_ahead(inflight[0]):
                    plan = scheduler.schedule(ahead=inflight is not None)
                if plan is None:  # the next plan needs the tokens in flight (or a preemption): read them first
                    self._finish_step(replica, *inflight)
                    inflight = None
                    state = self._sync_tiers(engine, state)
                    continue
                if plan.empty:  # admitted prompts wait for pages: cannot last (the scheduler preempts)
                    replica.wake.wait(0.01)
                    replica.wake.clear()
                    continue
                replica.busy_since = time.monotonic()
                state, out = engine.step(state, plan, scheduler.masks(plan))
            except SequenceFault as fault:
                log.warning("replica %d: %s; that request fails, the others go on", replica.index, fault)
                self._fail_sequence(replica, fault.seq, fault.failure())
                continue
            finally:
                replica.busy_since = None
            scheduler.advance(plan)
            dispatched = time.perf_counter()
            if inflight is not None:
                replica.overlapped_steps += 1
                self._finish_step(replica, *inflight)
            prefill_started(plan, max(dispatched, replica.last_step_at))  # (after the step in flight)
            inflight = (plan, out, dispatched)
            if replica.role != "both" or not getattr(engine, "overlaps_steps", False):
                self._finish_step(replica, *inflight)
                inflight = None
                state = self._sync_tiers(engine, state)
        replica.state = state  # a restart goes on with it (and tests can see where its arrays live)

    @staticmethod
    def _sync_tiers(engine, state):
        """Pages the last step committed go to the prefix cache's host/disk tiers now (a step also
        syncs before it runs; this covers the step before an idle wait or a stop)."""
        return engine.sync_tiers(state) if getattr(engine, "tiers", None) is not None else state

    def _finish_step(self, replica: Replica, plan: StepPlan, out, dispatched: float) -> None:
        """Read a step's tokens (waiting for the device), account them and send the updates."""
        replica.busy_since = time.monotonic()
        host = out.to_host(any(s.request.params.logprobs is not None for s in plan.sequences))
        replica.busy_since = None
        done = time.perf_counter()
        took = done - max(dispatched, replica.last_step_at)  # the step's time: from its dispatch, or the step before's end
        replica.metrics.stage("step" if plan.chunks else "decode", took)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("step: %d decode rows x %d steps, prompt rows %s of shape %s, %.1f ms since dispatch "
                      "(%.1f ms after the step before)", len(plan.decode), plan.num_steps,
                      [c.length for c in plan.chunks], plan.chunk_shape, (done - dispatched) * 1e3, took * 1e3)
        if not plan.chunks and not plan.drafts and plan.decode:
            replica.scheduler.decode_budget.observe(len(plan.decode), plan.num_steps, took)
        replica.last_step_at = done
        replica.metrics.engine_step()
        updates = replica.scheduler.postprocess(plan, host)
        self._report(replica)  # a client that has its last token sees counters that include it
        for seq, sample in updates:
            self._emit(replica, seq, sample)
        if replica.role == "decode":
            self.handover.after_step(replica)

    def _take_new(self, replica: Replica) -> None:
        while True:
            try:
                item = replica.inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, EncodeRequest):
                replica.encodes.append(item)
                continue
            if isinstance(item, Sequence):  # preempted by a decode engine: recompute it
                replica.live[item.seq_id] = item
                replica.scheduler.requeue(item)
                continue
            try:
                seq = Sequence.of(item, replica.engine.processor, replica.engine.vocab_size)
            except Exception as exc:  # noqa: BLE001: this request's set-up failed (faults.py): it fails alone
                log.warning("replica %d: request %d failed while being prepared: %r", replica.index,
                            item.request_id, exc)
                self._settle(replica, item)
                item.channel.put(RequestFailed(item.request_id, "being prepared", exc))
                continue
            replica.live[item.request_id] = seq
            replica.scheduler.add(seq)

    def _encode(self, replica: Replica) -> None:
        """One embed/score call over the waiting prompts; a failure fails those requests only."""
        live = [r for r in replica.encodes if not r.is_cancelled]
        for request in replica.encodes:
            if request.is_cancelled:
                self._settle(replica, request)
        replica.encodes = live
        if not live:
            return
        start = time.perf_counter()
        try:
            results = replica.engine.encode_step(live)
        except Exception as exc:  # noqa: BLE001: reported to the requests it concerned
            log.exception("encode step failed")
            results = [(r, RuntimeError(f"the encode pass failed: {exc!r}")) for r in live if r.kind == live[0].kind]
        replica.metrics.stage("encode", time.perf_counter() - start)
        served = {id(r) for r, _ in results}
        replica.encodes = [r for r in live if id(r) not in served]
        for request, result in results:
            self._settle(replica, request)
            request.channel.put(result)

    def _settle(self, replica: Replica, request) -> None:
        with self._lock:
            self._live.discard(request)
            self._uncounted.discard(request)
            replica.load -= 1

    # ------------------------------------------------------------ sequences between engines (disaggregated)
    def _move(self, seq: Sequence, source: Replica | None, target: Replica | None) -> None:
        """`seq` leaves `source`'s thread and/or joins `target`'s (None: in transit)."""
        with self._lock:
            if source is not None:
                source.live.pop(seq.seq_id, None)
                source.load -= 1
            if target is not None:
                target.live[seq.seq_id] = seq
                target.load += 1

    def _requeue(self, seq: Sequence) -> None:
        with self._lock:
            replica = self._least_loaded_prefill()
            replica.load += 1
        replica.inbox.put(seq)
        replica.wake.set()

    def _finish_in_transit(self, seq: Sequence) -> None:
        """A request cancelled between a prefill and a decode engine: its last update, and its books."""
        seq.status = Status.FINISHED
        sample = seq.output.abort("abort")
        with self._lock:
            self._live.discard(seq.request)
        self.metrics.request_finished(seq.output.finish_reason, len(seq.request.prompt_ids),
                                      len(seq.output.token_ids), time.perf_counter() - seq.request.submitted_at)
        seq.request.channel.put(sample)

    def _drop_cancelled(self, replica: Replica) -> None:
        for seq in [s for s in replica.live.values() if s.request.is_cancelled]:
            self._emit(replica, seq, replica.scheduler.abort(seq))

    def _fail_sequence(self, replica: Replica, seq: Sequence, error: BaseException) -> None:
        """`seq` failed alone (faults.py): its slot and pages are freed and its caller gets `error`."""
        replica.scheduler.drop(seq)
        self._emit(replica, seq, error)

    def _emit(self, replica: Replica, seq: Sequence, sample) -> None:
        """Send one update of `seq` (a ReturnSample, or the exception it failed with: its last)."""
        out, metrics = seq.output, replica.metrics
        if isinstance(sample, BaseException):
            replica.live.pop(seq.seq_id, None)
            self._settle(replica, seq.request)
            metrics.request_failed()
            self._update_gauges()
            seq.request.channel.put(sample)
            return
        if sample.token_ids:
            if len(out.token_ids) == len(sample.token_ids):
                now = time.perf_counter()
                metrics.first_token(now - seq.request.submitted_at)
                if seq.admitted_at is not None:
                    metrics.first_token_trace(seq.request.submitted_at, seq.admitted_at,
                                              seq.prefill_started_at or seq.admitted_at, now)
            if out.previous_update_at is not None:  # a burst of k tokens after a gap: k gaps of gap/k
                count = len(sample.token_ids) - (len(out.token_ids) == len(sample.token_ids))
                if count > 0:
                    metrics.inter_token((out.last_token_at - out.previous_update_at) / count, count)
        if out.finished:  # settle the books before the caller sees the last sample
            replica.live.pop(seq.seq_id, None)
            with self._lock:
                self._live.discard(seq.request)
                replica.load -= 1
            metrics.request_finished(out.finish_reason, len(seq.request.prompt_ids), len(out.token_ids),
                                     time.perf_counter() - seq.request.submitted_at)
            self._update_gauges()
        seq.request.channel.put(sample)

    def _update_gauges(self) -> None:
        for r in self.replicas:
            s = r.scheduler
            r.metrics.set_kv_usage(s.pool.usage)
            # a prefill engine's running sequences are still being prefilled: they wait for tokens
            r.metrics.set_running(0 if r.role == "prefill" else len(s.running))
            r.metrics.set_waiting(len(s.waiting) + r.inbox.qsize() + (len(s.running) if r.role == "prefill" else 0))

    def _report(self, replica: Replica) -> None:
        """Pool and queue gauges, and the replica's counters as deltas since its last report."""
        self._update_gauges()
        s, seen = replica.scheduler, replica.reported
        totals = {"preemptions": s.num_preemptions, "queries": s.pool.prefix_queries, "hits": s.pool.prefix_hits,
                  "drafts": s.num_draft_tokens, "accepted": s.num_accepted_tokens}
        if totals["preemptions"] > seen["preemptions"]:
            replica.metrics.preempted(totals["preemptions"] - seen["preemptions"])
        if totals["drafts"] > seen["drafts"]:
            replica.metrics.speculated(totals["drafts"] - seen["drafts"], totals["accepted"] - seen["accepted"])
        if totals["queries"] > seen["queries"]:
            replica.metrics.prefix_cache(totals["queries"] - seen["queries"], totals["hits"] - seen["hits"])
        media = getattr(replica.engine, "media", None)
        if media is not None:  # a vision-language model's encoder (engine/image_encoder.py)
            totals.update(images=media.encoded, image_hits=media.hits)
            if media.encoded + media.hits > seen.get("images", 0) + seen.get("image_hits", 0):
                replica.metrics.images(media.encoded - seen.get("images", 0), media.hits - seen.get("image_hits", 0))
        tiers = _tier_totals(s)
        moved = {name: n - seen.get(name, 0) for name, n in tiers.items() if n > seen.get(name, 0)}
        if moved:
            replica.metrics.kv_tiers(moved, getattr(replica.engine, "page_nbytes", 0))
        seen.update(totals, **tiers)

    # ------------------------------------------------------------ failure and stop
    def _watch_steps(self) -> None:
        """Fail the driver when a replica's thread has been inside one step call or one read of a
        step's tokens for longer than its engine's step_timeout."""
        limits = {r.index: r.engine.config.step_timeout for r in self.replicas}
        period = min(1.0, max(0.05, min(t for t in limits.values() if t) / 4))
        stopped = self._stopped
        while not stopped.wait(period):
            for replica in self.replicas:
                since, limit = replica.busy_since, limits[replica.index]
                if since is None or not limit or time.monotonic() - since <= limit:
                    continue
                log.error("replica %d: a step has not finished in %.0f s; failing its requests", replica.index, limit)
                self.fail(RuntimeError(
                    f"engine replica {replica.index} is stuck: a step has not finished in {limit:g} s "
                    f"(--step-timeout); every request in flight fails and the server is no longer ready"))
                return

    def fail(self, error: BaseException) -> None:
        """Fail every live request with `error` and stay not ready (e.g. a multi-host follower
        was lost while an engine thread waits in a collective that will never complete)."""
        if self._error is None:
            self._error = error
        self._shutdown(error)

    def _shutdown(self, error: BaseException) -> None:
        with self._lock:
            self._running = self._accepting = False
            self._stopped.set()
            live, self._live, self._uncounted = list(self._live), set(), set()
        for request in live:
            request.channel.put(error)
        for replica in self.replicas:
            replica.wake.set()
        if self.handover is not None:
            self.handover.wake_all()
        current = threading.current_thread()
        for thread in self._threads:
            if thread is not current:
                thread.join(timeout=5)
        self._threads = [t for t in self._threads if t.is_alive() and t is not current]
        for listener in self.listeners:  # after the engine threads' last steps
            listener.stopped(self, error)


def _tier_totals(scheduler) -> dict[str, int]:
    """The pool's tier counters (kv/page_manager.py tier_counts) and the scheduler's swap-ins."""
    counts = dict(scheduler.pool.tier_counts()) if hasattr(scheduler.pool, "tier_counts") else {}
    counts["swap_ins"] = getattr(scheduler, "num_swap_ins", 0)
    return counts


__all__ = ["Driver", "Replica", "StepPlan"]
