"""Several models in one `vsurge serve` (server/router.py): `--model a=DIR --models-dir DIR` with two tiny
random models and a broken file, `--max-loaded-models 1` and `--sleep-idle-seconds`. Each model answers
with its own greedy tokens (transformers' on the same weights); alternating requests swap the models and
none is lost; an idle model is unloaded and the next request wakes it; the broken model fails only its own
requests; `/models/load`, `/models/unload` and `/v1/models` show the states."""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import time

import pytest
import torch

from server_process import ServerProcess, client_for
from test_lora import write_peft_adapter
from tiny_models import write_tiny_model

PROMPT = [11, 12, 13, 14, 15, 16, 17, 18]
STEPS = 6
IDLE_S = 6


@pytest.fixture(scope="module")
def models(tmp_path_factory, default_processor_dir):
    root = tmp_path_factory.mktemp("router")
    torch_a = write_tiny_model("llama", root / "a", default_processor_dir)
    shelf = root / "shelf"
    shelf.mkdir()
    torch_b = write_tiny_model("qwen2", shelf / "b", default_processor_dir)
    # a LoRA adapter of b (PEFT writes it over an identical copy of b's weights), loaded at run time
    peft_b = write_peft_adapter(root / "b_copy", root / "b_lora", default_processor_dir, 8, seed=30, family="qwen2")
    (shelf / "broken.gguf").write_bytes(b"GGUF\x03\x00\x00\x00 this is not a model")
    # "c": model b again under its own options (a --models-config entry)
    (root / "models.json").write_text(json.dumps({"c": {"path": str(shelf / "b"), "max-length": 48,
                                                        "generation-config": "vsurge"}}))
    return root, {"a": torch_a, "b": torch_b, "b_lora": peft_b}


@pytest.fixture(scope="module")
def server(models, cache_dir):
    root, _ = models
    server = ServerProcess(f"a={root / 'a'}", "--models-dir", str(root / "shelf"), "--models-config",
                           str(root / "models.json"), "--max-loaded-models", "1",
                           "--sleep-idle-seconds", str(IDLE_S), "--enable-lora", "--max-lora-rank", "8",
                           "--dtype", "float32", "--max-concurrent-decodes", "4", "--max-length", "64",
                           "--prefill-lengths", "32", cache_dir=cache_dir).wait_ready()
    yield server
    assert server.stop() == 0


def greedy_text(torch_model, processor) -> str:
    with torch.no_grad():
        out = torch_model.generate(torch.tensor([PROMPT]), max_new_tokens=STEPS, do_sample=False, pad_token_id=0,
                                   eos_token_id=None)
    return processor.decode(out[0, len(PROMPT):].tolist(), skip_special_tokens=True)


def ask(server, model: str) -> str:
    reply = client_for(server, timeout=300).completions.create(model=model, prompt=PROMPT, max_tokens=STEPS,
                                                               temperature=0, extra_body={"ignore_eos": True})
    assert reply.model == model
    return reply.choices[0].text


def unload(server, name: str):
    """POST /models/unload, again while it answers 409 (a request just answered counts as in flight a moment)."""
    for _ in range(20):
        r = server.post("/models/unload", json={"model": name})
        if r.status_code != 409:
            return r
        time.sleep(0.2)
    return r


def states(server) -> dict:
    return {m["id"]: m["status"]["value"] for m in server.get("/v1/models").json()["data"] if not m["parent"]}


def test_each_model_answers_and_alternating_requests_swap_them_losing_none(server, models, default_model):
    _, torch_models = models
    want = {name: greedy_text(m, default_model[1]) for name, m in torch_models.items() if name in ("a", "b")}
    assert want["a"] != want["b"]
    assert states(server) == {"a": "loaded", "b": "unloaded", "broken": "unloaded", "c": "unloaded"}
    for name in ("b", "a", "b", "a"):  # one at a time: each swaps
        assert ask(server, name) == want[name]
        assert states(server)[name] == "loaded"
        assert list(states(server).values()).count("loaded") == 1
    # a burst of both at once: every request answered, with its own model's tokens
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        jobs = [(name, pool.submit(ask, server, name)) for name in ["a", "b"] * 4]
        answers = [(name, job.result(timeout=600)) for name, job in jobs]
    assert all(text == want[name] for name, text in answers), answers
    catalog = {m["id"]: m for m in server.get("/v1/stats").json()["catalog"]}
    assert catalog["b"]["loads"] >= 3 and catalog["a"]["loads"] >= 2
    assert catalog["a"]["memory_bytes"] > 0 and catalog["b"]["memory_bytes"] > 0  # (what the budget counts)
    print("load seconds (warm compilation cache):", {n: m["load_seconds"] for n, m in catalog.items()})


def test_a_broken_model_fails_only_its_own_requests(server):
    r = server.post("/v1/completions", json={"model": "broken", "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 503 and "failed to load" in r.json()["error"]["message"], r.text
    assert states(server)["broken"] == "failed"
    metrics = server.get("/metrics").text
    assert 'vsurge:model_state{model_name="broken",state="failed"} 1.0' in metrics
    assert 'vsurge:model_state{model_name="broken",state="loaded"} 0.0' in metrics
    assert 'vsurge:model_loads_total{model_name="broken"} 0.0' in metrics
    assert ask(server, "a")  # the others keep serving


def test_the_dashboard_lists_the_catalog(server):
    """Real Chromium on /dashboard: a row per model the server may load, in the state /v1/stats gives, a loaded
    one with its memory, a failed one with its reason."""
    from test_web import model_rows, start_chromium, wait

    def agreeing(driver):  # (an idle model may fall asleep meanwhile: the page follows within a poll)
        rows, entries = model_rows(driver), {m["id"]: m for m in server.get("/v1/stats").json()["catalog"]}
        shown = {name: row["state"].split("\n")[0] for name, row in rows.items()}
        return shown == {name: e["state"] for name, e in entries.items()} and (rows, entries)

    driver = start_chromium()
    try:
        driver.get(server.base + "/dashboard")
        rows, entries = wait(driver, agreeing, timeout=20, message="the catalog's rows in their states")
    finally:
        driver.quit()
    assert set(rows) == {"a", "b", "broken", "c"}
    for name, row in rows.items():
        entry = entries[name]
        if entry["state"] == "loaded":
            assert row["memory"] != "–" and row["weights"] != "–", row
        elif "memory_bytes" not in entry:
            assert row["memory"] == "–", row
        assert (row["state"] != entry["state"]) == ("error" in entry), row  # a failure's reason, under its state


def test_an_adapter_loaded_for_the_second_model_survives_its_unload(server, models, default_model):
    """POST /v1/load_lora_adapter naming model b loads b and serves the adapter with PEFT's greedy text; after b
    is unloaded, /v1/models still lists the adapter under b, and a request for the adapter loads b with it."""
    root, torch_models = models
    want = greedy_text(torch_models["b_lora"], default_model[1])
    assert want != greedy_text(torch_models["b"], default_model[1])
    r = server.post("/v1/load_lora_adapter", json={"lora_name": "bl", "lora_path": str(root / "b_lora"), "model": "b"})
    assert r.status_code == 200, r.text
    assert ask(server, "bl") == want
    assert unload(server, "b").status_code == 200
    listed = {m["id"]: m for m in server.get("/v1/models").json()["data"]}
    assert listed["bl"]["parent"] == "b" and listed["b"]["status"]["value"] == "unloaded"
    assert ask(server, "bl") == want  # b loads again, with its adapter
    assert states(server)["b"] == "loaded"
    assert server.post("/v1/unload_lora_adapter", json={"lora_name": "bl"}).status_code == 200
    assert server.post("/v1/completions", json={"model": "bl", "prompt": "hi", "max_tokens": 2}).status_code == 404


def test_load_unload_routes_and_idle_sleep(server):
    r = server.post("/models/load", json={"model": "b"})
    assert r.status_code == 200 and r.json()["success"], r.text
    assert states(server)["b"] == "loaded" and states(server)["a"] == "unloaded"
    assert unload(server, "b").status_code == 200
    assert states(server)["b"] == "unloaded"
    assert server.post("/models/load", json={"model": "nope"}).status_code == 404
    ask(server, "a")
    deadline = time.time() + IDLE_S + 10
    while states(server)["a"] == "loaded" and time.time() < deadline:
        time.sleep(0.5)
    assert states(server)["a"] == "unloaded"  # asleep after IDLE_S idle seconds
    assert ask(server, "a")  # and woken by its next request


def test_a_models_config_entry_takes_its_own_options(server):
    assert ask(server, "c")  # model b's weights, its own engine options
    lengths = {m["id"]: m.get("max_model_len") for m in server.get("/v1/models").json()["data"]}
    assert lengths["c"] == 48


@pytest.mark.parametrize("options, message", [
    ({"path": "x", "max-lenght": 10}, "unknown option 'max-lenght'"),
    ({"path": "x", "max-length": 1}, "max-length must be at least 2"),
])
def test_bad_models_config_options_are_named(tmp_path, options, message):
    from vsurge.cli.served_models import model_options

    (tmp_path / "m.json").write_text(json.dumps({"m": options}))
    with pytest.raises(ValueError, match=message):
        model_options(argparse.Namespace(models_config=str(tmp_path / "m.json")), "m", {})


@pytest.mark.parametrize("lora, want", [
    ({"sql": "/a/sql"}, {"sql": "/a/sql"}),
    (["sql=/a/sql", "poet=/a/poet"], {"sql": "/a/sql", "poet": "/a/poet"}),
    (["sql"], "lora takes"),
    ({"sql": 3}, "lora takes"),
])
def test_a_models_config_entrys_adapters(tmp_path, lora, want):
    from vsurge.cli.served_models import config_adapters, model_options

    (tmp_path / "m.json").write_text(json.dumps({"m": {"path": "x", "lora": lora}}))
    args = argparse.Namespace(models_config=str(tmp_path / "m.json"))
    if isinstance(want, str):
        with pytest.raises(ValueError, match=want):
            config_adapters(args, "m")
    else:
        assert config_adapters(args, "m") == want
        assert model_options(args, "m", {})[1] == {}  # (not an engine option)
