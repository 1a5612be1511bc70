"""Sampling defaults: vsurge's, the model's (generation_config.json, GGUF general.sampling.*), a file's,
and how explicit values (CLI flags, OpenAI fields) win over them. No model weights are read."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest

from vsurge.errors import ModelLoadError
from vsurge.loading.generation_config import resolve_generation_defaults
from vsurge.sampling.defaults import OPENAI_DEFAULTS, VSURGE_DEFAULTS, GenerationDefaults
from vsurge.server.adapters.chat import ChatCompletionRequest
from vsurge.server.adapters.common import sampling_params
from vsurge.server.adapters.completions import CompletionRequest

HI = [{"role": "user", "content": "hi"}]


def test_vsurge_defaults_sample_like_llama_cpp():
    params = VSURGE_DEFAULTS.sampling_params()
    assert (params.temperature, params.top_k, params.top_p, params.min_p) == (0.8, 40, 0.95, 0.05)
    assert params.repetition_penalty == 1.1 and not params.greedy


def test_explicit_values_win_and_temperature_zero_is_plain_greedy():
    params = VSURGE_DEFAULTS.sampling_params(temperature=0.5, top_k=None, seed=3, max_tokens=9)
    assert (params.temperature, params.top_k, params.seed, params.max_tokens) == (0.5, 40, 3, 9)
    greedy = VSURGE_DEFAULTS.sampling_params(temperature=0)
    assert greedy.greedy and greedy.repetition_penalty == 1.0  # argmax of the model's own logits
    assert VSURGE_DEFAULTS.sampling_params(temperature=0, repetition_penalty=1.3).repetition_penalty == 1.3


def test_auto_reads_an_hf_directorys_generation_config(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "max_new_tokens": 300, "eos_token_id": 2}))
    auto = resolve_generation_defaults("auto", tmp_path)
    assert (auto.temperature, auto.top_p, auto.max_tokens) == (0.6, 0.9, 300)
    assert (auto.top_k, auto.min_p, auto.repetition_penalty) == (40, 0.05, 1.1)  # the rest: vsurge's
    assert "generation_config.json" in auto.source
    assert resolve_generation_defaults("vsurge", tmp_path) == VSURGE_DEFAULTS


def test_auto_without_sampling_keys_is_vsurge(tmp_path):
    assert resolve_generation_defaults("auto", tmp_path) == VSURGE_DEFAULTS  # no generation_config.json
    (tmp_path / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    assert resolve_generation_defaults("auto", tmp_path) == VSURGE_DEFAULTS


def test_auto_reads_gguf_sampling_keys(tmp_path):
    path = tmp_path / "sampling.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_float32(gguf.Keys.General.SAMPLING_TEMP, 0.3)
    writer.add_int32(gguf.Keys.General.SAMPLING_TOP_K, 20)
    writer.add_float32(gguf.Keys.General.SAMPLING_PENALTY_REPEAT, 1.0)
    writer.add_tensor("dummy", np.zeros(4, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    auto = resolve_generation_defaults("auto", path)
    assert (auto.temperature, auto.top_k, auto.repetition_penalty, auto.top_p) == (
        pytest.approx(0.3), 20, 1.0, 0.95)
    assert "general.sampling" in auto.source


def test_a_path_chooses_a_file_and_bad_values_name_it(tmp_path):
    good = tmp_path / "mine.json"
    good.write_text(json.dumps({"temperature": 0.2, "top_k": -1}))
    chosen = resolve_generation_defaults(str(good), None)
    assert (chosen.temperature, chosen.top_k) == (0.2, 0)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"top_p": 2}))
    with pytest.raises(ValueError, match="bad.json.*top_p"):
        resolve_generation_defaults(str(bad), None)
    with pytest.raises(ModelLoadError, match="missing"):
        resolve_generation_defaults(str(tmp_path / "absent.json"), None)


def test_server_fills_only_the_fields_a_request_leaves_unset():
    defaults = GenerationDefaults(temperature=0.7, top_k=30, max_tokens=None)
    unset = sampling_params(ChatCompletionRequest(messages=HI), defaults)
    assert (unset.temperature, unset.top_k, unset.top_p, unset.repetition_penalty) == (0.7, 30, 0.95, 1.1)
    explicit = sampling_params(ChatCompletionRequest(messages=HI, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0,
                                                     repetition_penalty=1.0), defaults)
    assert (explicit.temperature, explicit.top_p, explicit.top_k, explicit.min_p,
            explicit.repetition_penalty) == (1.0, 1.0, 0, 0.0, 1.0)
    greedy = sampling_params(ChatCompletionRequest(messages=HI, temperature=0), defaults)
    assert greedy.greedy and greedy.repetition_penalty == 1.0


def test_server_without_defaults_keeps_openais():
    params = sampling_params(CompletionRequest(prompt="hi"), None, max_tokens=16)
    expected = OPENAI_DEFAULTS
    assert (params.temperature, params.top_p, params.top_k, params.min_p, params.repetition_penalty) == (
        expected.temperature, expected.top_p, expected.top_k, expected.min_p, expected.repetition_penalty) == (
        1.0, 1.0, 0, 0.0, 1.0)


def test_the_server_gives_unset_fields_its_generation_defaults():
    """Through the real HTTP app and driver (a mock engine records what each request samples with)."""
    from fastapi.testclient import TestClient
    from mock_engine import MockEngine

    from vsurge import vDriver
    from vsurge.server import vSurgeApiServer
    from vsurge import vSurge

    seen = []

    class RecordingEngine(MockEngine):
        def step(self, state, plan, *masks):  # masks: structured outputs, none here
            seen.extend(seq.request.params for seq in plan.sequences)
            return super().step(state, plan)

    surge = vSurge(vDriver(RecordingEngine()), vsurge_name="mock")
    surge.start()
    try:
        server = vSurgeApiServer({"mock": surge})
        server.generation_defaults = {"mock": GenerationDefaults(temperature=0.3, top_k=7, max_tokens=2)}
        client = TestClient(server.app)
        assert client.post("/v1/completions", json={"prompt": "abc"}).status_code == 200
        unset = seen[-1]
        assert (unset.temperature, unset.top_k, unset.repetition_penalty, unset.max_tokens) == (0.3, 7, 1.1, 2)
        body = {"prompt": "abc", "temperature": 1.0, "top_k": 0, "repetition_penalty": 1.0, "max_tokens": 3}
        assert client.post("/v1/completions", json=body).status_code == 200
        explicit = seen[-1]
        assert (explicit.temperature, explicit.top_k, explicit.repetition_penalty, explicit.max_tokens) == (
            1.0, 0, 1.0, 3)
        server.generation_defaults = None  # a server built in Python without them: OpenAI's defaults
        assert client.post("/v1/completions", json={"prompt": "abc"}).status_code == 200
        openai = seen[-1]
        assert (openai.temperature, openai.top_k, openai.repetition_penalty, openai.max_tokens) == (1.0, 0, 1.0, 16)
    finally:
        surge.stop(timeout=1)


def test_auto_gives_the_default_model_the_settings_vsurge_ships(default_gguf_path, tmp_path):
    """The embedded model's GGUF sets no sampling keys; vsurge ships settings for it (benchmarks/
    first_answers.py: greedy with a 1.2 repetition penalty, its authors' top_p), the rest stay vsurge's."""
    auto = resolve_generation_defaults("auto", default_gguf_path)
    assert (auto.temperature, auto.top_p, auto.repetition_penalty) == (0.0, 0.9, 1.2)
    assert (auto.top_k, auto.min_p) == (40, 0.05)
    params = auto.sampling_params()
    assert params.greedy and params.repetition_penalty == 1.2  # the penalty stays: greedy alone loops
    assert "default model" in auto.source
    assert resolve_generation_defaults("vsurge", default_gguf_path) == VSURGE_DEFAULTS
    copy = tmp_path / default_gguf_path.name  # the same file elsewhere is any GGUF: its own keys only
    copy.write_bytes(default_gguf_path.read_bytes())
    assert resolve_generation_defaults("auto", copy) == VSURGE_DEFAULTS
