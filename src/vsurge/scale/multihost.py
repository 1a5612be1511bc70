"""Multi-host serving: process 0 schedules, every process runs the same compiled step (SPMD).

Every process loads its shards of the model on one mesh over all processes'
devices and builds the same engines (`vSurge.create_*` on every process; they
compile the same programs). Then:

  leader (process 0)  runs the HTTP server, the drivers and their schedulers.
                      Each engine program call (init, set_slot, decode, mixed)
                      is first published, its bucket key and its host inputs
                      (the small numpy arrays engine/batch.py builds from the
                      plan), then run; XLA's collectives in the program span
                      every process's devices.
  followers           `follow(surge)`: receive each call and run the same
                      program on their own weights and state. What a follower
                      runs depends only on the leader's messages, so followers
                      never diverge.

Transport: the coordination service's key-value store (jax.distributed's own
runtime, which jax.experimental.multihost_utils builds on), one key per call.
Publishing never waits for the followers (the program's collectives keep
everyone in step). multihost_utils.broadcast_one_to_all would cost two more
cross-process programs per step that both sides block in: ~40 ms against ~2 ms
per 32-row decode step on loopback gloo (benchmarks/multihost_transport.py).

Liveness: a watchdog on the leader polls the coordination service's heartbeat
view. When a follower is lost, every live request fails with FollowerLostError
and readiness turns 503, even though the engine thread may wait forever in a
collective the dead follower will never join; restart every process to recover.
"""

from __future__ import annotations

import logging
import pickle
import threading
import time

import jax
import numpy as np

from ..engine.program_kinds import PROGRAMS, kind_of, replay
from ..engine.request import DriverNotReadyError
from . import distributed

log = logging.getLogger(__name__)

KEEP_MESSAGES = 256  # published calls kept in the store (followers lag by a step or two at most)
STOP = ("stop",)


class FollowerLostError(DriverNotReadyError):
    """A follower process stopped answering: its share of the model is gone."""


# ------------------------------------------------------------------ messages
def _pack(a):
    """Arrays of one repeated value (zeros, the all-allowed bitmask) travel as that value."""
    a = np.asarray(a)
    if a.size and (a == a.flat[0]).all():
        return ("fill", a.shape, a.dtype.str, a.flat[0].item())
    return a


def _unpack(p):
    if isinstance(p, tuple):
        _, shape, dtype, value = p
        return np.full(shape, value, np.dtype(dtype))
    return p


def encode(key: tuple, leaves: list) -> bytes:
    return pickle.dumps((key, [_pack(x) for x in leaves]), protocol=5)


def decode(data: bytes) -> tuple[tuple, list]:
    key, packed = pickle.loads(data)  # written by this job's leader only
    return tuple(key), [_unpack(p) for p in packed]


class StepChannel:
    """Numbered messages from the leader to the followers of one engine replica."""

    def __init__(self, name: str):
        self.prefix = f"{name}/steps"
        self.sent = self.received = 0

    def send(self, key: tuple, leaves: list = ()) -> None:
        store = distributed.client()
        store.key_value_set_bytes(f"{self.prefix}/{self.sent}", encode(key, list(leaves)))
        if self.sent >= KEEP_MESSAGES:
            store.key_value_delete(f"{self.prefix}/{self.sent - KEEP_MESSAGES}")
        self.sent += 1

    def receive(self) -> tuple[tuple, list]:
        """The next message; waits as long as the leader is alive (its death ends the store)."""
        name = f"{self.prefix}/{self.received}"
        while True:
            try:
                data = distributed.client().blocking_key_value_get_bytes(name, 1000)
                break
            except Exception as exc:  # noqa: BLE001: a timed-out wait is retried, anything else ends the loop
                if "DEADLINE_EXCEEDED" not in str(exc):
                    raise
        self.received += 1
        return decode(data)


def engine_fingerprint(engine) -> str:
    """What must match across processes for their programs to match."""
    mesh = engine.mesh
    return repr((type(engine).__name__, engine.config, engine.model.config, engine.pool.num_pages,
                 None if mesh is None else (dict(mesh.shape), [d.id for d in mesh.devices.flat])))


def _check_spans_every_process(engine) -> None:
    mesh = engine.mesh
    processes = set() if mesh is None else {d.process_index for d in mesh.devices.flat}
    if processes != set(range(jax.process_count())):
        raise ValueError(f"multi-process serving runs each engine on a mesh over every process's devices "
                         f"(this one spans processes {sorted(processes)}): load the model with "
                         f"tensor_parallel_size / data_parallel_size covering all {jax.device_count()} devices")


# ------------------------------------------------------------------ leader
class Leader:
    """Attached to a driver on process 0: publishes every program call, watches the followers."""

    def __init__(self, driver, name: str, heartbeat_poll: float = 0.25, ready_timeout: float = 600.0):
        self.driver = driver
        self.name = name  # key prefix of this model's messages in the store
        self.poll = heartbeat_poll
        self.ready_timeout = ready_timeout
        self.followers = set(range(1, jax.process_count()))
        self.lost: set[int] = set()
        self.channels = []
        self._stopped = threading.Event()
        for replica in driver.replicas:
            _check_spans_every_process(replica.engine)
            channel = StepChannel(f"{name}/{replica.index}")
            self.channels.append(channel)
            replica.engine.on_call = self._publisher(channel, replica.engine)
            replica.engine.pool.tail_hits = False  # its page copies are not among the calls followers replay
            distributed.client().key_value_set(f"{name}/{replica.index}/engine", engine_fingerprint(replica.engine))
        driver.listeners.append(self)
        self._watchdog = threading.Thread(target=self._watch, name="vsurge-multihost-watchdog", daemon=True)
        self._watchdog.start()

    def _publisher(self, channel: StepChannel, engine):
        def call(key, program, *args):
            if self.lost:
                raise FollowerLostError(self._lost_message())
            kind = kind_of(key)
            if not kind.replayed:
                raise RuntimeError(f"{kind.name} programs run on one process: multi-host engines do not run them")
            n = kind.device_args
            if n == 3 and (args[0] is not engine.graphstate or args[1] is not engine.graphother):
                raise ValueError("multi-host engines run their own weights: graphstate/graphother cannot be replaced")
            channel.send(key, jax.tree.leaves(args[n:]))
            try:  # wait here (the driver reads the output next anyway) to name a lost follower
                return jax.block_until_ready(program(*args))
            except Exception as exc:
                if self._confirm_lost():
                    raise FollowerLostError(self._lost_message()) from exc
                raise
        return call

    def _confirm_lost(self) -> bool:
        """After a failed collective: give the coordination service one heartbeat timeout to see
        whether a follower is gone (gloo reports a dead peer at once, the service a bit later)."""
        deadline = time.monotonic() + distributed.heartbeat_timeout + 2
        while time.monotonic() < deadline and not self.lost:
            try:
                missing = self.followers - distributed.live_processes()
            except Exception:  # noqa: BLE001
                missing = set(self.followers)
            if missing:
                self.lost = missing
            else:
                time.sleep(self.poll)
        return bool(self.lost)

    # -- driver listener
    def compiled(self, driver) -> None:
        """Wait until every follower has built and compiled the same engines (readiness waits too)."""
        store, deadline = distributed.client(), time.monotonic() + self.ready_timeout
        waiting = set(self.followers)
        while waiting:
            for pid in sorted(waiting):
                failure = _try_get(store, f"{self.name}/failed/{pid}")
                if failure is not None:
                    raise RuntimeError(f"follower process {pid} failed to start: {failure}")
                if _try_get(store, f"{self.name}/ready/{pid}") is not None:
                    waiting.discard(pid)
            if self.lost:
                raise FollowerLostError(self._lost_message())
            if time.monotonic() > deadline:
                raise TimeoutError(f"followers {sorted(waiting)} did not compile within {self.ready_timeout:.0f}s")
            time.sleep(0.1)
        log.info("every follower compiled its engines")

    def stopped(self, driver, error) -> None:
        """The driver stopped or failed: tell the followers to leave their loops."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        for channel in self.channels:
            try:
                channel.send(STOP)
            except Exception:  # noqa: BLE001: the store may be gone with a lost follower
                log.warning("could not tell the followers to stop")

    # -- liveness
    def _lost_message(self) -> str:
        lost = ", ".join(str(p) for p in sorted(self.lost))
        return (f"multi-host follower process {lost} was lost (no heartbeat to the coordination service): "
                f"its share of the model is gone; restart every process of the job")

    def _watch(self) -> None:
        while not self._stopped.is_set():
            try:
                missing = self.followers - distributed.live_processes()
            except Exception as exc:  # noqa: BLE001: the service itself failing counts as losing everyone
                log.warning("liveness check failed: %s", exc)
                missing = set(self.followers)
            if missing:
                self.lost = missing
                error = FollowerLostError(self._lost_message())
                log.error("%s", error)
                self.driver.fail(error)
                return
            self._stopped.wait(self.poll)


def _try_get(store, key: str) -> str | None:
    try:
        return store.key_value_try_get(key)
    except Exception:  # noqa: BLE001: NOT_FOUND
        return None


# ------------------------------------------------------------------ followers
def _refuse(key, program, *args):
    raise RuntimeError("this process follows the multi-host leader: call vsurge.scale.multihost.follow(surge) "
                       "instead of running the engine itself")


def attach(surge) -> None:
    """Called by vSurge.create_* when several processes run: the leader publishes every program
    call; on followers the engines refuse to run on their own (they run `follow`)."""
    if jax.process_index() == 0:
        surge._multihost_leader = Leader(surge.driver, _store_name(surge))
    else:
        for engine in surge.driver.engines:
            _check_spans_every_process(engine)
            engine.on_call = _refuse


def _store_name(surge) -> str:
    """Every model served gets its own keys in the store (the same name on every process)."""
    return f"vsurge/{surge.vsurge_name}"


def follow_engine(engine, channel: StepChannel, handlers: dict | None = None) -> None:
    """Run the leader's calls for one engine until it says stop: each program call replayed on this
    process's share (engine/program_kinds.py). handlers: call kind -> handler(state, key, leaves) ->
    state, for the calls that do more than run a program (remote.py: replies, prefix moves)."""
    handlers = handlers or {}
    state = None
    while True:
        key, leaves = channel.receive()
        if key == STOP:
            return
        handler = handlers.get(key[0])
        if handler is not None:
            state = handler(state, key, leaves)
        elif key[0] in PROGRAMS:
            state, _ = replay(engine, key, state, leaves)
        else:
            raise RuntimeError(f"unknown call {key!r} from the leader")


def follow(surge) -> None:
    """A follower's whole life: check its engines match the leader's, compile them, then run the
    leader's calls until the leader stops (or dies: the store then fails and this raises)."""
    pid, store, name = jax.process_index(), distributed.client(), _store_name(surge)
    try:
        for i, engine in enumerate(surge.driver.engines):
            theirs = store.blocking_key_value_get(f"{name}/{i}/engine", 600_000)
            mine = engine_fingerprint(engine)
            if mine != theirs:
                raise RuntimeError(f"engine {i} differs from the leader's (same model, flags and devices are "
                                   f"needed on every process):\n leader: {theirs}\n here:   {mine}")
        surge.driver.compile()
    except BaseException as exc:
        store.key_value_set(f"{name}/failed/{pid}", str(exc))
        raise
    store.key_value_set(f"{name}/ready/{pid}", "1")
    run_all_in_threads({f"vsurge-follower-{i}": (lambda e=e, i=i: follow_engine(e, StepChannel(f"{name}/{i}")))
                        for i, e in enumerate(surge.driver.engines)})


def run_all_in_threads(jobs: dict) -> None:
    """Runs each job (thread name -> callable) on its own thread until all end; re-raises the first error."""
    errors: list[BaseException] = []

    def run(job):
        try:
            job()
        except BaseException as exc:  # noqa: BLE001: re-raised below, after every thread has ended
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(job,), name=name, daemon=True) for name, job in jobs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
