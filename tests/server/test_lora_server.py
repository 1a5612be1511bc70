"""LoRA adapters over HTTP: `vsurge serve --lora NAME=PATH` on a tiny random Llama, requests selecting an
adapter by `model` through the real `openai` and `anthropic` SDKs, vLLM's runtime load/unload routes,
`/v1/models`, and bad adapters answered 4xx while the server keeps serving. Runtime loading is on by
`--lora-dir` (the adapters' folder): paths resolve inside it."""

from __future__ import annotations

import anthropic
import httpx
import numpy as np
import openai
import pytest
import torch

from server_process import ServerProcess, client_for
from test_lora import peft_greedy, write_peft_adapter
from tiny_models import write_tiny_model
from xla_flags import xla_flags

STEPS = 8


@pytest.fixture(scope="module")
def lora_setup(tmp_path_factory, default_processor_dir):
    root = tmp_path_factory.mktemp("lora_server")
    torch_base = write_tiny_model("llama", root / "base", default_processor_dir)
    adapters = {f"a{k}": (root / f"adapter{k}", write_peft_adapter(root / f"base{k}", root / f"adapter{k}",
                                                                  default_processor_dir, 8, seed=30 + k, family="llama"))
                for k in range(2)}
    return root, torch_base, adapters


@pytest.fixture(scope="module")
def server(lora_setup, cache_dir):
    root, _, adapters = lora_setup
    server = ServerProcess(str(root / "base"), "--served-model-name", "base", "--lora", f"a0={adapters['a0'][0]}",
                           "--max-loras", "2", "--lora-dir", str(root), "--dtype", "float32", "--max-concurrent-decodes", "4", "--max-length", "128",
                           "--prefill-lengths", "32", cache_dir=cache_dir).wait_ready()
    yield server
    assert server.stop() == 0


def completion(client, model, prompt):
    reply = client.completions.create(model=model, prompt=prompt, max_tokens=STEPS, temperature=0,
                                      extra_body={"ignore_eos": True})
    return reply.choices[0].text, reply.model


def text_of(server, ids) -> str:
    return server.post("/detokenize", json={"tokens": ids}).json()["prompt"]


def test_requests_select_adapters_by_model_name(server, lora_setup):
    _, torch_base, adapters = lora_setup
    client = client_for(server)
    prompt = np.random.default_rng(5).integers(0, 1000, 12).tolist()
    text, name = completion(client, "a0", prompt)
    assert name == "a0"
    assert text == text_of(server, peft_greedy(adapters["a0"][1], prompt, STEPS))
    assert completion(client, "base", prompt)[0] == text_of(server, peft_greedy(torch_base, prompt, STEPS)) != text
    models = {m.id: m for m in client.models.list().data}
    assert set(models) == {"base", "a0"} and models["a0"].parent == "base"
    # the Anthropic Messages API selects by model too
    claude = anthropic.Anthropic(base_url=server.base, api_key="unused", max_retries=0)
    message = claude.messages.create(model="a0", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert message.model == "a0" and message.usage.output_tokens >= 1


def test_the_dashboard_lists_the_resident_adapters(server):
    """Real Chromium on /dashboard: the base model's panel lists an adapter on the device, with its running
    requests."""
    from test_web import model_rows, start_chromium, wait

    completion(client_for(server), "a0", [1, 2, 3])  # a0 in a device slot
    driver = start_chromium()  # (skips where selenium or Chromium is missing)
    try:
        from selenium.webdriver.common.by import By

        driver.get(server.base + "/dashboard")
        chips = ".model-panel[data-model=base] .adapters .adapter[data-adapter=a0]"
        wait(driver, lambda d: [c.text for c in d.find_elements(By.CSS_SELECTOR, chips)] == ["a0 · 0 running"],
             timeout=20, message="adapter a0 in the base model's panel")
        assert model_rows(driver)["base"]["state"] == "loaded"
    finally:
        driver.quit()


def test_runtime_load_and_unload(server, lora_setup):
    _, _, adapters = lora_setup
    client = client_for(server)
    prompt = [5, 6, 7, 8, 9, 10]
    r = server.post("/v1/load_lora_adapter", json={"lora_name": "a1", "lora_path": str(adapters["a1"][0])})
    assert r.status_code == 200, r.text
    assert completion(client, "a1", prompt)[0] == text_of(server, peft_greedy(adapters["a1"][1], prompt, STEPS))
    assert "a1" in {m.id for m in client.models.list().data}
    metrics = server.get("/metrics").text  # its slot and the slot loads, per model
    assert 'vsurge:lora_adapter_running_requests{adapter="a1",model_name="base"} 0.0' in metrics
    assert [line for line in metrics.splitlines() if line.startswith('vsurge:lora_adapter_slot_loads_total{model_name="base"}')
            and float(line.split()[-1]) >= 1]
    assert server.post("/v1/unload_lora_adapter", json={"lora_name": "a1"}).status_code == 200
    with pytest.raises(openai.NotFoundError, match="a1"):
        client.completions.create(model="a1", prompt=prompt, max_tokens=2)
    r = server.post("/v1/unload_lora_adapter", json={"lora_name": "a1"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "lora_name"


@pytest.mark.parametrize("body, status, words", [
    ({"lora_name": "x", "lora_path": "nonexistent/adapter"}, 400, "not a directory"),
    ({"lora_name": "x", "lora_path": "/nonexistent/adapter"}, 400, "outside the server's --lora-dir"),
    ({"lora_name": "x", "lora_path": "../"}, 400, "outside the server's --lora-dir"),
    ({"lora_name": "base", "lora_path": "/tmp"}, 400, "a model's name"),
    ({"lora_name": "x"}, 400, "lora_path"),
])
def test_bad_loads_are_4xx_and_the_server_keeps_serving(server, body, status, words):
    r = server.post("/v1/load_lora_adapter", json=body)
    assert r.status_code == status and words in r.text, r.text
    assert client_for(server).completions.create(model="a0", prompt=[1, 2, 3], max_tokens=2).choices[0].text is not None


def test_an_adapter_config_that_is_not_utf8_is_a_400_and_the_connection_lives(server, lora_setup):
    """Issue 63: a non-UTF-8 adapter_config.json was a plain-text 500 that reset the keep-alive connection."""
    folder = lora_setup[0] / "latin1"
    folder.mkdir(exist_ok=True)
    (folder / "adapter_config.json").write_bytes(b'{"r": 8, "note": "caf\xe9"}')
    with httpx.Client(base_url=server.base, timeout=60) as keep_alive:
        r = keep_alive.post("/v1/load_lora_adapter", json={"lora_name": "latin1", "lora_path": "latin1"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "lora_path", r.text
        assert "not readable JSON" in r.json()["error"]["message"]
        assert keep_alive.get("/v1/models").status_code == 200  # the same connection answers on


def test_an_adapter_too_big_or_for_another_model_is_refused(server, lora_setup, default_processor_dir):
    tmp_path = lora_setup[0] / "refused"  # under --lora-dir
    wide = tmp_path / "wide_base"
    write_peft_adapter(wide, tmp_path / "wide", default_processor_dir, 4, seed=1, family="llama", base={"hidden_size": 96})
    r = server.post("/v1/load_lora_adapter", json={"lora_name": "wide", "lora_path": str(tmp_path / "wide")})
    assert r.status_code == 400 and "another base model" in r.json()["error"]["message"]
    write_peft_adapter(tmp_path / "b", tmp_path / "rank32", default_processor_dir, 32, seed=1, family="llama")
    r = server.post("/v1/load_lora_adapter", json={"lora_name": "big", "lora_path": str(tmp_path / "rank32")})
    assert r.status_code == 400 and "--max-lora-rank 16" in r.json()["error"]["message"]


def test_embeddings_for_an_adapter_say_so(server):
    r = server.post("/v1/embeddings", json={"model": "a0", "input": "hello"})
    assert r.status_code == 400 and "LoRA adapters" in r.json()["error"]["message"]


def test_generate_with_a_lora_from_the_command_line(lora_setup, default_model, tmp_path, cache_dir):
    """`vsurge generate --lora PATH` answers with the adapter's greedy tokens; a bad adapter exits naming it
    (through the CLI's main() in this process: it fails before compiling, where a `vsurge` start cost ~4 s)."""
    import json

    from cli_helpers import run_cli
    from vsurge.cli import main

    root, _, adapters = lora_setup
    text = "one two three four"
    out = run_cli("generate", "--model", str(root / "base"), "--lora", str(adapters["a1"][0]), "--dtype", "float32",
                  "--raw", "--json", "--temperature", "0", "--max-tokens", str(STEPS), text)
    assert out.returncode == 0, out.stderr
    ids = default_model[1].encode(text)
    tokens = json.loads(out.stdout)["tokens"]  # (it may end early at an end token; PEFT's reference runs on)
    assert tokens and tokens == peft_greedy(adapters["a1"][1], ids, STEPS)[:len(tokens)]
    assert "LoRA adapter" in out.stderr
    with pytest.raises(SystemExit) as bad:  # (the run's cache: main() points this process's JAX at it)
        main(["generate", "--model", str(root / "base"), "--lora", str(tmp_path), "--raw", "--max-tokens", "2",
              "--compilation-cache", cache_dir, "hi"])
    assert "vsurge: error: " in str(bad.value.code) and "no adapter_config.json" in str(bad.value.code)


def test_an_adapter_takes_its_base_models_sampling_defaults():
    """The server's defaults for unset sampling fields are the base model's for its adapters too."""
    from vsurge.lora.view import AdaptedSurge
    from vsurge.server.handlers import OpenAIHandlers

    class Server(OpenAIHandlers):
        surges = {"base": object()}
        generation_defaults = {"base": "the base's defaults"}

        def name_of(self, surge):
            return surge.adapter_name if isinstance(surge, AdaptedSurge) else "base"

    handlers = Server()
    assert handlers.defaults_for(AdaptedSurge(handlers.surges["base"], "a0")) == "the base's defaults"


SMALL_ENGINE = ("--max-concurrent-decodes", "2", "--max-length", "128", "--prefill-lengths", "32")


def test_enable_lora_on_the_default_model_starts_and_serves(cache_dir):
    """issue 63: `vsurge serve --enable-lora` on the default model (float32 activations beside its GGUF
    blocks; adapter stacks bfloat16 where the CPU multiplies it natively, lora/stacks.py) failed compiling
    ("cond branches must have equal output types ... bfloat16 vs float32", ops/lora.py) and sat at 503.
    The server compiles at the suite's XLA level (tests/xla_flags.py): it answers one request, and a type
    error of that kind is found when lowering, before any LLVM pass."""
    # one slot: the start compiles 7 programs, not 8 (no 2-row decode; each carries the adapters' ops alike):
    # 34.9 -> 25.8 s of compiling on a loaded 2-core machine
    one_slot = ("--max-concurrent-decodes", "1", *SMALL_ENGINE[2:])
    server = ServerProcess("default", "--enable-lora", *one_slot, cache_dir=cache_dir,
                           env={"XLA_FLAGS": xla_flags()}).wait_ready()
    try:
        reply = client_for(server).completions.create(model="SmolLM2-135M-Instruct", prompt="The capital of France is",
                                                      max_tokens=3, temperature=0)
        assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 3
    finally:
        assert server.stop() == 0


def test_enable_lora_in_bfloat16_compiles_and_generates():
    """The same start-up with `--dtype bfloat16` (activations and adapter stacks then share a dtype), in
    this process: the engine those flags configure (the CLI's own parser and EngineConfig flags, the LoRA
    slots cmd_serve gives `--enable-lora`, the paged engine) compiles its prompt and decode steps, the
    programs that carry the adapters' ops, on first use and generates. A second server process for it cost
    ~30 s; the served path is the float32 test's."""
    import asyncio

    from vsurge import EngineConfig, SamplingParams, load, vSurge
    from vsurge.cli import build_parser

    args = build_parser().parse_args(["serve", "--model", "default", "--enable-lora", "--dtype", "bfloat16",
                                      *SMALL_ENGINE])
    model, processor = load(args.model[0], dtype=args.dtype, progress=False)
    settings = EngineConfig.flag_values(args)
    settings["max_loras"] = settings.get("max_loras") or 4  # what cmd_serve gives --enable-lora
    config = EngineConfig.fitted(model.config.max_position_embeddings, **settings)
    surge = vSurge.from_config(model, processor, config, paged=args.engine == "paged")
    engine = surge.driver.engines[0]
    assert engine.adapters is not None  # LoRA slots in the model the programs compile
    surge.start()
    try:
        (out,) = asyncio.run(surge.generate(["The capital of France is"], SamplingParams(max_tokens=3, temperature=0)))
    finally:
        surge.stop(5)
    assert out.finish_reason == "length" and len(out.token_ids) == 3
    assert {key[0] for key in engine._compiled} >= {"mixed", "decode"}
