"""Disaggregated serving: prefill engines compute prompts, decode engines generate, a prefix moves between.

    vDriver(prefill_engines=[p0, p1], decode_engines=[d0, d1])

JetStream's orchestrator, on vsurge's scheduler. Every engine gets one role
(EngineConfig.role, scheduler.py):

  prefill thread   schedules prompt chunks only (prefix cache on this side: a
                   cached prompt skips them). A sequence whose prompt is
                   computed has its K/V pages copied out on the prefill mesh
                   (`engine.export_prefix`) and goes into that engine's bounded
                   transfer backlog (the seed's: 4); its slot and pages are free
                   at once. A full backlog holds further sequences in the
                   engine (back-pressure, nothing dropped).
  transfer thread  one per prefill engine: takes the oldest prefix, waits for the
                   decode engine with the most free slots that also has the
                   pages (a full decode side makes it wait, never drop), moves the
                   K/V onto that engine's mesh (`engine.receive_prefix`:
                   jax.device_put onto its prefix_destination()), and
                   queues it on that engine's arrivals.
  decode thread    attaches arrivals (slot and pages on arrival, K/V written
                   by `engine.insert_prefix`, sampling state loaded by the next
                   step) and runs decode steps only. A sequence it preempts for
                   pages goes back to a prefill engine to be recomputed.

A sequence's updates keep their order: the prefill thread emits the first token
before the hand-over, and only the decode thread emits after it. Cancelling a
request frees it wherever it is (prefill engine, backlog, arrivals, decode
engine). Each hand-over records `vsurge:kv_transfer_seconds`; the backlog and
arrivals are `vsurge:kv_transfer_queue_depth`.
"""

from __future__ import annotations

import collections
import logging
import threading
import time

from .sequence import Sequence

log = logging.getLogger(__name__)

TRANSFER_BACKLOG = 4  # prefixes waiting per prefill engine (JetStream's transfer backlog)


class Handover:
    """The transfer backlogs and threads of one disaggregated driver (engine/driver.py owns it)."""

    def __init__(self, driver, prefill: list, decode: list, backlog: int = TRANSFER_BACKLOG):
        if backlog < 1:
            raise ValueError(f"the transfer backlog must be at least 1, got {backlog}")
        self.driver = driver
        self.prefill, self.decode = prefill, decode  # Replica lists
        self.backlog_size = backlog
        self.backlogs = {r.index: collections.deque() for r in prefill}  # (sequence, prefix), oldest first
        self.changed = threading.Condition()  # a backlog, an arrival queue or a decode engine's room changed
        self.threads: list[threading.Thread] = []
        for r in decode:  # arrivals travel with their K/V, already on the decode engine's devices
            r.arrivals = collections.deque()
            r.pending_pages = 0  # pages the queued arrivals will take
        self.arrival_limit = {r.index: max(1, r.engine.max_concurrent_decodes // 3) for r in decode}

    # ------------------------------------------------------------ threads
    def start(self) -> None:
        for replica in self.prefill:
            thread = threading.Thread(target=self.driver._guarded_call, args=(self._transfer_loop, replica),
                                      name=f"vsurge-transfer-{replica.index}", daemon=True)
            self.threads.append(thread)
            thread.start()

    def wake_all(self) -> None:
        with self.changed:
            self.changed.notify_all()

    @property
    def depth(self) -> int:
        """Prefixes between a prefill engine and their decode engine's step."""
        return sum(map(len, self.backlogs.values())) + sum(len(r.arrivals) for r in self.decode)

    # ------------------------------------------------------------ prefill side (its engine thread)
    def hand_over(self, replica, state) -> None:
        """Move every sequence whose prompt is computed into the backlog while it has room."""
        backlog = self.backlogs[replica.index]
        for seq in replica.scheduler.ready_for_handover():
            if len(backlog) >= self.backlog_size:
                return  # back-pressure: the rest wait in the engine
            prefix = replica.engine.export_prefix(state, seq)  # read before the next step reuses the pages
            replica.scheduler.detach(seq)
            self.driver._move(seq, replica, None)
            with self.changed:
                backlog.append((seq, prefix))
                self.changed.notify_all()
            self._report_depth()

    # ------------------------------------------------------------ between the engines
    def _transfer_loop(self, replica) -> None:
        backlog = self.backlogs[replica.index]
        while self.driver._running:
            with self.changed:
                if not backlog:
                    self.changed.wait(0.1)
                    continue
                seq, prefix = backlog[0]
            if seq.request.is_cancelled:
                self._pop(backlog, replica)
                self.driver._finish_in_transit(seq)
                continue
            target = self._choose(seq)
            if target is None:  # every decode engine is full: wait for one to free a slot or pages
                with self.changed:
                    self.changed.wait(0.05)
                continue
            start = time.perf_counter()
            moved = target.engine.receive_prefix(prefix)  # jax.device_put onto the decode engine's mesh
            target.metrics.kv_transfer(time.perf_counter() - start)
            with self.changed:
                target.arrivals.append((seq, moved))
                target.pending_pages += target.scheduler.pages_to_attach(seq)
            self._pop(backlog, replica)
            target.wake.set()

    def _pop(self, backlog, replica) -> None:
        with self.changed:
            backlog.popleft()
            self.changed.notify_all()
        replica.wake.set()  # room for the prefill engine's next hand-over
        self._report_depth()

    def _choose(self, seq: Sequence):
        """The decode engine with the most free slots (after the arrivals it has queued) that has the
        pages for `seq` and room in its arrival queue; None when none has."""
        best, best_free = None, 0
        with self.changed:
            for r in self.decode:
                free = r.scheduler.free_slots - len(r.arrivals)
                pages = r.scheduler.pool.num_free_pages - r.pending_pages
                if (free > best_free and len(r.arrivals) < self.arrival_limit[r.index]
                        and pages >= r.scheduler.pages_to_attach(seq)):
                    best, best_free = r, free
        return best

    # ------------------------------------------------------------ decode side (its engine thread)
    def take_arrivals(self, replica, state):
        """Attach queued arrivals in order while slots and pages last; write their K/V."""
        while True:
            with self.changed:
                if not replica.arrivals:
                    break
                seq, prefix = replica.arrivals[0]
                need = replica.scheduler.pages_to_attach(seq)
                if not seq.request.is_cancelled and not replica.scheduler.attach(seq):
                    break  # waits for this engine to free a slot or pages
                replica.arrivals.popleft()
                replica.pending_pages -= need
                self.changed.notify_all()
            if seq.request.is_cancelled:
                self.driver._finish_in_transit(seq)
                continue
            state = replica.engine.insert_prefix(state, prefix, seq)
            self.driver._move(seq, None, replica)
        self._report_depth()
        return state

    def after_step(self, replica) -> None:
        """A decode step may have freed slots and pages (the transfer threads may go on), and may have
        preempted sequences: a prefill engine recomputes those."""
        evicted, replica.scheduler.evicted = replica.scheduler.evicted, []
        for seq in evicted:
            self.driver._move(seq, replica, None)
            self.driver._requeue(seq)
        self.wake_all()

    def _report_depth(self) -> None:
        self.driver.metrics.set_transfer_queue_depth(self.depth)


def check_disaggregated(prefill: list, decode: list) -> None:
    """Prefill and decode engines must agree on what a prefix is: its K/V pages and its limits."""
    for engine in prefill + decode:
        missing = [m for m in ("export_prefix", "receive_prefix", "insert_prefix") if not hasattr(engine, m)]
        if missing:
            raise TypeError(f"{type(engine).__name__} cannot serve disaggregated: it lacks {', '.join(missing)}")
    first = prefill[0]
    for engine in prefill[1:] + decode:
        for what, mine, theirs in (
                ("max_length", first.max_length, engine.max_length),
                ("vocab_size", first.vocab_size, engine.vocab_size),
                ("page_size", first.config.page_size, engine.config.page_size),
                ("KV layout", _kv_signature(first), _kv_signature(engine))):
            if mine != theirs:
                raise ValueError(f"prefill and decode engines must agree on {what}: {mine} vs {theirs}")


def _kv_signature(engine):
    """Per-layer KV shapes and dtype of an engine's pages (None for engines without a model)."""
    return getattr(engine, "kv_signature", None)
