"""Shared fixtures: the real default model (loaded once), its transformers reference, tiny models."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# compiled programs are not stored whole between tests (engine/program_store.py, off by default on a CPU): a test
# that patches a module would otherwise load another test's program; tests/engine/test_program_store.py turns it on
os.environ["VSURGE_PROGRAM_STORE"] = "0"

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

# tests/ mirrors the package (tests/engine/, tests/server/, ...), and a few test files share helpers with others
# (`from test_images import png`): every folder of tests is importable by module name, as when they were flat
for _folder in sorted(p for p in Path(__file__).parent.iterdir() if p.is_dir() and any(p.glob("test_*.py"))):
    if str(_folder) not in sys.path:
        sys.path.append(str(_folder))

from xla_flags import xla_flags  # noqa: E402

os.environ["XLA_FLAGS"] = xla_flags(os.environ.get("XLA_FLAGS", ""))  # before JAX starts; children inherit it

import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

import jax  # noqa: E402

import pytest  # noqa: E402


def _session_cache_dir() -> str:
    """One persistent compilation cache for the whole run, fresh each run (so a result never rests on an
    earlier run's programs): in-process engines, `vsurge` subprocesses (tests/cli_helpers.py) and served
    processes (the cache_dir fixture) share it, so a program the suite compiled once loads from disk
    after. VSURGE_TEST_COMPILATION_CACHE names a lasting directory instead."""
    lasting = os.environ.get("VSURGE_TEST_COMPILATION_CACHE")
    if lasting:
        return lasting
    made = tempfile.mkdtemp(prefix="vsurge-test-xla-")
    atexit.register(shutil.rmtree, made, ignore_errors=True)
    os.environ["VSURGE_TEST_COMPILATION_CACHE"] = made  # read by cli_helpers in this and child processes
    return made


SESSION_CACHE_DIR = _session_cache_dir()


def _run_dir() -> Path:
    """A directory every pytest process of this run shares (xdist workers inherit it from the controller,
    which removes it at the end), for what one process makes once and the others read."""
    made = os.environ.get("VSURGE_TEST_RUN_DIR")
    if not made:
        made = tempfile.mkdtemp(prefix="vsurge-test-run-")
        atexit.register(shutil.rmtree, made, ignore_errors=True)
        os.environ["VSURGE_TEST_RUN_DIR"] = made
    return Path(made)


RUN_DIR = _run_dir()


# The cache key of every program names the cache directory (jax adds its GPU autotune cache's path inside
# it to the compile options it hashes): off here (a CPU run), a program's key is the same in any directory,
# so a test of a saved cache can start from this run's entries (link_session_cache_into).
jax.config.update("jax_persistent_cache_enable_xla_caches", "none")


def use_session_compilation_cache() -> None:
    """Point JAX at the run's cache (again: a test that tried another directory calls this after)."""
    from vsurge.hardware.compilation_cache import use_compilation_cache

    use_compilation_cache(Path(SESSION_CACHE_DIR))


use_session_compilation_cache()


def link_session_cache_into(directory: Path) -> None:
    """Hard-link (or copy) every entry of the run's compilation cache into `directory`: a test of a
    persisted cache (vInference.save_inference) then loads the programs this run already compiled
    instead of compiling them again, and still shows by its hits that it asked `directory` for them."""
    root = Path(SESSION_CACHE_DIR)
    for entry in root.rglob("*"):
        if entry.is_file():
            target = directory / entry.relative_to(root)
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(entry, target)
            except OSError:  # another filesystem
                shutil.copy2(entry, target)


CHAT_PROMPT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="session")
def default_gguf_path():
    from vsurge.loading import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def default_model(default_gguf_path):
    """(model, processor) of the embedded SmolLM2-135M-Instruct, float32."""
    import jax.numpy as jnp

    import vsurge

    return vsurge.load("default", dtype=jnp.float32, progress=False)


@pytest.fixture(scope="session")
def hf_reference(default_gguf_path):
    """transformers' own GGUF loader on the same file: (torch model, tokenizer). The loader dequantizes and
    converts the file in ~15 s: the run's first process to need the model saves what it loaded (the same
    module, pickled) in the run's directory, and the other reads that in ~2 s."""
    import torch
    from filelock import FileLock
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(default_gguf_path.parent), default_gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    saved = RUN_DIR / "hf_reference.pt"  # the whole module (save_pretrained refuses a GGUF-loaded model)
    with FileLock(str(saved) + ".lock"):
        if saved.exists():
            model = torch.load(saved, weights_only=False)
        else:
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
            torch.save(model, saved)
    return model.eval(), tokenizer


@pytest.fixture(scope="session")
def default_processor_dir(tmp_path_factory, default_model):
    """tokenizer.json + tokenizer_config.json of the default model, written by our Processor."""
    folder = tmp_path_factory.mktemp("default_tokenizer")
    default_model[1].save_pretrained(folder)
    return folder


class CompileCounter:
    """Counts XLA backend compilations (and their seconds) and persistent-cache hits/misses while active."""

    def __init__(self):
        self.active = False
        self.counts = {"compile": 0, "compile_s": 0.0, "hit": 0, "miss": 0}
        jax.monitoring.register_event_duration_secs_listener(self._on_duration)
        events = {"/jax/compilation_cache/cache_hits": "hit", "/jax/compilation_cache/cache_misses": "miss"}
        jax.monitoring.register_event_listener(lambda name, **__: self._bump(events.get(name)))

    def _on_duration(self, name, seconds, **_):
        if self.active and name == "/jax/core/compile/backend_compile_duration":
            self.counts["compile"] += 1
            self.counts["compile_s"] += seconds

    def _bump(self, key):
        if self.active and key:
            self.counts[key] += 1

    def __enter__(self):
        self.counts = dict.fromkeys(self.counts, 0)
        self.active = True
        return self.counts

    def __exit__(self, *exc):
        self.active = False


# The files that take longest (setup included), run first: `make test` spreads whole files over two
# processes (pytest-xdist --dist loadfile --no-loadscope-reorder: without it xdist starts the files with
# the most tests first, and files of a few long tests came last), and a long file started last would run
# alone at the end. The first four stagger the shared default server's two starts: one process runs
# test_sharding (~2.5 min), the other test_families_serving then test_server (the first start); the next
# file, test_conformance_requests, starts it again after test_sharding and loads its programs from the
# run's cache (xdist gives a process another file once its current one has <= 2 tests left). test_ray_serve
# (~3 min, its Ray cluster's starts) was missing from the list, so it ran among the last files.
SLOW_FIRST = ("test_sharding.py", "test_families_serving.py", "test_server.py", "test_conformance_requests.py",
              "test_ray_serve.py", "test_vinference.py", "test_disaggregated.py", "test_web.py", "test_hybrid_families.py", "test_paged.py",
              "test_cli.py", "test_lora_server.py", "test_conformance_schemas.py", "test_readme_quickstart.py",
              "test_seed_api.py", "test_vsurge.py", "test_gguf_families.py", "test_mmproj.py", "test_kv_int8.py",
              "test_models_vs_transformers.py", "test_models_router.py", "test_attention_backends.py",
              "test_qwen_vl.py", "test_images_server.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FIRST)))  # stable: a file's order is kept


RUN_COMPILES = CompileCounter()  # this process's, summed over the xdist workers at the end of the run
RUN_COMPILES.__enter__()
WORKER_COMPILES: list[dict] = []  # the controller's copy of each finished xdist worker's counts
FILE_SECONDS: dict[str, float] = {}  # test file -> setup + call + teardown seconds
FILE_COMPILE_SECONDS: dict[str, float] = {}  # test file -> seconds this process spent compiling in its tests


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    before = RUN_COMPILES.counts["compile_s"]
    yield
    path = item.nodeid.split("::")[0]
    FILE_COMPILE_SECONDS[path] = FILE_COMPILE_SECONDS.get(path, 0.0) + RUN_COMPILES.counts["compile_s"] - before


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::")[0]
    FILE_SECONDS[path] = FILE_SECONDS.get(path, 0.0) + report.duration


def pytest_sessionfinish(session):
    output = getattr(session.config, "workeroutput", None)  # set on an xdist worker only
    if output is not None:
        output["compiles"] = dict(RUN_COMPILES.counts)
        output["file_compile_seconds"] = dict(FILE_COMPILE_SECONDS)


def pytest_testnodedown(node, error):
    """xdist controller: keep a finished worker's compile counts."""
    output = getattr(node, "workeroutput", {})
    if output.get("compiles"):
        WORKER_COMPILES.append(output["compiles"])
    for path, seconds in output.get("file_compile_seconds", {}).items():
        FILE_COMPILE_SECONDS[path] = FILE_COMPILE_SECONDS.get(path, 0.0) + seconds


def pytest_terminal_summary(terminalreporter):
    """Where the run's time went: the slowest files, and what compiling cost the pytest processes (a run
    where the persistent cache never hits (XLA:CPU rejects its own entries on some Intel CPUs,
    jax-ml/jax#38445) shows here as hits 0 and as many misses as compiles)."""
    write = terminalreporter.write_line
    slowest = sorted(FILE_SECONDS.items(), key=lambda item: -item[1])[:30]
    if slowest:
        write(f"slowest files (setup + call + teardown, summed over workers; of it, compiling in-process): "
              f"{sum(FILE_SECONDS.values()) / 60:.1f} min in all")
        for path, seconds in slowest:
            write(f"{seconds:8.1f}s  {FILE_COMPILE_SECONDS.get(path, 0.0):7.1f}s  {path}")
    c = dict(RUN_COMPILES.counts)
    for worker in WORKER_COMPILES:
        for key in c:
            c[key] += worker[key]
    write(f"XLA in the pytest process(es): {c['compile']} compiles taking {c['compile_s']:.0f} s, persistent "
          f"cache {c['hit']} hits / {c['miss']} misses ({SESSION_CACHE_DIR})")
    from vsurge.kernels import cpu_isa

    write(f"machine: {_cpu_model()}, {os.cpu_count()} cores, CPU ISA {cpu_isa()}")  # suite times differ 2x by machine


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown CPU")
    except OSError:
        return "unknown CPU"


@pytest.fixture(scope="session")
def compile_counter():
    """Counts XLA compilations inside `with compile_counter as counts:` blocks."""
    return CompileCounter()


@pytest.fixture(scope="session")
def dense_surge(default_model):
    """A started vSurge over the dense engine (8 slots, 256 tokens), shared by the engine tests."""
    from vsurge import vSurge

    model, processor = default_model
    s = vSurge.create_vdriver(model, processor, max_concurrent_decodes=8, prefill_lengths=[64, 128],
                              max_prefill_length=128, max_length=256, seed=1, kv_cache_dtype="float32")
    s.compile()
    s.start()
    yield s
    s.stop(timeout=5)


@pytest.fixture(scope="session")
def cache_dir():
    """The run's persistent compilation cache, for the server processes tests start."""
    return SESSION_CACHE_DIR


@pytest.fixture(scope="session")
def default_server(cache_dir):
    """`vsurge serve` of the default model (a real process on loopback), shared by the server tests."""
    from server_process import DEFAULT_SERVER_ARGS, ServerProcess

    server = ServerProcess("default", *DEFAULT_SERVER_ARGS, cache_dir=cache_dir).wait_ready()
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory, default_processor_dir):
    """Every tiny family checkpoint (tests/tiny_models.py), written once: name -> (folder, torch model)."""
    from tiny_models import TINY_CONFIGS, write_tiny_model

    out = {}
    for name in TINY_CONFIGS:
        folder = tmp_path_factory.mktemp(f"tiny_{name}")
        out[name] = (folder, write_tiny_model(name, folder, default_processor_dir))
    return out
