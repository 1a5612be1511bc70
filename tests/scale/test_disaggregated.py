"""Disaggregated serving on 6 CPU devices: prefill engines tensor-parallel over devices 0-2, decode
engines over 3-5, dense and paged; a hybrid model's states handed over with its pages; over HTTP with
the real CLI and the openai client; across two processes (a dense model at TP 3, a hybrid at TP 1).

The engine checks run in a subprocess (tests/disaggregated_checks.py) with
XLA_FLAGS=--xla_force_host_platform_device_count=6: the device count is fixed when JAX
starts. A tiny llama with 6 query heads and 3 KV heads (one KV head per device at TP 3),
float32: greedy tokens must equal the colocated engine's and the one-device Generator's.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from server_process import ServerProcess, client_for
from tiny_models import write_tiny_model
from xla_flags import xla_flags

HERE = Path(__file__).parents[1]  # tests/: the helper scripts
DEVICES = {"XLA_FLAGS": xla_flags("--xla_force_host_platform_device_count=6"), "JAX_PLATFORMS": "cpu"}
TP3 = dict(hidden_size=96, intermediate_size=192, num_attention_heads=6, num_key_value_heads=3)
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def tiny_tp3(tmp_path_factory, default_processor_dir):
    folder = tmp_path_factory.mktemp("tiny_llama_tp3")
    write_tiny_model("llama", folder, default_processor_dir, **TP3)
    return folder


def run_check(name: str, *args, timeout: int = 600) -> dict:
    proc = subprocess.run([sys.executable, str(HERE / "disaggregated_checks.py"), name, *map(str, args)],
                          env={**os.environ, **DEVICES}, capture_output=True, text=True, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return json.loads(lines[-1][len("RESULT "):])


@pytest.fixture(scope="module")
def engines_result(tiny_tp3):
    return run_check("engines", tiny_tp3)


@pytest.mark.parametrize("kind", ["dense", "paged"])
def test_prefill_on_devices_0_2_and_decode_on_3_5_answer_as_the_colocated_engine(engines_result, kind):
    r, out = engines_result, engines_result[kind]
    assert r["colocated"] == r["reference"]
    assert out["tokens"] == r["colocated"]
    assert out["roles"] == ["prefill", "decode"]
    # each engine compiled only what its role runs (a paged prefill side copies prefix-cache tails)
    assert out["programs"] == {"prefill": ["copy"] * (kind == "paged") + ["export", "init", "mixed", "set_slot"],
                               "decode": ["decode", "import", "init", "set_slot"]}
    # the decode engine's KV pages live on its devices, split over KV heads; a prefix moves there
    assert out["prefill_kv_devices"] == [0, 1, 2] and out["decode_kv_devices"] == [3, 4, 5]
    assert out["decode_kv_specs"] == ["P(None, 'model', None, None)"]
    assert out["prefix_devices"] == [[0, 1, 2], [3, 4, 5]]
    assert out["prefix_spec"] == "P('data', 'model', None, None)"
    # one hand-over per request (6 prompts, then the long one again); nobody interleaved
    assert out["transfers"] == 7 and out["both_steps"] == 0
    assert out["prefill_steps"] > 0 and out["decode_steps"] > 0


def test_the_prefix_cache_of_the_prefill_engines_saves_prefill_steps(engines_result):
    paged, dense = engines_result["paged"], engines_result["dense"]
    assert paged["again"] == dense["again"] == engines_result["reference"][-1]
    assert paged["prefix_hits"] == 64  # the long prompt's two full 32-token pages
    assert paged["prefill_steps_again"] < dense["prefill_steps_again"]  # the dense engine has no prefix cache


def test_a_hybrid_models_states_travel_with_its_pages(tmp_path_factory, default_processor_dir):
    """Qwen3-Next (DeltaNet states beside KV pages), prefill over devices 0-1 and decode over 2-3: each
    sequence's recurrent states go from the prefill engine's slot to the decode engine's (without them
    the decode side would continue from zero states and answer differently)."""
    folder = tmp_path_factory.mktemp("tiny_qwen3_next")
    write_tiny_model("qwen3_next", folder, default_processor_dir)
    r = run_check("hybrid", folder)
    for kind in ("dense", "paged"):
        out = r[kind]
        assert out["tokens"] == r["reference"], kind
        assert out["roles"] == ["prefill", "decode"] and out["transfers"] == 6
        assert out["programs"] == {"prefill": ["state_export/states"], "decode": ["state_import/states"]}
        assert out["decode_state_devices"] == [2, 3]  # replicated over the decode engine's mesh


# ---------------------------------------------------------------- over HTTP
@pytest.fixture(scope="module")
def reference(tiny_tp3):
    import vsurge
    from dense_generator import greedy_generate

    model, processor = vsurge.load(tiny_tp3, dtype="float32", progress=False)
    return {p: processor.decode(greedy_generate(model, processor.encode(p), MAX_TOKENS)) for p in PROMPTS}


PROMPTS = [f"Tell me about {topic}" for topic in ("volcanoes", "the moon", "bees", "chess", "rivers", "robots",
                                                   "tea", "glaciers", "owls", "bridges", "jazz", "deserts",
                                                   "comets", "forests", "trains", "coral")]


@pytest.fixture(scope="module")
def server(tiny_tp3):
    proc = ServerProcess(str(tiny_tp3), "--served-model-name", "tiny", "--dtype", "float32", "--engine", "paged",
                         "--prefill-devices", "0-2", "--decode-devices", "3-5", "--max-concurrent-decodes", "4",
                         "--max-length", "128", "--prefill-lengths", "32", "--prefill-tokens", "64",
                         "--page-size", "32", "--num-pages", "16", cache_dir="none", env=DEVICES)
    proc.wait_ready(timeout=400)
    yield proc
    assert proc.stop() == 0, proc.output[-3000:]


def test_sixteen_concurrent_streams_over_http_none_lost(server, reference):
    assert "Paged KV cache of a prefill engine: 16 pages" in server.output
    client = client_for(server, timeout=120)

    def stream(prompt):
        text, finish = "", []
        for chunk in client.completions.create(model="tiny", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                               stream=True):
            text += chunk.choices[0].text
            finish += [chunk.choices[0].finish_reason] if chunk.choices[0].finish_reason else []
        return prompt, text, finish

    with ThreadPoolExecutor(len(PROMPTS)) as pool:  # 16 at once: 4 decode slots, the rest queue
        results = list(pool.map(stream, PROMPTS))
    assert {p: t for p, t, _ in results} == reference
    assert all(f == ["length"] for _, _, f in results)

    samples = {}
    for family in text_string_to_metric_families(server.get("/metrics").text):
        for s in family.samples:
            samples[(s.name, s.labels.get("replica"), s.labels.get("role"))] = s.value
    assert samples[("vsurge:kv_transfer_seconds_count", "1", None)] == len(PROMPTS)  # one hand-over per request
    assert samples.get(("vsurge:kv_transfer_seconds_count", "0", None), 0) == 0  # replica 0 prefills, 1 decodes
    assert samples[("vsurge:engine_steps_total", "0", "prefill")] > 0
    assert samples[("vsurge:engine_steps_total", "1", "decode")] > 0
    assert ("vsurge:engine_steps_total", "1", "prefill") not in samples
    assert samples[("vsurge:kv_transfer_queue_depth", "0", None)] == 0

    stats = server.get("/v1/stats").json()["models"][0]
    assert [(r["id"], r["role"]) for r in stats["replicas"]] == [(0, "prefill"), (1, "decode")]
    assert stats["kv_transfer"]["count"] == len(PROMPTS) and stats["kv_transfer_queue_depth"] == 0
    assert set(stats["steps"]) == {"prefill", "decode"}
    assert stats["finished_total"] == len(PROMPTS) and stats["generation_tokens"] == len(PROMPTS) * MAX_TOKENS
    assert stats["running"] == 0 and stats["waiting"] == 0


def test_the_dashboard_shows_the_hand_over(server):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from test_web import start_chromium

    browser = start_chromium()
    try:
        client_for(server).completions.create(model="tiny", prompt="Hello", max_tokens=2, temperature=0)
        browser.get(server.base + "/dashboard")

        def tile(name):
            found = browser.find_elements(By.CSS_SELECTOR, f"#model-0 .tile[data-tile={name}] .value")
            return found[0].text if found else ""

        WebDriverWait(browser, 30, 0.1).until(lambda d: tile("transferq") == "0", "the hand-over tiles")
        assert " / " in tile("transfer") and "–" not in tile("transfer")
        badge = browser.find_element(By.CSS_SELECTOR, "#model-0 .badge").text
        assert "1 prefill + 1 decode engines" in badge
        assert browser.find_elements(By.ID, "model-0-handover") and browser.find_elements(By.ID, "model-0-steps")
    finally:
        browser.quit()


# ---------------------------------------------------------------- two processes
def test_prefill_on_process_0_and_decode_on_process_1_answer_the_same(tiny_tp3, reference):
    """One jax.distributed job on loopback (gloo collectives, JAX's transfer server for the prefixes):
    process 0 serves and prefills on its 3 devices, process 1 decodes on its 3."""
    from server_process import free_port

    coordinator = free_port()
    args = ["--served-model-name", "tiny", "--dtype", "float32", "--engine", "paged", "--prefill-devices", "0-2",
            "--decode-devices", "3-5", "--max-concurrent-decodes", "4", "--max-length", "128", "--prefill-lengths",
            "32", "--prefill-tokens", "64", "--page-size", "32", "--num-pages", "16",
            "--coordinator-address", f"127.0.0.1:{coordinator}", "--num-processes", "2", "--heartbeat-timeout", "20"]
    env = {**DEVICES, "XLA_FLAGS": xla_flags("--xla_force_host_platform_device_count=3")}
    with two_processes(tiny_tp3, args, env) as (leader, follower):
        assert "process 1 follows process 0" in follower.output
        assert "Paged KV cache of a decode engine" in follower.output
        client = client_for(leader, timeout=120)
        prompts = PROMPTS[:6]

        def one(prompt):
            return prompt, client.completions.create(model="tiny", prompt=prompt, max_tokens=MAX_TOKENS,
                                                     temperature=0).choices[0].text

        with ThreadPoolExecutor(len(prompts)) as pool:
            assert dict(pool.map(one, prompts)) == {p: reference[p] for p in prompts}
        stats = leader.get("/v1/stats").json()["models"][0]
        assert [(r["id"], r["role"]) for r in stats["replicas"]] == [(0, "prefill"), (1, "decode")]
        assert stats["kv_transfer"]["count"] == len(prompts) and stats["finished_total"] == len(prompts)


@contextlib.contextmanager
def two_processes(folder, args: list[str], env: dict):
    """Process 1 (a follower) and process 0 (the leader, ready) of one job, stopped afterwards; when the
    body fails, process 1's output is printed (a lost follower says why only there)."""
    follower = ServerProcess(str(folder), *args, "--process-id", "1", cache_dir="none", env=env)
    leader = ServerProcess(str(folder), *args, "--process-id", "0", cache_dir="none", env=env)
    try:
        leader.wait_ready(timeout=400)
        yield leader, follower
    except Exception:
        print("process 1:", follower.output[-4000:])
        raise
    finally:
        code = leader.stop(timeout=60)
        follower.proc.kill()
    assert code is not None, "the leader did not stop on SIGTERM:\n" + leader.output[-3000:]


def test_a_hybrid_models_states_cross_from_process_0_to_process_1(tmp_path_factory, default_processor_dir):
    """Qwen3-Next prefilled on process 0's device, decoded on process 1's: each sequence's recurrent
    states move with its pages (a second jax.device_put), so the answers equal one process's greedy
    ones (from zero states the decode side would answer differently)."""
    import vsurge
    from server_process import free_port
    from dense_generator import greedy_generate

    folder = tmp_path_factory.mktemp("tiny_qwen3_next_2p")
    write_tiny_model("qwen3_next", folder, default_processor_dir)
    model, processor = vsurge.load(folder, dtype="float32", progress=False)
    prompts = PROMPTS[:3]
    reference = {p: processor.decode(greedy_generate(model, processor.encode(p), MAX_TOKENS)) for p in prompts}
    coordinator = free_port()
    args = ["--served-model-name", "tiny", "--dtype", "float32", "--engine", "paged", "--prefill-devices", "0",
            "--decode-devices", "1", "--max-concurrent-decodes", "4", "--max-length", "128", "--prefill-lengths",
            "32", "--prefill-tokens", "64", "--page-size", "32", "--num-pages", "16",
            "--coordinator-address", f"127.0.0.1:{coordinator}", "--num-processes", "2", "--heartbeat-timeout", "20"]
    env = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": xla_flags("--xla_force_host_platform_device_count=1")}
    with two_processes(folder, args, env) as (leader, follower):
        client = client_for(leader, timeout=120)

        def one(prompt):
            return prompt, client.completions.create(model="tiny", prompt=prompt, max_tokens=MAX_TOKENS,
                                                     temperature=0).choices[0].text

        with ThreadPoolExecutor(len(prompts)) as pool:
            answers = dict(pool.map(one, prompts))
        assert answers == reference, follower.output[-3000:]
        stats = leader.get("/v1/stats").json()["models"][0]
        assert [(r["id"], r["role"]) for r in stats["replicas"]] == [(0, "prefill"), (1, "decode")]
        assert stats["kv_transfer"]["count"] == len(prompts)
