"""EngineCore: compiled programs over buckets, and `step(state, plan)`.

vEngine (dense: a fixed run of pages per slot) and oEngine (paged: pages on
demand, prefix caching, preemption) are this class with different page pools.
Every program is compiled by `compile()` (a progress bar; the persistent
compilation cache and the program store make restarts fast), so no step waits for a compile: on an
accelerator some step programs compile in the background after it (engine/deferred_programs.py), and
steps use only what is compiled.
The engine runs where the model's weights are: on their mesh (hardware/sharding.py),
every program gets explicit shardings (KV cache split over KV heads, host
inputs and outputs replicated) and XLA partitions it; otherwise on the default
device.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from concurrent.futures import Future
from functools import partial
from typing import Any

import jax
import numpy as np
from flax import nnx

from ..lora import serving as lora_serving
from ..hardware.sharding import mesh_of, replicated, row_shardings, state_shardings
from ..tokenizer.compat import eos_token_ids, pad_token_id
from . import compile_counts, compile_mode, deferred_programs, encode, programs
from ..models.parts.vision_lm import accepts_images
from .batch import BatchBuilder
from .faults import blame
from .image_encoder import MediaEncoder, tile_buckets
from .engine_config import EngineConfig
from .programs import EngineState, StepOutput
from .plan import StepPlan
from .program_kinds import DECODE, INIT, MIXED, PROGRAMS, SET_SLOT, VISION, _abstract, kind_of
from .scheduler import Scheduler
from .transfer import PrefixTransferAPI

log = logging.getLogger(__name__)


def multiplies_in_blocks(model) -> bool:
    """The model's matrices go through the CPU block kernel (ops/quantized.py), whose work grows
    with every row it is given, padding rows too."""
    from .. import kernels
    from ..hardware.devices import platform

    return bool(model.block_formats()) and platform() == "cpu" and kernels.available()


def on_accelerator() -> bool:
    from ..hardware.devices import platform

    return platform() != "cpu"


class EngineCore(PrefixTransferAPI):
    """Owns the model's split state, the compiled programs and the page pool. Its config's `role`
    decides which programs it runs: both kinds of step, or (disaggregated serving) prompt steps and
    prefix exports, or decode steps and prefix imports (engine/transfer.py)."""

    def __init__(self, model, processor, config: EngineConfig, pool):
        self.model = model.for_context(config.max_length)  # a config may depend on the context (LongRoPE)
        self._processor = processor
        config = config.for_model(self.model.config)
        if not config.row_buckets and multiplies_in_blocks(self.model):
            config = config.replace(one_row_decode=True)
        elif not config.row_buckets and on_accelerator():
            config = config.replace(coarse_rows=True)
        self.config = config
        self.pool = pool
        self.adapters = lora_serving.enable(self.model, config)  # LoRA slots (None: no adapters)
        self.graphdef, self.graphstate, self.graphother = nnx.split(self.model, nnx.Param, ...)
        self.mesh = mesh_of(self.model)  # None: the default device
        self.input_partition_spec = None  # PartitionSpec whose first entry splits the host inputs' rows
        self.media = MediaEncoder(self, config.image_cache_mb << 20) if accepts_images(model) else None
        self.batches = BatchBuilder(model.config.vocab_size, pool.num_pages, pool.page_size, config.max_slots,
                                    config.pages_per_sequence, config.draft_state_rows, self.adapters is not None,
                                    self.media, model.config.hidden_size * getattr(model.config, "feature_levels", 1),
                                    mrope=bool(getattr(model.config, "mrope_section", None)))
        self._rng = np.random.default_rng(config.seed)
        self._compiled: dict[Any, Any] = {}
        self._compile_lock = threading.Lock()
        self._building: dict[Any, Future] = {}  # key -> the program being built (callers wait for it)
        self._background = None  # one thread compiling what `program_ready` asked for (made on first use)
        self._background_failed: set = set()  # keys whose background build raised: built (and raised) inline
        self.background_compiles: list = []  # keys compiled on that thread, in order
        # step programs compiled after start-up (engine/deferred_programs.py: an accelerator's default)
        self.deferred = deferred_programs.DeferredCompiles(self)
        self.compile_seconds = 0.0
        self.compile_summary: str | None = None  # the last compile() of start-up: programs, phases, cache
        self._store = False  # the ProgramStore (or None), made on the first build
        # on_call(key, program, *args) runs every program call when set: the multi-host leader
        # publishes the call to the followers first (scale/multihost.py)
        self.on_call = None
        # copies between the pool and its host/disk tiers (engine/tier_mover.py); None without tiers
        self.tiers = None
        if getattr(pool, "host", None) is not None:
            from .tier_mover import TierMover

            self.tiers = TierMover(self)

    def new_scheduler(self, pool=None) -> Scheduler:
        """A scheduler over the engine's page pool, or over `pool` (a run with its own engine state)."""
        return Scheduler(self.pool if pool is None else pool, self.config, self.adapters, self.media,
                         shape_ready=self.chunk_shape_ready)

    # ------------------------------------------------------------ properties the drivers and vSurge read
    @property
    def processor(self):
        return self._processor

    @property
    def overlaps_steps(self) -> bool:
        """The driver may dispatch a step before reading the previous one's tokens (one process: a
        multi-host leader's followers replay calls in order, but have not been checked with it)."""
        return self.config.async_scheduling and self.on_call is None

    @property
    def max_length(self) -> int:
        return self.config.max_length

    @property
    def max_prompt_length(self) -> int:
        return self.config.prompt_limit

    @property
    def max_concurrent_decodes(self) -> int:
        return self.config.max_slots

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    @property
    def eos_token_ids(self) -> list[int]:
        ids = eos_token_ids(self._processor) or list(self.model.config.eos_token_ids)
        return list(dict.fromkeys(ids))

    @property
    def pad_token_id(self) -> int:
        return pad_token_id(self._processor)

    @property
    def model_name(self) -> str:
        return self.model.config.name or self.model.config.architecture

    def new_seed(self) -> int:
        """A request seed drawn from the engine's generator (when the caller gives none)."""
        return int(self._rng.integers(0, 2**63 - 1))

    # ------------------------------------------------------------ compilation
    def buckets(self) -> list[tuple]:
        """Every program the engine runs."""
        return [key for kind in PROGRAMS.values() for key in kind.keys(self)]

    def compile(self, progress: bool = True) -> None:
        """Compile every program the engine will run, on one thread per core (XLA compiles without
        the GIL); nothing compiles after this."""
        from concurrent.futures import ThreadPoolExecutor, as_completed

        from tqdm.auto import tqdm

        defers = compile_mode.defers(self)
        jobs = [job for job in self.buckets() if job not in self._compiled
                and (not defers or deferred_programs.at_start(self, job))]
        start, cache_before, seconds, phases = time.perf_counter(), compile_counts.cache_counts(), {}, {}

        def timed_build(job):
            began = time.perf_counter()
            with compile_counts.phases_of_this_thread() as phases[job]:
                program = self._build(job)
            seconds[job] = time.perf_counter() - began
            return program

        with ThreadPoolExecutor(max(1, min(len(jobs), os.cpu_count() or 1))) as pool, \
                tqdm(total=len(jobs), desc=f"Compiling {type(self).__name__}", unit="program",
                     disable=not progress) as bar:
            futures = {pool.submit(timed_build, job): job for job in jobs}
            for future in as_completed(futures):
                program = future.result()
                with self._compile_lock:
                    self._compiled.setdefault(futures[future], program)
                bar.update()
        self.compile_seconds += time.perf_counter() - start
        if jobs:  # the start-up output shows it (vsurge serve): a slow start names its programs
            self.compile_summary = compile_counts.summary(seconds, time.perf_counter() - start, cache_before, phases)
            log.info("compiled %s", self.compile_summary)
        if defers:
            self.deferred.start([key for key in self.buckets() if key not in self._compiled])

    def usable(self, key: tuple) -> bool:
        """Whether a step may call `key`'s program now: compiled, or not left to the background compiles
        (a failed one counts: the step builds it and meets the real error)."""
        return not self.deferred.active or key in self._compiled or key in self._background_failed

    def chunk_shape_ready(self, shape: tuple[int, int]) -> bool:
        """Whether prompt steps of `shape` can run without waiting for a compile (the scheduler's filter)."""
        return self.usable(MIXED.key(max(self.config.mixed_rows(shape)), shape))

    def _program(self, key: tuple):
        program = self._built(key)
        return program if self.on_call is None else partial(self.on_call, key, program)

    def _built(self, key: tuple):
        """The compiled program of `key`, built once: a caller asking for one another thread is building
        waits for it, and the lock is not held while compiling (the engine's thread may need another
        program meanwhile)."""
        with self._compile_lock:
            if key in self._compiled:
                return self._compiled[key]
            future, owner = self._building.get(key), False
            if future is None:
                future, owner = self._building.setdefault(key, Future()), True
        if not owner:
            return future.result()
        return self._run_build(key, future, background=False)

    def _run_build(self, key: tuple, future: Future, background: bool):
        """Compile `key`, store it and resolve `future`. A failure is raised (inline), or logged and
        remembered (on the background thread: the engine's thread then meets it again)."""
        start = time.perf_counter()
        try:
            program = self._build(key)
        except BaseException as exc:
            with self._compile_lock:
                del self._building[key]
                if background:
                    self._background_failed.add(key)
            future.set_exception(exc)
            if not background:
                raise
            log.warning("compiling %s in the background failed: %r", key, exc)
            return None
        with self._compile_lock:
            self._compiled[key] = program
            del self._building[key]
            self.compile_seconds += time.perf_counter() - start
            if background:
                self.background_compiles.append(key)
        future.set_result(program)
        return program

    def program_ready(self, key: tuple) -> bool:
        """Whether `key`'s program is compiled; if not, its compile starts on a background thread (once)
        and the caller goes on: the scheduler holds back the work that needs it (an image of a size not
        seen before) while the engine serves everyone else. A background build that failed counts as
        ready, so the engine's thread builds it again and the request fails with the real error."""
        with self._compile_lock:
            if key in self._compiled or key in self._background_failed:
                return True
            if key in self._building:
                return False
            if self._background is None:
                from concurrent.futures import ThreadPoolExecutor

                self._background = ThreadPoolExecutor(1, thread_name_prefix="vsurge-compile")
            self._building[key] = future = Future()
        self._background.submit(self._run_build, key, future, True)
        return False

    def image_program_ready(self, h: int, w: int) -> bool:
        """`program_ready` of the vision program of one h x w image (a model with `variable_images`)."""
        return self.program_ready(VISION.key(1, h, w))

    @property
    def attention_backend(self) -> str:
        """The resolved attention backend (kv/backends) whose layout the pool takes."""
        from ..kv.backends import resolve

        return resolve(self.config.attention_backend)

    @property
    def kv_dtype(self):
        """The KV pages' storage dtype: the model's, or int8 / float8 (`config.kv_cache_dtype`, kv/quant.py)."""
        from ..kv.paged import pool_dtype

        return pool_dtype(self.model, self.config)

    def _empty_state(self) -> EngineState:
        from ..kv.recurrent import state_dtype

        snapshots = getattr(self.pool, "snapshots", None)
        return programs.empty_state(self.model.config, self.kv_dtype, self.pool.num_pages, self.pool.page_size,
                                    self.config.max_slots, snapshots.rows if snapshots is not None else 0,
                                    self.config.draft_state_rows, state_dtype(self.config.state_dtype, self.model),
                                    self.attention_backend)

    # jax.jit's in/out shardings of the programs on the model's mesh ({} on one device), by signature
    def _init_shardings(self, state) -> dict:
        """() -> state."""
        return {} if self.mesh is None else dict(out_shardings=state_shardings(state, self.mesh))

    def _set_slot_shardings(self, state) -> dict:
        """(state, 7 host arrays) -> state."""
        if self.mesh is None:
            return {}
        kv = state_shardings(state, self.mesh)
        return dict(in_shardings=(kv,) + (replicated(self.mesh),) * 7, out_shardings=kv)

    def _weight_shardings(self) -> tuple:
        return (jax.tree.map(lambda x: x.sharding, self.graphstate), jax.tree.map(lambda x: x.sharding, self.graphother))

    def _encode_shardings(self, batch) -> dict:
        """(weights, host batch) -> host outputs: no engine state."""
        if self.mesh is None:
            return {}
        rep = replicated(self.mesh)
        return dict(in_shardings=(*self._weight_shardings(), jax.tree.map(lambda _: rep, batch)), out_shardings=rep)

    def _step_shardings(self, state, batch) -> dict:
        """(weights, state, batch) -> (state, outputs)."""
        if self.mesh is None:
            return {}
        kv, rep = state_shardings(state, self.mesh), replicated(self.mesh)
        inputs = row_shardings(batch, self.mesh, self.input_partition_spec)
        return dict(in_shardings=(*self._weight_shardings(), kv, inputs), out_shardings=(kv, rep))

    def _build(self, key: tuple):
        store = self._program_store()
        began = time.perf_counter()
        program = store.load(key) if store is not None else None
        if program is not None:  # no tracing at all (engine/program_store.py)
            compile_counts.note("store read", time.perf_counter() - began)
            return program
        if self.mesh is None:
            program = self._lower_and_compile(key)
        else:
            with jax.set_mesh(self.mesh):  # the model pins a few shardings (sharding.constrain)
                program = self._lower_and_compile(key)
        if store is not None:
            store.save(key, program)
        return program

    def _program_store(self):
        """The store of this engine's compiled programs (None: no compilation cache, or turned off)."""
        with self._compile_lock:
            if self._store is False:
                from .program_store import ProgramStore

                self._store = ProgramStore.for_engine(self)  # (the state's shapes traced only when on)
            return self._store

    def _lower_and_compile(self, key: tuple):
        state = jax.eval_shape(self._empty_state)
        return kind_of(key).build(self, key, state, _abstract(self.graphstate), _abstract(self.graphother))

    # ------------------------------------------------------------ running
    def init_state(self) -> EngineState:
        return self._program(INIT.key())()

    def warm_up(self, state: EngineState) -> EngineState:
        """Run one short greedy sequence through the programs a lone request uses first (a short
        prompt's step, then decode steps): their first runs cost ~0.2-0.3 s each (buffers
        allocated, code paged in), which the first request's TTFT paid before. Slots and pages
        it takes are free again when it returns."""
        from ..sampling.params import SamplingParams
        from .request import ActiveRequest, ReturnChannel
        from .sequence import Sequence

        steps = self.config.decode_steps + 1
        prompt = [self.pad_token_id] * min(16, self.config.prompt_limit)
        request = ActiveRequest(prompt, SamplingParams(max_tokens=steps, temperature=0.0, ignore_eos=True), 0,
                                steps, [], ReturnChannel(), detokenize=False)
        if self.config.role != "both":
            return self._warm_up_role(state, request)
        scheduler = self.new_scheduler()
        scheduler.add(Sequence.of(request, self._processor, self.vocab_size))
        while scheduler.has_work:
            plan = scheduler.schedule()
            state, out = self.step(state, plan)
            scheduler.postprocess(plan, out.to_host(False))
        return state

    def slot_setups(self, plan: StepPlan) -> list[tuple]:
        """(slot, host arrays) of the sequences admitted (or re-admitted) since their last step: each
        built under its sequence's blame (faults.py), so a request whose values the arrays cannot hold
        fails alone."""
        setups = []
        for seq in plan.sequences:
            if seq.needs_setup:
                with blame(seq, "loading its sampling state"):
                    setups.append((seq, np.int32(seq.slot), *self.batches.slot_arrays(seq)))
        return setups

    def setup_slots(self, state: EngineState, setups: list[tuple]) -> EngineState:
        """Load `slot_setups`' sampling state into the engine state (device calls)."""
        for seq, *arrays in setups:
            state = self._program(SET_SLOT.key())(state, *arrays)
            seq.needs_setup = False
        return state

    def step(self, state: EngineState, plan: StepPlan, masks: dict | None = None,
             graphstate=None, graphother=None) -> tuple[EngineState, StepOutput]:
        """Run one plan. masks: sequence -> packed bits of its allowed next tokens (structured
        outputs; `Scheduler.masks(plan)`). Every host array is built before the first device call: a
        request that fails there (a SequenceFault) leaves `state` as it was (the device calls donate it)."""
        setups = self.slot_setups(plan)
        c = self.config
        if plan.chunks:
            if self.media is not None:
                self.media.prepare(plan)  # the chunks' images encoded (or found cached) before the batch
            rows = next(n for n in c.mixed_rows(plan.chunk_shape)
                        if n >= len(plan.decode) and self.usable(MIXED.key(n, plan.chunk_shape)))
            batch, key = self.batches.mixed(plan, rows, masks), MIXED.key(rows, plan.chunk_shape)
        else:
            needed = self.batches.decode_window(plan)
            window = next(w for w in c.page_windows if w >= needed)
            rows = next(n for n in c.decode_rows if n >= plan.decode_row_count and self.usable(DECODE.key(n, window)))
            batch = self.batches.decode(plan, rows, window, masks, needed if c.dynamic_window(window) else None)
            key = DECODE.key(rows, window)
        state = self.setup_slots(self.sync_tiers(state), setups)
        if self.adapters is not None:
            lora_serving.apply_writes(self)
        gs = self.graphstate if graphstate is None else graphstate
        go = self.graphother if graphother is None else graphother
        state, out = self._program(key)(gs, go, state, batch)
        if not plan.chunks:
            return state, out
        snaps = getattr(self.pool, "snapshots", None)
        for chunk in plan.chunks if snaps is not None else ():
            if chunk.save >= 0:
                snaps.written(chunk.save)  # (to the disk tier, copied before the next step)
        return state, dataclasses.replace(out, chunk_offset=rows)

    def prefetch_prefixes(self, state: EngineState) -> tuple[EngineState, int]:
        """The disk tier's most recent pages into free device pages (start-up) -> (state, pages)."""
        if self.tiers is None or self.config.role == "decode":
            return state, 0
        return self.tiers.prefetch(state, self.config.kv_disk_prefetch_bytes)

    def sync_tiers(self, state: EngineState) -> EngineState:
        """Run the page copies the pool queued: to and from the prefix cache's host/disk tiers
        (engine/tier_mover.py) and tails copied on write (kv/page_manager.py)."""
        if self.tiers is not None:
            return self.tiers.sync(state)
        take = getattr(self.pool, "take_copies", None)
        return self.copy_pages(state, take()) if take is not None else state

    @property
    def page_nbytes(self) -> int:
        """Bytes of one KV page over every layer (what a tier copy moves per page)."""
        from ..kv.paged import pool_page_bytes

        return pool_page_bytes(self.model, self.config)

    @property
    def accepts_images(self) -> bool:
        return self.media is not None

    def encode_tiles(self, pixels: np.ndarray) -> np.ndarray:
        """uint8 (n, H, W, C) image tiles -> (n * tokens_per_tile, D) float32 embeddings (host), through
        the vision program of the smallest tile bucket that holds n (media.py)."""
        n = pixels.shape[0]
        bucket = next(b for b in tile_buckets() if b >= n)
        padded = np.zeros((bucket, *pixels.shape[1:]), np.uint8)
        padded[:n] = pixels
        out = self._program(VISION.key(bucket))(self.graphstate, self.graphother, padded)
        return np.asarray(jax.device_get(out))[: n * self.model.config.tokens_per_tile]

    def encode_image(self, pixels: np.ndarray) -> np.ndarray:
        """uint8 (1, H, W, C) one image of a model with `variable_images` -> (its tokens, D) float32 (host),
        through the vision program of its size (compiled on first use: a service sees few sizes, and the
        window layout and rotary tables of the tower are static per size)."""
        _, h, w, _ = pixels.shape
        return np.asarray(jax.device_get(self._program(VISION.key(1, h, w))(self.graphstate, self.graphother,
                                                                             pixels)))

    # ------------------------------------------------------------ whole-prompt passes (encode.py)
    def encode_step(self, pending: list) -> list[tuple]:
        """Run ONE embed or score call over waiting EncodeRequests of one kind (the first's): as many
        as fit the step's token budget, packed several per row. -> [(request, result)] for those it
        served; the rest wait for the next call. Its programs compile on first use (then cached on
        disk with every other program), so engines that never encode compile nothing more."""
        if self.on_call is not None:  # the multi-host followers replay only the generation programs
            raise RuntimeError("embeddings and prompt logprobs are not served by multi-host engines yet")
        kind = PROGRAMS[pending[0].kind]  # (an EncodeRequest's kind names its program kind: EMBED, SCORE)
        shape, requests, places = encode.pack([r for r in pending if r.kind == kind.name], self.config.prefill_tokens,
                                              self.config.max_length, one_per_row=self.config.recurrent_state)
        batch = encode.batch_of(shape, requests, places)
        out = jax.device_get(self._program(kind.key(*shape))(self.graphstate, self.graphother, batch))
        return list(zip(requests, kind.results(batch, places, requests, out)))
