"""Disaggregated serving across processes: prefill engines on process 0's devices, decode engines on
other processes' devices, one jax.distributed job.

    vsurge serve --prefill-devices 0-2 --decode-devices 3-5 --coordinator-address HOST:PORT \\
                 --num-processes 2 --process-id {0,1}          (the same command on each process)

Process 0 runs the server, the driver and every scheduler (engine/disaggregated.py),
and its prefill engines. A decode engine whose devices belong to another
process is a `RemoteDecodeEngine` here: the scheduler plans its steps as for a
local engine, and each program call (init, set_slot, decode, import) goes to
the owning process through the coordination service's key-value store (the
transport of scale/multihost.py), which runs it on its devices and sends back
the step's tokens. A prefix moves with `jax.device_put` from the prefill mesh
onto the decode engine's mesh: a cross-host transfer (JAX's transfer server,
`jax_cross_host_transfer_socket_address`), in which both processes take part,
so the owner is told first ("receive") and then writes the arrived pages
("import"). Both meshes must have the same shape (the shards map one to one). A
hybrid model's slot row of recurrent states follows its pages the same way
(replicated), and "import" writes it into the slot process 0 scheduled.

The owning process describes each of its decode engines in the store (its config,
pool and KV layout) before process 0 builds the RemoteDecodeEngine from it, and
reports ready once it has compiled; a lost process fails every request as in
scale/multihost.py.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import threading
from functools import partial

import jax
import numpy as np

from ..engine.batch import BatchBuilder
from ..engine.engine_config import EngineConfig
from ..engine.plan import HostStepOutput, StepPlan
from ..engine.program_kinds import DECODE, IMPORT, INIT, SET_SLOT, STATE_IMPORT, replay
from ..engine.scheduler import Scheduler
from ..engine.transfer import KVPrefix, PrefixPages
from ..kv.page_manager import HBMPageManager
from ..kv.slot_pages import SlotPages
from . import distributed
from .multihost import FollowerLostError, Leader, StepChannel, decode, encode, run_all_in_threads
from .multihost import follow_engine as follow_engine_calls  # the one follower loop

log = logging.getLogger(__name__)


def owner_of(mesh) -> int:
    """The one process whose devices make up `mesh`."""
    processes = {d.process_index for d in mesh.devices.flat}
    if len(processes) != 1:
        raise ValueError(f"an engine of a multi-process disaggregated run must sit on one process's devices; "
                         f"devices {[d.id for d in mesh.devices.flat]} belong to processes {sorted(processes)}")
    return processes.pop()


def store_name(vsurge_name: str) -> str:
    """The prefix of a served model's keys in the store (scale/multihost.py's too)."""
    return f"vsurge/{vsurge_name}"


def _prefix(name: str, index: int) -> str:
    return f"{name}/decode/{index}"


def describe(engine) -> str:
    """What process 0 needs to schedule this decode engine (published by its owner)."""
    return json.dumps({"config": dataclasses.asdict(engine.config), "num_pages": engine.pool.num_pages,
                       "paged": isinstance(engine.pool, HBMPageManager), "vocab_size": engine.vocab_size,
                       "eos_token_ids": engine.eos_token_ids, "model_name": engine.model_name,
                       "kv": engine.kv_signature, "devices": [d.id for d in engine.mesh.devices.flat],
                       "mesh_shape": list(engine.mesh.devices.shape), "mrope": engine.batches.mrope})


# ------------------------------------------------------------------ process 0
def _tuples(value):
    """Lists (JSON's) back into the tuples they were, nested."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


class _RemoteState:
    """The state of a remote engine lives on its owner; here it only stands for it."""


class RemoteOutput:
    def __init__(self, engine: "RemoteDecodeEngine", number: int):
        self.engine, self.number = engine, number

    def to_host(self, with_logprobs: bool) -> HostStepOutput:
        tokens, valid, *lp = self.engine._reply(self.number)
        return HostStepOutput(tokens, valid, tuple(lp) if lp else None, 0)


class RemoteDecodeEngine:
    """A decode engine on another process's devices, scheduled here (the driver's Engine contract)."""

    def __init__(self, name: str, index: int, processor, mesh, timeout_ms: int = 600_000):
        self.store_prefix = _prefix(name, index)
        self.owner = owner_of(mesh)
        info = json.loads(distributed.client().blocking_key_value_get(f"{self.store_prefix}/engine", timeout_ms))
        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in info["config"].items()}
        self.config = EngineConfig(**fields)
        if self.config.role != "decode":
            raise ValueError(f"remote engine {index} is not a decode engine (role {self.config.role!r})")
        if info.get("mrope"):  # its decode rows need each sequence's rotary offset, which is not sent yet
            raise ValueError(f"remote engine {index}: a model with M-RoPE (Qwen2.5-VL, Qwen3-VL) is not served "
                             "disaggregated across processes; run its prefill and decode engines in one process")
        self.pool = (HBMPageManager(info["num_pages"], self.config.page_size, enable_prefix_caching=False)
                     if info["paged"] else SlotPages(self.config.max_slots, self.config.max_length,
                                                     self.config.page_size))
        self.mesh, self.processor = mesh, processor
        self.vocab_size, self.eos_token_ids = info["vocab_size"], info["eos_token_ids"]
        self.model_name = info["model_name"]
        self.kv_signature = _tuples(info["kv"])  # (JSON made its tuples lists)
        if [d.id for d in mesh.devices.flat] != info["devices"]:
            raise ValueError(f"remote engine {index}: its owner runs it on devices {info['devices']}, this "
                             f"process expected {[d.id for d in mesh.devices.flat]} (same flags on every process)")
        self.batches = BatchBuilder(self.vocab_size, self.pool.num_pages, self.pool.page_size, self.config.max_slots,
                                    self.config.pages_per_sequence)
        self.channel = StepChannel(self.store_prefix)
        self._send_lock = threading.Lock()  # the decode thread and a transfer thread both send
        self._sent_steps = 0
        self._transfers = itertools.count()
        self._rng = np.random.default_rng(self.config.seed)
        self.lost = lambda: False  # set by the leader: a lost owner ends every wait
        self.on_call = "remote"  # the driver makes its state on the engine thread, with no warm-up here

    # -- limits the driver and the validator read
    max_length = property(lambda self: self.config.max_length)
    max_prompt_length = property(lambda self: self.config.prompt_limit)
    max_concurrent_decodes = property(lambda self: self.config.max_slots)
    manager = property(lambda self: self.pool)

    def new_seed(self) -> int:
        return int(self._rng.integers(0, 2**63 - 1))

    def new_scheduler(self) -> Scheduler:
        return Scheduler(self.pool, self.config)

    def compile(self, progress: bool = True) -> None:
        """The owner compiles; readiness waits for it (HostsLeader.compiled)."""

    # -- program calls, run by the owner
    def _send(self, key: tuple, leaves: list = ()) -> None:
        if self.lost():
            raise FollowerLostError(f"process {self.owner}, which runs decode engine {self.store_prefix}, was lost")
        with self._send_lock:
            self.channel.send(key, list(leaves))

    def init_state(self):
        self._send(INIT.key())
        return _RemoteState()

    def step(self, state, plan: StepPlan, masks: dict | None = None):
        if plan.chunks:
            raise RuntimeError("a decode engine was given prompt chunks")
        for seq in plan.sequences:
            if seq.needs_setup:
                self._send(SET_SLOT.key(), [np.int32(seq.slot), *jax.tree.leaves(self.batches.slot_arrays(seq))])
                seq.needs_setup = False
        c = self.config
        rows = next(n for n in c.decode_rows if n >= plan.decode_row_count)
        needed = self.batches.decode_window(plan)
        window = next(w for w in c.page_windows if w >= needed)
        batch = self.batches.decode(plan, rows, window, masks, needed if c.dynamic_window(window) else None)
        logprobs = any(s.request.params.logprobs is not None for s in plan.sequences)
        self._send((*DECODE.key(rows, window), logprobs), jax.tree.leaves(batch))
        self._sent_steps += 1
        return state, RemoteOutput(self, self._sent_steps - 1)

    def _reply(self, number: int) -> list:
        key = f"{self.store_prefix}/out/{number}"
        store = distributed.client()
        while True:
            try:
                data = store.blocking_key_value_get_bytes(key, 1000)
                break
            except Exception as exc:  # noqa: BLE001: a timed-out wait is retried unless the owner is gone
                if "DEADLINE_EXCEEDED" not in str(exc) or self.lost():
                    raise FollowerLostError(f"no reply from process {self.owner} for step {number}: {exc}") from exc
        store.key_value_delete(key)
        return decode(data)[1]

    # -- prefixes
    def prefix_shardings(self, pages: int):
        from ..kv.dense import DenseKVCache
        from ..hardware.sharding import named_sharding

        return named_sharding(self.mesh, DenseKVCache.K_AXES)

    def export_prefix(self, state, seq):
        raise RuntimeError("a remote decode engine does not prefill")

    def receive_prefix(self, prefix: KVPrefix) -> KVPrefix:
        """Tell the owner a prefix is coming, then send it: jax.device_put onto this engine's mesh."""
        from ..hardware.sharding import replicated

        tid = next(self._transfers)
        source = prefix.pages.k[0].sharding.mesh
        with_states = prefix.states is not None
        self._send(("receive", tid, prefix.bucket, tuple(source.devices.shape), with_states),
                   [np.asarray([d.id for d in source.devices.flat], np.int32)])
        dest = self.prefix_shardings(prefix.bucket)
        moved = jax.device_put(prefix.pages, jax.tree.map(lambda _: dest, prefix.pages))
        states = None
        if with_states:  # a hybrid's slot row of recurrent states, replicated as on the prefill mesh
            rep = replicated(self.mesh)
            states = jax.device_put(prefix.states, jax.tree.map(lambda _: rep, prefix.states))
        return KVPrefix(moved, prefix.num_pages, transfer_id=tid, states=states)

    def insert_prefix(self, state, prefix: KVPrefix, seq):
        ids = np.full(prefix.bucket, self.pool.num_pages, np.int32)
        ids[: prefix.num_pages] = seq.pages.pages[: prefix.num_pages]
        self._send((*IMPORT.key(prefix.bucket), prefix.transfer_id, seq.slot), [ids])
        return state


class HostsLeader(Leader):
    """On process 0: waits for the owners to compile, watches them, tells them to stop."""

    def __init__(self, driver, name: str, heartbeat_poll: float = 0.25, ready_timeout: float = 600.0):
        self.driver, self.name, self.poll, self.ready_timeout = driver, name, heartbeat_poll, ready_timeout
        self.followers = set(range(1, jax.process_count()))
        self.lost: set[int] = set()
        remote = [r.engine for r in driver.replicas if isinstance(r.engine, RemoteDecodeEngine)]
        self.channels = [e.channel for e in remote]
        for engine in remote:
            engine.lost = lambda: bool(self.lost)
        self._stopped = threading.Event()
        driver.listeners.append(self)
        self._watchdog = threading.Thread(target=self._watch, name="vsurge-multihost-watchdog", daemon=True)
        self._watchdog.start()


# ------------------------------------------------------------------ building the engines on every process
def disaggregated_engines(model, processor, make_engine, config: EngineConfig, prefill_devices, decode_devices,
                          prefill_tensor_parallel_size, tensor_parallel_size, name: str) -> tuple[list, list]:
    """(prefill engines, decode engines) of this process: on process 0 its prefill engines and every
    decode engine (remote ones as RemoteDecodeEngine); elsewhere the decode engines on its devices."""
    from ..hardware.sharding import replica_meshes
    from .replicas import group_mesh, replica_models

    pid = jax.process_index()
    prefill_meshes = replica_meshes(group_mesh(prefill_devices, prefill_tensor_parallel_size))
    decode_meshes = replica_meshes(group_mesh(decode_devices, tensor_parallel_size))
    if any(owner_of(m) != 0 for m in prefill_meshes):
        raise ValueError("in a multi-process run the prefill engines sit on process 0's devices (it schedules "
                         "and serves); give --prefill-devices among process 0's")
    if any(tuple(m.devices.shape) != tuple(prefill_meshes[0].devices.shape) for m in decode_meshes):
        raise ValueError("across processes, prefill and decode engines need the same tensor-parallel size (a "
                         "prefix's shards move one to one)")
    prefill = [make_engine(replica_models(model, mesh=m)[0], config.replace(role="prefill"))
               for m in prefill_meshes] if pid == 0 else []
    decode = []
    for i, mesh in enumerate(decode_meshes):
        if owner_of(mesh) == pid:
            engine = make_engine(replica_models(model, mesh=mesh)[0], config.replace(role="decode"))
            if pid != 0:
                distributed.client().key_value_set(f"{_prefix(name, i)}/engine", describe(engine))
                engine.remote_index = i
            decode.append(engine)
        elif pid == 0:
            decode.append(RemoteDecodeEngine(name, i, processor, mesh))
    return prefill, decode


def attach(surge) -> None:
    if jax.process_index() == 0:
        surge._multihost_leader = HostsLeader(surge.driver, store_name(surge.vsurge_name))


def local_mesh(prefill_devices, decode_devices, prefill_tensor_parallel_size=None, tensor_parallel_size=None):
    """The mesh this process loads the model onto: process 0 its prefill group, another process its
    (first) decode engine's devices."""
    from ..hardware.sharding import replica_meshes
    from .replicas import group_mesh

    if jax.process_index() == 0:
        return group_mesh(prefill_devices, prefill_tensor_parallel_size)
    mine = [m for m in replica_meshes(group_mesh(decode_devices, tensor_parallel_size))
            if owner_of(m) == jax.process_index()]
    if not mine:
        raise ValueError(f"process {jax.process_index()} has no decode engine on its devices: check --decode-devices")
    return mine[0]


# ------------------------------------------------------------------ the other processes
def follow_engine(engine, name: str) -> None:
    """Run process 0's calls for one local decode engine until it says stop (multihost.follow_engine,
    with the calls that answer or move prefixes)."""
    prefix = _prefix(name, engine.remote_index)
    store, received, replies = distributed.client(), {}, itertools.count()
    states_layout = _states_layout(engine) if engine.model.config.recurrent_layers else None  # traced once

    def decode_and_reply(state, key, leaves):  # key: ("decode", rows, window, logprobs)
        state, out = replay(engine, key[:3], state, leaves)
        h = out.to_host(bool(key[3]))
        store.key_value_set_bytes(f"{prefix}/out/{next(replies)}", encode(("out",), [h.tokens, h.valid,
                                                                                     *(h.logprobs or ())]))
        return state

    def receive(state, key, leaves):  # take part in process 0's jax.device_put of a prefix onto our devices
        _, tid, bucket, shape, with_states = key
        received[tid] = _receive(engine, bucket, shape, leaves[0], states_layout if with_states else None)
        return state

    def import_prefix(state, key, leaves):  # key: ("import", bucket, transfer id, the sequence's slot)
        _, bucket, tid, slot = key
        pages, states = received.pop(tid)
        state = engine._compiled[IMPORT.key(bucket)](state, pages, leaves[0])
        if states is not None:
            state = engine._compiled[STATE_IMPORT.key("states")](state, states, np.int32(slot))
        return state

    follow_engine_calls(engine, StepChannel(prefix),
                        {DECODE.name: decode_and_reply, "receive": receive, IMPORT.name: import_prefix})


def _states_layout(engine) -> list:
    """The shapes of one slot's row of every recurrent state part (what a hybrid's hand-over moves)."""
    from ..engine.state_rows import gather_states

    return jax.eval_shape(partial(gather_states, held="states"), jax.eval_shape(engine._empty_state), np.int32(0))


def _receive(engine, bucket: int, shape, device_ids, states_layout: list | None) -> tuple[PrefixPages, list | None]:
    """This process's side of process 0's two jax.device_put calls: the prefix's pages (split over KV
    heads) and, with `states_layout` (a hybrid model's), its slot's recurrent states (replicated)."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from ..hardware.sharding import replicated

    by_id = {d.id: d for d in jax.devices()}
    source = Mesh(np.asarray([by_id[int(i)] for i in device_ids], dtype=object).reshape(shape), ("data", "model"))

    def arrive(layout, src, dest):  # arrays with no local shard on the source mesh, put onto ours
        placeholder = jax.tree.map(lambda s: jax.make_array_from_single_device_arrays(s.shape, src, [],
                                                                                      dtype=s.dtype), layout)
        return jax.device_put(placeholder, jax.tree.map(lambda _: dest, placeholder))

    dest = engine.prefix_destination()
    pages = arrive(engine._prefix_spec(bucket), NamedSharding(source, dest.spec), dest)
    states = None
    if states_layout is not None:
        states = arrive(states_layout, NamedSharding(source, PartitionSpec()), replicated(engine.mesh))
    return pages, states


def follow(surge) -> None:
    """A process that owns decode engines: compile and warm them, report ready, run process 0's calls."""
    pid, store, name = jax.process_index(), distributed.client(), store_name(surge.vsurge_name)
    engines = [e for e in surge.driver.engines if hasattr(e, "remote_index")]
    try:
        for engine in engines:
            engine.compile()
            engine.warm_up(engine.init_state())  # first runs of its programs, on a state of its own
    except BaseException as exc:
        store.key_value_set(f"{name}/failed/{pid}", str(exc))
        raise
    store.key_value_set(f"{name}/ready/{pid}", "1")
    run_all_in_threads({f"vsurge-decode-{e.remote_index}": (lambda e=e: follow_engine(e, name)) for e in engines})
