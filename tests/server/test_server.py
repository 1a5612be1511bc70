"""The real `vsurge serve` process on loopback, driven by the official openai client and raw HTTP."""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

from server_process import DEFAULT_NAME, ServerProcess, client_for
from tiny_models import write_tiny_model

TINY_NAME = "tiny"
API_KEY = "sk-test-123"
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
# the tiny model's engine in every server of this file that can share it: the first start compiles its
# programs into the run's cache, the later one (step failure) loads them (~16 s less); 8 slots, not 16: one
# decode row bucket fewer to compile (the 64 streams queue either way)
TINY_ENGINE = ("--max-concurrent-decodes", "8", "--max-length", "128", "--max-prefill-length", "64",
               "--prefill-lengths", "64")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, default_processor_dir):
    folder = tmp_path_factory.mktemp("tiny_server_model")
    write_tiny_model("llama", folder, default_processor_dir)
    return folder


@pytest.fixture(scope="module")
def tiny_server(tiny_dir, cache_dir):
    """Ended by its last test, test_sigterm_drains_in_flight_requests (SIGTERM: it exits 0)."""
    server = ServerProcess(str(tiny_dir), "--served-model-name", TINY_NAME, "--api-key", API_KEY, *TINY_ENGINE,
                           "--max-queue", "128", cache_dir=cache_dir).wait_ready()
    yield server
    assert server.stop() == 0


# ---------------------------------------------------------------- the default model, through openai
def test_chat_whole_and_streamed(default_server):
    client = client_for(default_server)
    whole = client.chat.completions.create(model=DEFAULT_NAME, messages=FRANCE, temperature=0)
    assert whole.choices[0].message.content == "The capital of France is Paris."
    assert whole.choices[0].finish_reason == "stop"
    assert whole.usage.prompt_tokens == 37 and whole.usage.completion_tokens == 8
    assert whole.usage.total_tokens == 45
    chunks = list(client.chat.completions.create(model=DEFAULT_NAME, messages=FRANCE, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8


def test_completions_prompt_forms_and_echo(default_server):
    client = client_for(default_server)
    one = client.completions.create(model=DEFAULT_NAME, prompt="The capital of France is", max_tokens=3,
                                    temperature=0)
    assert "Paris" in one.choices[0].text and one.choices[0].finish_reason == "length"
    ids = default_server.post("/tokenize", json={"prompt": "The capital of France is"}).json()["tokens"]
    by_ids = client.completions.create(model=DEFAULT_NAME, prompt=ids, max_tokens=3, temperature=0)
    assert by_ids.choices[0].text == one.choices[0].text
    many = client.completions.create(model=DEFAULT_NAME, prompt=["The capital of France is", "Hello"],
                                     max_tokens=3, temperature=0)
    assert [c.index for c in many.choices] == [0, 1] and many.choices[0].text == one.choices[0].text
    many_ids = client.completions.create(model=DEFAULT_NAME, prompt=[ids, ids], max_tokens=3, temperature=0)
    assert [c.text for c in many_ids.choices] == [one.choices[0].text] * 2
    echo = client.completions.create(model=DEFAULT_NAME, prompt="The capital of France is", max_tokens=3,
                                     temperature=0, echo=True)
    assert echo.choices[0].text == "The capital of France is" + one.choices[0].text


def test_n_choices_stream_each_finish_once(default_server):
    client = client_for(default_server)
    chunks = list(client.chat.completions.create(model=DEFAULT_NAME, messages=FRANCE, n=2, temperature=0.8,
                                                 seed=3, max_tokens=12, stream=True))
    finishes = {}
    for c in chunks:
        for choice in c.choices:
            if choice.finish_reason:
                finishes[choice.index] = finishes.get(choice.index, 0) + 1
    assert finishes == {0: 1, 1: 1}
    whole = client.chat.completions.create(model=DEFAULT_NAME, messages=FRANCE, n=2, max_tokens=12, seed=3,
                                           temperature=0.8)
    assert [c.index for c in whole.choices] == [0, 1]


def test_stop_seed_and_logprobs(default_server):
    client = client_for(default_server)
    stopped = client.chat.completions.create(model=DEFAULT_NAME, messages=FRANCE, temperature=0, stop=["Paris"])
    assert stopped.choices[0].message.content == "The capital of France is "
    assert stopped.choices[0].finish_reason == "stop"
    a = client.chat.completions.create(model=DEFAULT_NAME, messages=FRANCE, temperature=1.0, seed=7, max_tokens=20)
    b = client.chat.completions.create(model=DEFAULT_NAME, messages=FRANCE, temperature=1.0, seed=7, max_tokens=20)
    assert a.choices[0].message.content == b.choices[0].message.content
    lp = client.chat.completions.create(model=DEFAULT_NAME, messages=FRANCE, temperature=0, logprobs=True,
                                        top_logprobs=3, max_tokens=4)
    content = lp.choices[0].logprobs.content
    assert [c.token for c in content] == ["The", " capital", " of", " France"]
    assert all(len(c.top_logprobs) == 3 and c.top_logprobs[0].token == c.token for c in content)
    assert all(c.logprob <= 0 and abs(c.logprob - c.top_logprobs[0].logprob) < 1e-5 for c in content)
    comp = client.completions.create(model=DEFAULT_NAME, prompt="The capital of France is", max_tokens=2,
                                     temperature=0, logprobs=2)
    assert comp.choices[0].logprobs.tokens[0] == " Paris" and len(comp.choices[0].logprobs.top_logprobs[0]) == 2


def test_models_tokenize_count(default_server):
    models = client_for(default_server).models.list()
    assert [m.id for m in models.data] == [DEFAULT_NAME]
    tok = default_server.post("/tokenize", json={"messages": FRANCE}).json()
    assert tok["count"] == 37 and tok["max_model_len"] == 512
    assert default_server.post("/detokenize", json={"tokens": tok["tokens"][-4:]}).json()["prompt"] == \
        "<|im_start|>assistant\n"
    assert default_server.post("/v1/count_tokens", json={"messages": FRANCE}).json()["count"] == 37
    assert default_server.get("/health").json()["status"] == "ok"
    assert default_server.get("/liveness").status_code == 200


def test_the_start_up_line_says_how_big_the_kv_pool_is_and_why(default_server):
    """Issue 38: on CPU the default pool holds what the defaults can use (every slot at its full
    length: 8 x 512 tokens here), not a share of the machine's free memory, and says so."""
    assert "Paged KV cache: 32 pages of 128 tokens (4096 tokens, " in default_server.output
    assert ("sized for every one of the 8 slots at its full 512 tokens (--max-concurrent-decodes x --max-length): "
            "all the defaults can use, though the memory holds more") in default_server.output


# ---------------------------------------------------------------- errors and bad input
BAD_BODIES = [
    ({"model": "nope", "messages": FRANCE}, 404, "The model `nope` does not exist."),
    ({"messages": FRANCE, "max_tokens": 500}, 400, "maximum context length is 512 tokens. However, you requested "
                                                   "500 output tokens and your prompt contains 37 input tokens"),
    ({"messages": FRANCE, "temperature": -1}, 400, "temperature"),
    ({"messages": FRANCE, "top_p": 0}, 400, "top_p"),
    ({"messages": FRANCE, "top_k": -5}, 400, "top_k"),
    ({"messages": FRANCE, "max_tokens": 0}, 400, "max_tokens"),
    ({"messages": FRANCE, "max_tokens": "ten"}, 400, "max_tokens"),
    ({"messages": []}, 400, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, "role"),
    ({"messages": FRANCE, "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ({"messages": FRANCE, "functions": [{"name": "f"}]}, 400, "'functions' is not supported"),
    ({"messages": FRANCE, "tools": [{"type": "function"}]}, 400, "tools[0].function"),
    ({"messages": FRANCE, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"type": "nonsense"}}}}}}, 400, "invalid JSON schema"),
    ({"messages": FRANCE, "guided_regex": "(unclosed"}, 400, "regex"),
    ({"messages": FRANCE, "tool_choice": {"type": "function", "function": {"name": "nope"}},
      "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]},
     400, "nope"),
    ({"messages": FRANCE, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs"),
    ({"messages": FRANCE, "seed": 2**70}, 400, "seed"),
    ({"messages": FRANCE, "stop": [""]}, 400, "stop cannot contain an empty string"),
    ({"messages": FRANCE, "logit_bias": {"99999999": 5}}, 400, "logit_bias"),
    ({"messages": FRANCE, "n": 1000}, 400, "n"),
    ({"messages": FRANCE, "priority": 1}, 400, "--scheduling-policy priority"),
    ({"messages": FRANCE, "prompt_logprobs": 1}, 400, "prompt_logprobs are served by /v1/completions"),
]


@pytest.mark.parametrize("body,status,message", BAD_BODIES)
def test_bad_chat_requests_get_openai_errors(default_server, body, status, message):
    r = default_server.post("/v1/chat/completions", json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert message in error["message"] and error["type"] == "invalid_request_error"
    assert error["code"] is None or isinstance(error["code"], str)  # OpenAI's spec: a string or null


def test_lone_surrogates_are_refused_in_valid_json(default_server):
    """A client string with a lone UTF-16 surrogate (valid JSON text, not valid Unicode) is a 400 naming
    the field, in any field, before it can reach a tokenizer (tests/server/test_conformance_requests.py)."""
    for body, param in (({"model": "\ud800bad", "messages": FRANCE}, "model"),
                        ({"messages": FRANCE, "response_format": {"type": "\udfff"}}, "response_format.type")):
        r = default_server.post("/v1/chat/completions", content=json.dumps(body).encode("ascii"),
                                headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == param and "lone UTF-16 surrogate" in error["message"]


def test_raw_garbage_then_a_good_request(default_server):
    post = default_server.post
    cases = [
        post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}),
        post("/v1/chat/completions", content=b'{"messages": "\xff\xfe"}', headers={"content-type":
                                                                                    "application/json"}),
        post("/v1/chat/completions", content=b"x" * (65 * 1024 * 1024), headers={"content-type": "application/json"}),
        post("/v1/completions", json={"prompt": [10**9], "max_tokens": 2}),
        post("/v1/completions", json={"prompt": "", "max_tokens": 2}),
        post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "echo": True, "logprobs": 1}),  # now served
        post("/detokenize", json={"tokens": [10**8]}),
        post("/v1/responses", content=b"{not json", headers={"content-type": "application/json"}),
        post("/v1/messages", content=b"x" * (65 * 1024 * 1024), headers={"content-type": "application/json"}),
        post("/v1/embeddings", json={"input": [[1, 2], "mixed"]}),
    ]
    assert [c.status_code for c in cases] == [400, 400, 413, 400, 400, 200, 400, 400, 413, 400]
    assert all("error" in c.json() for c in cases if c.status_code != 200)
    assert cases[8].json()["type"] == "error"  # /v1/messages answers in Anthropic's shape, even before routing
    ok = client_for(default_server).chat.completions.create(model=DEFAULT_NAME, messages=FRANCE, temperature=0)
    assert ok.choices[0].message.content == "The capital of France is Paris."


def test_openai_client_raises_typed_errors(default_server):
    client = client_for(default_server)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="missing", messages=FRANCE)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model=DEFAULT_NAME, messages=FRANCE, temperature=-2)


# issue 63: each of these reached the engine thread as an int32/float32 overflow and left the server at 503
ENGINE_RANGE_BODIES = [
    ({"top_k": 2**31}, None), ({"top_k": 10**12}, None), ({"top_k": 10**30}, None),
    ({"stop_token_ids": [2**40]}, "stop_token_ids"), ({"stop_token_ids": [10**8]}, "stop_token_ids"),
    ({"temperature": 1e300}, "temperature"), ({"logit_bias": {str(2**40): 1}}, "logit_bias"),
    ({"seed": 2**64}, "seed"), ({"max_tokens": 2**31}, "max_tokens"),
]


def test_numbers_beyond_the_engine_answer_200_or_400_and_the_server_stays_ready(default_server):
    """top_k beyond the vocabulary clamps (200, as vLLM and llama.cpp); a value the engine cannot hold is a
    400 naming its field. Either way the server stays ready and answers the next request."""
    for extra, param in ENGINE_RANGE_BODIES:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra}
        r = default_server.post("/v1/chat/completions", json=body)
        if param is None:
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1, (extra, r.text)
        else:
            assert r.status_code == 400 and r.json()["error"]["param"] == param, (extra, r.text)
        assert default_server.get("/readiness").status_code == 200, extra
    ok = client_for(default_server).chat.completions.create(model=DEFAULT_NAME, messages=FRANCE, temperature=0)
    assert ok.choices[0].message.content == "The capital of France is Paris."


# ---------------------------------------------------------------- tiny model: load, keys, protocol fuzzing
def test_api_key_is_required(tiny_server):
    r = tiny_server.post("/v1/chat/completions", json={"messages": FRANCE})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert r.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        client_for(tiny_server, api_key="wrong").models.list()
    assert client_for(tiny_server, api_key=API_KEY).models.list().data[0].id == TINY_NAME
    assert tiny_server.get("/readiness").status_code == 200  # a public route: no key needed
    for path in ("/tokenize", "/detokenize"):  # guarded though not under /v1/ (issue 63)
        r = tiny_server.post(path, json={"prompt": "hi", "tokens": [1]})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", path
    # Anthropic's clients send x-api-key; errors on /v1/messages are Anthropic's JSON
    import anthropic

    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=tiny_server.base, api_key="wrong", max_retries=0).messages.count_tokens(
            model=TINY_NAME, messages=FRANCE)
    r = tiny_server.post("/v1/messages/count_tokens", json={"messages": FRANCE})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    claude = anthropic.Anthropic(base_url=tiny_server.base, api_key=API_KEY, max_retries=0)
    assert claude.messages.count_tokens(model=TINY_NAME, messages=FRANCE).input_tokens > 0
    assert tiny_server.get("/v1/models", headers={"x-api-key": API_KEY}).status_code == 200


def test_64_concurrent_streams_all_complete_and_metrics_agree(tiny_server):
    client = client_for(tiny_server, api_key=API_KEY)
    before_tokens = tiny_server.metric("vsurge:generation_tokens_total")
    before_requests = tiny_server.metric("vsurge:request_success_total")

    def one(i):
        chunks = list(client.completions.create(model=TINY_NAME, prompt=f"request {i}", max_tokens=12,
                                                temperature=0.5, seed=i, stream=True,
                                                stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        return finishes, chunks[-1].usage.completion_tokens, "".join(c.choices[0].text for c in chunks if c.choices)

    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        results = list(pool.map(one, range(64)))
    assert all(f == ["length"] and n == 12 for f, n, _ in results)
    assert tiny_server.metric("vsurge:generation_tokens_total") - before_tokens == 64 * 12
    assert tiny_server.metric("vsurge:request_success_total") - before_requests == 64
    # each stream's text is what the same seeded request returns whole: nothing lost or duplicated
    whole = client.completions.create(model=TINY_NAME, prompt="request 5", max_tokens=12, temperature=0.5, seed=5,
                                      extra_body={"ignore_eos": True})
    assert whole.choices[0].text == results[5][2]


def test_dropped_clients_free_their_slots(tiny_server):
    headers = {"Authorization": f"Bearer {API_KEY}"}
    body = {"model": TINY_NAME, "prompt": "go", "max_tokens": 120, "stream": True, "ignore_eos": True}

    def drop_after_two_chunks(_):
        with httpx.stream("POST", tiny_server.base + "/v1/completions", json=body, headers=headers,
                          timeout=60) as r:
            for i, _line in enumerate(r.iter_lines()):
                if i >= 4:
                    return True  # leaving the block closes the connection mid-stream
        return False

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        assert all(pool.map(drop_after_two_chunks, range(16)))
    deadline = time.time() + 10
    while time.time() < deadline and tiny_server.metric("vsurge:num_requests_running") > 0:
        time.sleep(0.1)
    assert tiny_server.metric("vsurge:num_requests_running") == 0
    ok = client_for(tiny_server, api_key=API_KEY).completions.create(model=TINY_NAME, prompt="hi", max_tokens=3)
    assert ok.choices[0].finish_reason in ("length", "stop")


def test_prometheus_port_serves_the_same_metrics(tiny_server):
    r = httpx.get(f"http://127.0.0.1:{tiny_server.metrics_port}/metrics", timeout=10)
    assert r.status_code == 200 and "vsurge:time_to_first_token_seconds" in r.text


def test_schemathesis_finds_no_server_errors(tiny_server):
    out = subprocess.run(
        [sys.executable, "-m", "schemathesis.cli", "run", tiny_server.base + "/openapi.json", "--checks",
         "not_a_server_error", "--max-examples", "3", "--header", f"Authorization: Bearer {API_KEY}",
         "--generation-deterministic", "--request-timeout", "30", "--exclude-path", "/metrics"],
        capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_openai_spec_fuzz_finds_no_server_errors_and_the_server_serves_on(tiny_server):
    """OpenAI's own spec (the vendored subset, tests/data/openapi/openai_subset.json) through schemathesis, valid
    and invalid bodies, bounded to 15 s: no 5xx, and the server is ready and answers afterwards (issue 63).
    (--max-time is a budget that fuzzing and stateful testing repeat to fill: at 30 s every operation and phase
    ran as at 15 s, only more random cases of them; alone, the coverage phase's negative bodies run ~27 s, 82%
    of them the Responses API's nested tools and items.)"""
    from pathlib import Path

    spec = Path(__file__).parents[1] / "data" / "openapi" / "openai_subset.json"
    out = subprocess.run(
        [sys.executable, "-m", "schemathesis.cli", "run", str(spec), "--url", tiny_server.base + "/v1",
         "--checks", "not_a_server_error", "--mode", "all", "--max-examples", "5", "--max-time", "15",
         "--header", f"Authorization: Bearer {API_KEY}", "--generation-deterministic", "--request-timeout", "30"],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert tiny_server.get("/readiness").status_code == 200
    ok = client_for(tiny_server, api_key=API_KEY).completions.create(model=TINY_NAME, prompt="hi", max_tokens=2)
    assert ok.choices[0].finish_reason in ("length", "stop")


# ---------------------------------------------------------------- TLS and draining
def test_sigterm_drains_in_flight_requests(tiny_server):
    """The module's tiny server, after its last other test (a server of its own cost ~6 s): SIGTERM while a
    stream runs; the stream ends whole and the process exits 0 (the fixture's stop() then finds it so)."""
    server = tiny_server
    received = {}

    def long_stream():
        body = {"model": TINY_NAME, "prompt": "go", "max_tokens": 60, "stream": True, "ignore_eos": True}
        lines = []
        with httpx.stream("POST", server.base + "/v1/completions", json=body, timeout=60,
                          headers={"Authorization": f"Bearer {API_KEY}"}) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    lines.append(line)
        received["lines"] = lines

    thread = threading.Thread(target=long_stream)
    thread.start()
    time.sleep(1.0)
    server.proc.send_signal(15)
    readiness = None
    for _ in range(20):
        try:
            readiness = httpx.get(server.base + "/readiness", timeout=1).status_code
            break
        except httpx.HTTPError:  # uvicorn may already refuse new connections
            readiness = "refused"
            break
    thread.join(timeout=60)
    assert server.proc.wait(timeout=60) == 0
    assert readiness in (503, "refused")
    lines = received["lines"]
    assert lines[-1] == "data: [DONE]"
    finals = [json.loads(x[6:])["choices"][0]["finish_reason"] for x in lines[:-1]]
    assert finals.count("length") == 1  # the in-flight request finished completely


COMPILE_FAILS = """
import vsurge.engine.core as core
def compile(self, progress=True):
    raise RuntimeError("injected compile failure")
core.EngineCore.compile = compile
"""
# the device step itself fails (no request to blame: engine/faults.py) once a request with seed 666 runs
DEVICE_STEP_FAILS = """
import vsurge.engine.core as core
step = core.EngineCore.step
def failing_step(self, state, plan, *args, **kwargs):
    if any(s.request.params.seed == 666 for s in plan.sequences):
        raise RuntimeError("injected device step failure")
    return step(self, state, plan, *args, **kwargs)
core.EngineCore.step = failing_step
"""


def test_a_failed_start_up_exits_non_zero_promptly(tiny_dir, cache_dir, tmp_path):
    """issue 63: a server whose start-up failed logged why and then sat at /readiness 503 for good."""
    missing = ServerProcess(str(tmp_path / "no-such-model"), cache_dir=cache_dir)
    assert missing.proc.wait(timeout=60) != 0 and "no-such-model" in missing.output
    server = ServerProcess(str(tiny_dir), "--max-length", "128", cache_dir=cache_dir, preamble=COMPILE_FAILS)
    assert server.proc.wait(timeout=120) == 1, server.output[-3000:]
    assert "start-up failed" in server.output and "injected compile failure" in server.output


def test_a_failed_device_step_fails_its_requests_and_exits_non_zero(tiny_dir, cache_dir):
    """Only the device step's own failure takes the engine down, and then the process exits 1 (a
    service manager restarts it) instead of answering 503 for good."""
    server = ServerProcess(str(tiny_dir), "--served-model-name", TINY_NAME, *TINY_ENGINE, cache_dir=cache_dir,
                           preamble=DEVICE_STEP_FAILS).wait_ready()
    body = {"model": TINY_NAME, "prompt": "hi", "max_tokens": 4}
    assert server.post("/v1/completions", json=body).status_code == 200
    r = server.post("/v1/completions", json={**body, "seed": 666})
    assert r.status_code == 500 and "injected device step failure" in r.json()["error"]["message"]
    assert server.proc.wait(timeout=60) == 1, server.output[-3000:]
    assert "a model's engine failed" in server.output


def test_paged_engine_over_tls_through_openai(tiny_dir, cache_dir, tmp_path):
    """`vsurge serve --engine paged` over HTTPS with a self-signed certificate made here: concurrent
    streams, whole == streamed, prefix-cache and KV metrics. (One process covers both features; 4 slots, not 8:
    one decode program fewer to compile, and the 16 streams still share them.)"""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    server = ServerProcess(str(tiny_dir), "--served-model-name", TINY_NAME, "--engine", "paged", "--page-size", "16",
                           "--num-pages", "24", "--max-concurrent-decodes", "4", "--max-length", "128",
                           "--prefill-lengths", "32", "--ssl-keyfile", str(key),
                           "--ssl-certfile", str(cert), cache_dir=cache_dir, scheme="https",
                           verify=str(cert)).wait_ready()
    try:
        assert "Paged KV cache: 24 pages of 16 tokens (384 tokens, " in server.output  # then MiB and pages per GiB
        assert "pages per GiB); sized as asked (--num-pages)" in server.output
        with pytest.raises(httpx.ConnectError):
            httpx.get(server.base + "/health", verify=True)  # not trusted without the certificate
        client = client_for(server, http_client=httpx.Client(verify=str(cert)))
        prompt = "a shared instruction that every request repeats word for word, " * 4

        def one(i):
            chunks = client.completions.create(model=TINY_NAME, prompt=prompt + str(i), max_tokens=16,
                                               temperature=0.0, stream=True, extra_body={"ignore_eos": True})
            return "".join(c.choices[0].text for c in chunks if c.choices)

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            streamed = list(pool.map(one, range(16)))
        whole = client.completions.create(model=TINY_NAME, prompt=prompt + "3", max_tokens=16, temperature=0.0,
                                          extra_body={"ignore_eos": True})
        assert whole.choices[0].text == streamed[3] and whole.usage.completion_tokens == 16
        assert server.metric("vsurge:prefix_cache_hits_total") > 0
        assert "vsurge:kv_cache_usage_perc{" in server.get("/metrics").text
        assert 0 <= server.metric("vsurge:kv_cache_usage_perc") <= 1
        # the client's pool still holds idle TLS connections: SIGTERM must not wait for their close_notify
        # (asyncio's 30 s TLS shutdown timeout held every stop here)
        started = time.monotonic()
        assert server.stop() == 0
        assert time.monotonic() - started < 10
    finally:
        server.stop()
