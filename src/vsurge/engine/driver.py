"""vDriver: the host side of continuous batching, as threads joined by bounded queues.

    submit_request -> prefill queue (FIFO)
    prefill thread(s):   prompt -> engine.prefill_request -> Prefix
    transfer thread:     Prefix -> the backlog of a decode engine (skipped in interleaved mode)
    decode thread(s):    frees + inserts into free slots, then engine.decode; the step's tokens
                         go to the detokenizer WITHOUT waiting for them (the host copy runs
                         while the device computes the next step)
    detokenize thread(s): host copy of tokens -> text, stop checks -> ReturnSamples; finished
                         slots go back to the decode thread to be freed

Slot activations and token batches travel in ONE queue to the detokenizer, so a
slot never receives tokens before it is registered, and tokens still in flight
for a freed slot are dropped. Idle threads block on their queues (no spinning).
A thread that raises fails every live request with its error and marks the
driver not ready; callers never hang.
"""

from __future__ import annotations

import heapq
import logging
import queue
import threading
import time

import jax
import numpy as np

from ..metrics import EngineMetrics
from .driver_base import _STOP, ThreadedDriver, _offer
from .outputs import SequenceOutput
from .request import ActiveRequest

log = logging.getLogger(__name__)


class _DecodeLane:
    """One decode engine with its slots, backlog and detokenizer queue."""

    def __init__(self, engine, index: int, detokenizing_blocks: int):
        self.engine = engine
        self.index = index
        self.backlog: queue.Queue = queue.Queue(maxsize=max(1, engine.max_concurrent_decodes // 3))
        self.releases: queue.Queue = queue.Queue()  # slots the detokenizer finished
        self.detok: queue.Queue = queue.Queue(maxsize=detokenizing_blocks)
        self.free_slots = list(range(engine.max_concurrent_decodes))  # a min-heap: lowest slot first
        # Results the decode thread may run ahead of the detokenizer: one computing, one being
        # copied. Deeper run-ahead only queues steps for slots that may already be finished.
        self.inflight = threading.Semaphore(2)
        self.active: dict[int, ActiveRequest] = {}  # the decode thread's view of busy slots
        self.outputs: dict[int, SequenceOutput] = {}  # the detokenizer's view
        self.wake = threading.Event()


class vDriver(ThreadedDriver):  # noqa: N801 (the seed's name)
    def __init__(self, prefill_engines=None, decode_engines=None, interleaved_mode: bool = False,
                 detokenizing_blocks: int = 8, max_queue: int | None = None, metrics: EngineMetrics | None = None):
        prefill_engines = _as_list(prefill_engines)
        decode_engines = _as_list(decode_engines)
        if not prefill_engines and not decode_engines:
            raise ValueError("vDriver needs at least one engine")
        self._prefill_engines = prefill_engines or decode_engines
        self._decode_engines = decode_engines or prefill_engines
        self._interleaved = interleaved_mode
        self._prefill_queue: queue.Queue = queue.Queue()
        self._transfer_queue: queue.Queue = queue.Queue(maxsize=4)
        self._lanes = [_DecodeLane(e, i, detokenizing_blocks) for i, e in enumerate(self._decode_engines)]
        self._next_lane = 0
        super().__init__(self._decode_engines[0], max_queue, metrics)

    # ------------------------------------------------------------ public
    @property
    def processor(self):
        return self._decode_engines[0].processor

    @property
    def primary_engine(self):
        return self._decode_engines[0]

    @property
    def driver_name(self) -> str:
        return f"vDriver({self.metrics.model_name})"

    def get_total_concurrent_requests(self) -> int:
        return sum(e.max_concurrent_decodes for e in self._decode_engines)

    @property
    def num_used_slots(self) -> int:
        return sum(len(lane.active) for lane in self._lanes)

    def compile(self) -> None:
        for engine in dict.fromkeys(self._prefill_engines + self._decode_engines):
            engine.compile()

    def start(self) -> None:
        if self._running:
            return
        targets = [(f"prefill-{i}", self._prefill_loop, (e,)) for i, e in enumerate(self._prefill_engines)]
        if not self._interleaved:
            targets.append(("transfer", self._transfer_loop, ()))
        for lane in self._lanes:
            targets.append((f"decode-{lane.index}", self._decode_loop, (lane,)))
            targets.append((f"detokenize-{lane.index}", self._detokenize_loop, (lane,)))
        self._start_threads(targets)

    def _enqueue(self, request: ActiveRequest) -> None:
        self._prefill_queue.put(request)

    def _wake_threads(self) -> None:
        for _ in self._prefill_engines:
            self._prefill_queue.put(_STOP)
        _offer(self._transfer_queue, _STOP)
        for lane in self._lanes:
            lane.wake.set()
            _offer(lane.detok, _STOP)

    # ------------------------------------------------------------ threads
    def _lane_for_next(self) -> _DecodeLane:
        lane = min(self._lanes, key=lambda ln: (ln.backlog.qsize() - len(ln.free_slots), ln.index))
        return lane

    def _to_backlog(self, request, prefix) -> None:
        lane = self._lane_for_next()
        if self._put(lane.backlog, (request, prefix)):
            lane.wake.set()

    def _prefill_loop(self, engine) -> None:
        while self._running:
            request = self._prefill_queue.get()
            if request is _STOP:
                return
            if request.is_cancelled:
                self._finish_unslotted(request, "abort")
                continue
            prefix = engine.prefill_request(request)
            if self._interleaved:
                self._to_backlog(request, prefix)
            else:
                self._put(self._transfer_queue, (request, prefix))

    def _transfer_loop(self) -> None:
        while self._running:
            item = self._transfer_queue.get()
            if item is _STOP:
                return
            self._to_backlog(*item)  # same device: nothing to copy

    def _decode_loop(self, lane: _DecodeLane) -> None:
        engine = lane.engine
        state = engine.init_decode_state()
        while self._running:
            while not lane.releases.empty():
                slot = lane.releases.get_nowait()
                engine.free_resource(slot)
                lane.active.pop(slot, None)
                heapq.heappush(lane.free_slots, slot)
            while lane.free_slots and not lane.backlog.empty():
                request, prefix = lane.backlog.get_nowait()
                if request.is_cancelled:
                    self._finish_unslotted(request, "abort")
                    continue
                slot = heapq.heappop(lane.free_slots)
                state = engine.insert(prefix, state, slot)
                engine.set_slot_position(slot, len(request.prompt_ids))
                lane.active[slot] = request
                self._put(lane.detok, ("activate", slot, request, prefix.first, getattr(prefix, "logprobs", None)))
            if not lane.active:
                if lane.backlog.empty() and lane.releases.empty():
                    lane.wake.wait()  # idle: blocked until a prefix, a release or stop arrives
                lane.wake.clear()
                continue
            if not lane.inflight.acquire(timeout=0.2):
                continue  # re-check releases and the running flag while the detokenizer catches up
            state, result = engine.decode(None, None, state)
            for array in (result.tokens, result.valid):
                if hasattr(array, "copy_to_host_async"):
                    array.copy_to_host_async()  # the detokenizer reads it while the next step runs
            self._put(lane.detok, ("result", result))

    def _detokenize_loop(self, lane: _DecodeLane) -> None:
        processor = self.processor
        while self._running:
            item = lane.detok.get()
            if item is _STOP:
                return
            if item[0] == "activate":
                _, slot, request, first, first_logprobs = item
                out = lane.outputs[slot] = SequenceOutput(request, processor)
                self._update_gauges()
                self.metrics.first_token(time.perf_counter() - request.submitted_at)
                logprobs = None
                if request.params.logprobs is not None and first_logprobs is not None:
                    chosen, ids, values = jax.device_get(first_logprobs)
                    logprobs = [(chosen[0], ids[0], values[0])]
                self._emit(lane, slot, out, out.add([int(np.asarray(first)[0])], logprobs))
                continue
            result = item[1]
            tokens, valid = jax.device_get((result.tokens, result.valid))
            want = any(out.request.params.logprobs is not None for out in lane.outputs.values())
            lp = jax.device_get((result.logprob, result.top_ids, result.top_logprobs)) if want else None
            lane.inflight.release()
            for slot, out in list(lane.outputs.items()):
                if out.request.is_cancelled:
                    self._emit(lane, slot, out, out.abort("abort"))
                elif valid[slot]:
                    previous = out.last_token_at
                    sample = out.add([int(tokens[slot])], [(lp[0][slot], lp[1][slot], lp[2][slot])] if lp else None)
                    if previous is not None:
                        self.metrics.inter_token(out.last_token_at - previous)
                    self._emit(lane, slot, out, sample)

    def _emit(self, lane: _DecodeLane, slot: int, out: SequenceOutput, sample) -> None:
        if not out.finished:
            if sample is not None:
                out.request.channel.put(sample)
            return
        # finished: settle the books before the caller sees the last sample
        lane.outputs.pop(slot, None)
        self._settle(out)
        self._update_gauges()
        if sample is not None:
            out.request.channel.put(sample)
        lane.releases.put(slot)
        lane.wake.set()

    def _update_gauges(self) -> None:
        running = sum(len(lane.outputs) for lane in self._lanes)
        self.metrics.set_running(running)
        self.metrics.set_waiting(max(0, len(self._live) - running))


def _as_list(engines) -> list:
    if engines is None:
        return []
    return list(engines) if isinstance(engines, (list, tuple)) else [engines]


