"""Model families served over HTTP by the paged engine, greedy text equal to transformers'.

One real `vsurge` server process (tests/family_server.py) holds one tiny checkpoint of each family
whose attention or cache differs from Llama's (the others' layers are checked against transformers
in tests/models/test_models_vs_transformers.py; here each family costs its engine's compile) on its own oEngine; the prompts are longer than a chunk (prefilled in several steps),
every family is asked at once (batched steps), and each prompt is asked twice (the second
time its full pages come from the prefix cache).
"""

from __future__ import annotations

import json

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch

from server_process import ENV, free_port
from tiny_models import chosen
from xla_flags import xla_flags

HERE = Path(__file__).parents[1]  # tests/: the helper scripts
# one checkpoint (tests/tiny_models.py) per kind of attention and cache: plain GQA, biases, QK norms,
# soft caps and windows, local/global rotary bases, fused tensors, no-rope layers, routed experts, sinks,
# MLA's latent pages, chunked attention, per-layer KV shapes, Gated DeltaNet states beside the pages
SERVED = chosen("llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "smollm3", "qwen3_moe", "gpt_oss", "deepseek_v3",
                 "llama4", "gemma4", "qwen3_next")
PROMPT = ("The river ran past the old mill, where the miller's daughter counted ducks "
          "every morning before the bells of the town began to ring")
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def family_server(tiny_checkpoints):
    port = free_port()
    args = [f"{name}={tiny_checkpoints[name][0]}" for name in SERVED]
    log = open(HERE.parent / ".pytest_cache" / "family_server.log", "w") if (HERE.parent / ".pytest_cache").exists() \
        else subprocess.DEVNULL
    env = {**ENV, "XLA_FLAGS": xla_flags()}  # a check script: compiles 13 engines, answers 26 requests
    proc = subprocess.Popen([sys.executable, str(HERE / "family_server.py"), str(port), *args], env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 600
    try:
        while time.time() < deadline:
            assert proc.poll() is None, "the family server exited during start-up"
            try:
                if httpx.get(base + "/readiness", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        else:
            pytest.fail("the family server did not become ready in 600 s")
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def expected_tokens(name, tiny_checkpoints, processor) -> list[str]:
    """transformers' greedy continuation, one text per token (as completions' logprobs give them)."""
    folder, torch_model = tiny_checkpoints[name]
    ids = processor.encode(PROMPT)
    with torch.no_grad():
        out = torch_model.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False, pad_token_id=0,
                                   eos_token_id=None)
    return [processor.decode([t]) for t in out[0, len(ids):].tolist()]


def complete(base, name):
    body = {"model": name, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
            "logprobs": 0}
    r = httpx.post(base + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_the_families_serve_their_greedy_text(family_server, tiny_checkpoints, default_model):
    processor = default_model[1]
    assert len(processor.encode(PROMPT)) > 16  # longer than one chunk: prefilled over several steps
    with ThreadPoolExecutor(len(SERVED)) as pool:  # all at once, then all again (prefix-cache hits)
        first = dict(zip(SERVED, pool.map(lambda n: complete(family_server, n), SERVED)))
        second = dict(zip(SERVED, pool.map(lambda n: complete(family_server, n), SERVED)))
    for name in SERVED:
        want = expected_tokens(name, tiny_checkpoints, processor)
        assert first[name]["model"] == name
        assert first[name]["choices"][0]["logprobs"]["tokens"] == want, name
        assert second[name]["choices"][0]["logprobs"]["tokens"] == want, name
    stats = {m["name"]: m for m in httpx.get(family_server + "/v1/stats", timeout=10).json()["models"]}
    # the second prompt found its first full page (16 tokens) cached; the hybrid (qwen3_next)
    # resumed its recurrent states from the snapshot taken at that page's end (docs/state_cache.md)
    for name in SERVED:
        assert stats[name]["prefix_cache_hits"] >= 16, name
    # the hybrid's recurrent states (a row per slot and a spare, and the snapshots) count in the stats
    from vsurge.kv.recurrent import state_row_bytes
    from vsurge.models.registry import config_from_hf

    for name in SERVED:
        row = state_row_bytes(config_from_hf(json.loads((tiny_checkpoints[name][0] / "config.json").read_text())))
        assert (stats[name]["state_cache_bytes"] > 0) == (name == "qwen3_next"), name
        assert stats[name]["state_cache_bytes"] % max(row, 1) == 0 and stats[name]["state_cache_bytes"] >= 2 * row
