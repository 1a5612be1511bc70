"""vsurge replicas on Ray Serve (src/vsurge/scale/ray_serve/): one local Ray cluster for the module (2 CPUs),
two replicas of a tiny checkpoint behind the ingress, the real `openai` SDK as the client.

Skipped when Ray is not installed (`pip install 'vsurge[ray]'`).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

import httpx  # noqa: E402
import openai  # noqa: E402

from server_process import ENV, free_port  # noqa: E402

SERVE_FLAGS = ("--max-concurrent-decodes", "4", "--max-length", "1024", "--prefill-lengths", "64,128",
               "--max-queue", "64")
# streams in the kill test: half a replica's 4 slots, so the preamble's replica is not overloaded by them alone and
# takes non-streamed requests too (with 4 the router sent those elsewhere, and the kill found no replica holding
# both kinds: a CI run)
STREAMS = 2
# their length: long enough that the replica is still generating them when the test reads its stats, however fast
# the machine (at 100 tokens a CI run found both already finished: no replica to kill holding streams)
STREAM_TOKENS = 800
PREAMBLE = ("You are the assistant of a small bakery. The bakery opens at seven, sells rye and wheat bread, "
            "croissants on weekends, and closes at six. Answer in one short sentence, politely, and never "
            "invent prices. Orders above ten loaves need a day's notice, and gifts go out on Fridays. ")
# (~330 characters: 5 routing blocks of 64, prefixes.py; the router wants 4 shared)


def _args(model: Path, cache: str):
    from vsurge.cli.arguments import build_parser

    return build_parser().parse_args(["serve", "--model", str(model), "--compilation-cache", cache, *SERVE_FLAGS])


@pytest.fixture(scope="module")
def ray_app(tmp_path_factory, default_processor_dir, cache_dir):
    """The application on a 2-CPU local cluster: base URL; the module's one cluster, shut down after."""
    from tiny_models import write_tiny_model
    from vsurge.scale.ray_serve.app import APP_NAME, vsurge_application

    import vsurge

    src = str(Path(vsurge.__file__).parents[1])
    env = {k: ENV[k] for k in ("HF_HUB_OFFLINE", "JAX_PLATFORMS", "XLA_FLAGS") if k in ENV}
    env["PYTHONPATH"] = os.pathsep.join([src, *sys.path[1:]])  # the replicas import this checkout's vsurge
    # replicas push their autoscaling stats every 0.5 s, not Serve's 10 (the autoscaling test's bounded time;
    # Ray 2.60 reads the deployment's metrics_interval_s instead: the test sets both)
    env["RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S"] = "0.5"
    os.environ["RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S"] = "0.5"
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": env}, logging_level="WARNING")
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    # the tiny llama with a context of 1024 (not 256): the kill test's streams outlast the test's reading of stats
    model = tmp_path_factory.mktemp("tiny_llama_1024")
    torch_model = write_tiny_model("llama", model, default_processor_dir, max_position_embeddings=1024)
    serve.run(vsurge_application(_args(model, cache_dir), replicas=2, stats_period_s=0.2), name=APP_NAME,
              route_prefix="/")
    base = f"http://127.0.0.1:{port}"
    name = httpx.get(base + "/v1/models", timeout=30).json()["data"][0]["id"]
    yield {"base": base, "model": model, "name": name, "torch_model": torch_model}
    ray.shutdown()  # the cluster ends with its Serve controller and replicas (serve.shutdown's drain took ~5 s)


def _client(ray_app, timeout=120.0):
    return openai.OpenAI(base_url=ray_app["base"] + "/v1", api_key="unused", max_retries=0, timeout=timeout)


def _replicas() -> dict:
    """Each live replica actor's routing stats (what it reports to the router), by actor name."""
    from vsurge.scale.ray_serve.cluster_metrics import replica_actors

    out = {}
    for name, handle in replica_actors():
        try:
            out[name] = (handle, ray.get(handle.record_routing_stats.remote(), timeout=10))
        except ray.exceptions.RayError:
            continue  # gone, or not started yet
    return out


def _chat(client, name, content, max_tokens=8, **kw):
    reply = client.chat.completions.create(model=name, messages=[{"role": "user", "content": content}],
                                           temperature=0, max_tokens=max_tokens, **kw)
    return reply.choices[0].message.content


def test_two_replicas_answer_the_greedy_text_of_one_vsurge(ray_app, cache_dir):
    """The same flags built in this process (cli.serve_build.build_server, the replicas' code) answer the same."""
    import asyncio

    from vsurge.cli.serve_build import build_server

    prompts = ["Name a fruit.", "Count to three.", "Say hello.", "What is rye?"]
    client, name = _client(ray_app), ray_app["name"]
    with ThreadPoolExecutor(4) as pool:
        served = list(pool.map(lambda p: _chat(client, name, p), prompts))
    stream = client.chat.completions.create(model=name, messages=[{"role": "user", "content": prompts[0]}],
                                            temperature=0, max_tokens=8, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert len(_replicas()) == 2
    assert sum(stats["requests"] for _, stats in _replicas().values()) >= len(prompts) + 1

    server, surge = build_server(_args(ray_app["model"], cache_dir))
    server.start_models()
    try:
        async def reference(p):
            transport = httpx.ASGITransport(app=server.app)
            async with openai.AsyncOpenAI(base_url="http://local/v1", api_key="unused",
                                          http_client=httpx.AsyncClient(transport=transport)) as local:
                reply = await local.chat.completions.create(
                    model=name, messages=[{"role": "user", "content": p}], temperature=0, max_tokens=8)
                return reply.choices[0].message.content

        async def references():
            return [await reference(p) for p in prompts]

        expected = asyncio.run(references())
    finally:
        server.stop_models(timeout=5)
    assert served == expected
    assert streamed == expected[0]
    assert all(expected)


def test_requests_sharing_a_long_preamble_land_on_one_replica(ray_app):
    before = {actor: stats for actor, (_, stats) in _replicas().items()}
    client, name = _client(ray_app), ray_app["name"]
    questions = [f"Question {i}: when do you open on day {i}?" for i in range(8)]
    _chat(client, name, PREAMBLE + questions[0], max_tokens=2)  # the first one picks a replica (least loaded)
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda q: _chat(client, name, PREAMBLE + q, max_tokens=2), questions[1:]))
    after = {actor: stats for actor, (_, stats) in _replicas().items()}
    served = {actor: after[actor]["requests"] - before[actor]["requests"] for actor in after}
    hits = {actor: after[actor]["prefix_hits"] - before[actor]["prefix_hits"] for actor in after}
    assert sorted(served.values()) == [0, len(questions)], served
    busy = max(served, key=served.get)
    assert hits[busy] == len(questions) - 1, hits  # every one after the first found its preamble there

    # run-time adapters are off unless asked for, as on `vsurge serve`
    refused = httpx.post(ray_app["base"] + "/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/tmp/x"},
                         timeout=30)
    assert refused.status_code == 403 and "--allow-runtime-lora" in refused.json()["error"]["message"], refused.text

    # the one scrape shows it: the router's choices and each replica's counters beside the engine's series
    text = httpx.get(ray_app["base"] + "/metrics", timeout=30).text
    assert "vsurge:num_requests_running" in text  # the answering replica's engine
    series = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith(("vsurge:router_", "vsurge:replica_"))}
    assert series['vsurge:router_requests_total{choice="prefix"}'] >= len(questions) - 1, series
    replica_hits = [v for k, v in series.items() if k.startswith("vsurge:replica_prefix_hits_total")]
    assert len(replica_hits) == 2 and sum(replica_hits) >= len(questions) - 1, series
    given = sum(v for k, v in series.items() if k.startswith("vsurge:replica_prompt_tokens_total"))
    found = sum(v for k, v in series.items() if k.startswith("vsurge:replica_prefix_cache_hit_tokens_total"))
    assert 0 < found < given, series


def test_a_killed_replica_loses_no_non_streamed_request(ray_app):
    """2 streamed requests sharing a preamble (on one replica by prefix) and 12 non-streamed ones with it (on both:
    the preamble's replica takes them until it is overloaded, the rest go to the least loaded) in flight; the
    replica holding the most streams is killed. Every non-streamed request answers (those it held are retried
    on the other replica); the streams it held end with the ingress's error event, the others whole."""

    client, name = _client(ray_app, timeout=180.0), ray_app["name"]
    results, stream_ends = {}, {}
    first_began, streams_began = threading.Event(), threading.Barrier(STREAMS + 1)
    before = {actor: stats["requests"] for actor, (_, stats) in _replicas().items()}

    def ask(i):
        results[i] = _chat(client, name, PREAMBLE + f"Tell a story number {i}.", max_tokens=100,
                           extra_body={"ignore_eos": True})

    def stream(i):
        try:
            chunks = client.chat.completions.create(
                model=name, messages=[{"role": "user", "content": PREAMBLE + f"Describe river {i}."}], temperature=0,
                max_tokens=STREAM_TOKENS, stream=True, extra_body={"ignore_eos": True})
            for n, _ in enumerate(chunks):
                if n == 1:
                    first_began.set()
                    streams_began.wait(timeout=120)
            stream_ends[i] = "done"
        except openai.APIError as e:
            stream_ends[i] = f"error: {e}"

    with ThreadPoolExecutor(16) as pool:
        streams = [pool.submit(stream, 0)]
        assert first_began.wait(timeout=120), stream_ends  # the preamble is on a replica: the next one follows it there
        streams += [pool.submit(stream, i) for i in range(1, STREAMS)]
        streams_began.wait(timeout=120)
        asks = [pool.submit(ask, i) for i in range(12)]
        # the replica holding the most streams, best while it also holds asks; after a few seconds it is killed
        # holding its streams alone (CI runs found no moment with both twice)
        began = time.monotonic()
        while time.monotonic() - began < 60:
            replicas = _replicas()
            victim, (handle, stats) = max(replicas.items(), key=lambda item: item[1][1]["streaming"])
            if 0 < stats["streaming"] < stats["queue_len"] or (stats["streaming"] and time.monotonic() - began > 3):
                break
            time.sleep(0.01)
        assert stats["streaming"] > 0, replicas  # it holds streams
        held_asks = stats["queue_len"] - stats["streaming"]
        ray.kill(handle, no_restart=True)
        for f in asks + streams:
            f.result(timeout=240)  # nothing hangs
    after = {actor: stats["requests"] for actor, (_, stats) in _replicas().items()}
    survivor = next(actor for actor in after if actor in before and actor != victim)
    assert sorted(results) == list(range(12)) and all(results.values())
    # when it held asks: the requests the victim had taken, and every one the survivor took, are more than were
    # sent, so some of them (the victim's unanswered ones) were answered by the survivor on a second try
    if held_asks > 0:
        assert (stats["requests"] - before[victim]) + (after[survivor] - before[survivor]) > STREAMS + 12
    assert sorted(stream_ends) == list(range(STREAMS))
    cut = [end for end in stream_ends.values() if end != "done"]
    # every stream ends whole or, if the victim still held it, with the ingress's clean error (its stats lag both
    # ways, so how many it held at the kill is not known exactly)
    assert all("the replica serving this stream was lost" in end for end in cut), stream_ends


@pytest.fixture(scope="module")
def two_models(ray_app, tiny_checkpoints, cache_dir):
    """The module's application redeployed with two models (each replica loads the second on demand) and
    run-time LoRA adapters allowed, in float32 (adapters' text is compared with PEFT's own): the module's app."""
    from vsurge.cli.arguments import build_parser
    from vsurge.scale.ray_serve.app import APP_NAME, vsurge_application

    first, second = tiny_checkpoints["llama"][0], tiny_checkpoints["qwen2"][0]
    args = build_parser().parse_args(["serve", "--model", f"first={first}", "--model", f"second={second}",
                                      "--enable-lora", "--dtype", "float32", "--compilation-cache", cache_dir,
                                      *SERVE_FLAGS])
    serve.run(vsurge_application(args, replicas=2, stats_period_s=0.2), name=APP_NAME, route_prefix="/")
    return ray_app


def test_a_second_model_is_multiplexed_onto_the_replica_that_loaded_it(two_models):
    """The requests for the second model go to the replica holding it (Serve's multiplexing through the
    prefix-aware router)."""
    client = _client(two_models)
    assert {m.id for m in client.models.list().data} == {"first", "second"}
    assert all(set(stats["models"]) == {"first"} for _, stats in _replicas().values())
    assert _chat(client, "second", "Hello there.")  # loads it on one replica
    time.sleep(1.0)  # Serve hears which replica holds it
    before = {actor: stats["requests"] for actor, (_, stats) in _replicas().items()}
    with ThreadPoolExecutor(2) as pool:
        assert all(pool.map(lambda i: _chat(client, "second", f"Say {i}."), range(6)))
    replicas = _replicas()
    holding = [actor for actor, (_, stats) in replicas.items() if "second" in stats["models"]]
    assert len(holding) == 1, replicas
    took = {actor: stats["requests"] - before[actor] for actor, (_, stats) in replicas.items()}
    assert took[holding[0]] == 6, took


def test_a_lora_adapter_loaded_at_run_time_is_multiplexed_and_unloaded_cluster_wide(two_models, tmp_path,
                                                                                     default_processor_dir):
    """vLLM's load route through the ingress: the adapter's requests go to the replica holding it and answer
    PEFT's greedy text; its holder killed, the other replica loads it on demand; unloaded, it is a 404 on
    every replica. Bad loads get `vsurge serve`'s 4xx errors."""
    from test_lora import peft_greedy, write_peft_adapter

    base = two_models["base"]
    peft_model = write_peft_adapter(tmp_path / "base", tmp_path / "adapter", default_processor_dir, 8, seed=30,
                                    family="llama")  # over the same random Llama as `first` (seed 0)
    prompt, steps = [5, 6, 7, 8, 9, 10], 8
    tokens = peft_greedy(peft_model, prompt, steps)
    expected = httpx.post(base + "/detokenize", json={"model": "first", "tokens": tokens}, timeout=30).json()["prompt"]
    client = _client(two_models)

    def complete(model):
        reply = client.completions.create(model=model, prompt=prompt, max_tokens=steps, temperature=0,
                                          extra_body={"ignore_eos": True})
        return reply.choices[0].text

    bad = httpx.post(base + "/v1/load_lora_adapter", json={"lora_name": "ad", "lora_path": str(tmp_path / "none")},
                     timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "lora_path", bad.text
    named = httpx.post(base + "/v1/load_lora_adapter", json={"lora_name": "first", "lora_path": str(tmp_path)},
                       timeout=30)
    assert named.status_code == 400 and "a model's name" in named.json()["error"]["message"], named.text

    loaded = httpx.post(base + "/v1/load_lora_adapter",
                        json={"lora_name": "ad", "lora_path": str(tmp_path / "adapter"), "model": "first"}, timeout=60)
    assert loaded.status_code == 200, loaded.text
    for _ in range(2):  # whichever replica answers lists it
        assert {m.id: m.parent for m in client.models.list().data}["ad"] == "first"
    before = {actor: stats["requests"] for actor, (_, stats) in _replicas().items()}
    time.sleep(1.0)  # Serve hears which replica holds it (as for a second model)
    assert [complete("ad") for _ in range(3)] == [expected] * 3
    assert complete("first") != expected  # the adapter changes the text
    replicas = _replicas()
    holding = [actor for actor, (_, stats) in replicas.items() if "ad" in stats["adapters"]]
    assert len(holding) == 1, replicas  # loaded by the load route's replica, and its requests went there
    assert replicas[holding[0]][1]["requests"] - before[holding[0]] >= 3

    ray.kill(replicas[holding[0]][0], no_restart=True)  # the record is the ingress's: the other one loads it
    assert complete("ad") == expected
    assert any("ad" in stats["adapters"] for actor, (_, stats) in _replicas().items() if actor != holding[0])

    unloaded = httpx.post(base + "/v1/unload_lora_adapter", json={"lora_name": "ad"}, timeout=60)
    assert unloaded.status_code == 200, unloaded.text
    for _ in range(2):  # whichever replica takes it, it is gone there
        with pytest.raises(openai.NotFoundError, match="ad"):
            complete("ad")
    assert "ad" not in {m.id for m in client.models.list().data}
    again = httpx.post(base + "/v1/unload_lora_adapter", json={"lora_name": "ad"}, timeout=60)
    assert again.status_code == 404 and again.json()["error"]["param"] == "lora_name", again.text
    assert complete("first")  # the replicas serve on


def _ctx(replicas: int, **metrics):
    """What Serve's controller hands a policy: per metric, each replica's value over the look-back window."""
    from types import SimpleNamespace

    return SimpleNamespace(current_num_replicas=replicas,
                           aggregated_metrics={name: dict(enumerate(values)) for name, values in metrics.items()})


def test_the_load_policy_sizes_by_held_requests_against_slots_and_grows_on_a_full_kv_pool():
    from vsurge.scale.ray_serve.autoscale import VsurgeLoadPolicy, autoscaling_config

    policy = VsurgeLoadPolicy(target=0.75)
    assert policy(_ctx(1, held=[0], slots=[8], waiting=[0], kv_usage=[0.0]))[0] == 1  # idle: the floor
    assert policy(_ctx(1, held=[6], slots=[8], waiting=[0], kv_usage=[0.5]))[0] == 1  # 6 of 8 slots: fits
    assert policy(_ctx(1, held=[20], slots=[8], waiting=[12], kv_usage=[0.5]))[0] == 4
    assert policy(_ctx(3, held=[2, 1, 0], slots=[8, 8, 8], waiting=[0, 0, 0], kv_usage=[0.1] * 3))[0] == 1
    # few requests but long ones: the pool is full while requests wait, so slots are not the limit
    assert policy(_ctx(2, held=[3, 2], slots=[8, 8], waiting=[2, 0], kv_usage=[0.95, 0.4]))[0] == 3
    assert policy(_ctx(1, **{}))[0] == 1  # no metrics yet
    with pytest.raises(ValueError, match="fraction of a replica's slots"):
        VsurgeLoadPolicy(target=1.5)
    with pytest.raises(ValueError, match="1 <= min <= max"):
        autoscaling_config(3, 2)


@pytest.mark.filterwarnings("ignore:The `metrics_interval_s` field:DeprecationWarning")
def test_autoscaling_goes_to_two_replicas_under_load_and_back_to_one_idle(ray_app, cache_dir):
    """Redeploys the module's application autoscaled between 1 and 2 replicas (after the other tests but the
    SIGTERM one): 12 long requests on one replica of 4 slots bring a second, none is lost, and idle it goes back
    to one."""
    from vsurge.scale.ray_serve.app import APP_NAME, vsurge_application
    from vsurge.scale.ray_serve.autoscale import autoscaling_config

    def running() -> int:
        status = serve.status().applications[APP_NAME].deployments["VsurgeReplica"]
        return status.replica_states.get("RUNNING", 0)

    def wait_for(count: int, seconds: float) -> float:
        began = time.monotonic()
        while running() != count:
            assert time.monotonic() - began < seconds, f"{running()} replicas after {seconds} s, waiting for {count}"
            time.sleep(0.5)
        return time.monotonic() - began

    # downscale after 1 s idle, not 3: the 2 -> 1 wait is idle time (~5 s with 3)
    config = autoscaling_config(1, 2, upscale_delay_s=1.0, downscale_delay_s=1.0, look_back_period_s=2.0)
    # Ray 2.60's replicas push their stats to the controller every metrics_interval_s of this config (10 s by
    # default; the RAY_SERVE_..._PUSH_INTERVAL_S variable set above is its announced replacement, not read yet):
    # 10 s stale stats made each of 1 -> 2 and 2 -> 1 wait up to 10 s longer
    config["metrics_interval_s"] = 0.5
    serve.run(vsurge_application(_args(ray_app["model"], cache_dir), stats_period_s=0.2, autoscaling=config),
              name=APP_NAME, route_prefix="/")
    assert running() == 1
    client, name = _client(ray_app, timeout=240.0), ray_app["name"]
    scaled, answers = threading.Event(), []

    def keep_asking(worker: int):  # 12 requests in flight until the second replica runs
        while not scaled.is_set():
            answers.append(_chat(client, name, f"Tell story {worker}.", 64, extra_body={"ignore_eos": True}))

    with ThreadPoolExecutor(12) as pool:
        workers = [pool.submit(keep_asking, i) for i in range(12)]
        try:
            up = wait_for(2, 90)
        finally:
            scaled.set()
        for f in workers:
            f.result(timeout=240)  # none lost (an error would raise here) while the second replica joined
    assert len(answers) >= 12 and all(answers)
    down = wait_for(1, 90)
    print(f"autoscaling: 1 -> 2 in {up:.1f} s under load, 2 -> 1 in {down:.1f} s idle")


def test_sigterm_on_vsurge_serve_ray_refuses_new_requests_and_lets_streams_finish(ray_app, cache_dir):
    """`vsurge serve --ray` joined to the module's cluster (this test runs last: its application replaces the
    module's, on one replica of 4 slots): SIGTERM while 6 streams are in flight (2 of them waiting for a slot).
    New requests get the API's 503 while streams are still running, every stream ends whole, and the process
    deletes its application and exits 0."""
    import signal
    import subprocess
    import tempfile

    import vsurge

    model, base, streams = ray_app["model"], ray_app["base"], 6
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(Path(vsurge.__file__).parents[1]), *sys.path[1:]])}
    # the module's ray.init turned on Ray's token authentication (its default for a local cluster, the token in
    # ~/.ray/auth_token): a driver joining the cluster runs in that mode too
    env.update({k: v for k, v in os.environ.items() if k == "RAY_AUTH_MODE"})
    cmd = [sys.executable, "-m", "vsurge.cli", "serve", "--ray", "--ray-address", ray.get_runtime_context().gcs_address,
           "--port", base.rsplit(":", 1)[1], "--model", str(model), "--compilation-cache", cache_dir, *SERVE_FLAGS]
    log = tempfile.NamedTemporaryFile("w+", prefix="vsurge-serve-ray-", suffix=".log")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        began = time.monotonic()
        while "serving on Ray Serve" not in Path(log.name).read_text():
            assert proc.poll() is None and time.monotonic() - began < 120, Path(log.name).read_text()[-3000:]
            time.sleep(0.2)
        client, name = _client(ray_app), ray_app["name"]
        first_chunk, ends = threading.Event(), {}

        def stream(i):
            chunks = client.chat.completions.create(
                model=name, messages=[{"role": "user", "content": f"Describe river {i}."}], temperature=0,
                max_tokens=200, stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
            for chunk in chunks:
                first_chunk.set()
                if chunk.usage is not None:
                    ends[i] = (chunk.usage.completion_tokens, time.monotonic())

        with ThreadPoolExecutor(streams) as pool:
            running = [pool.submit(stream, i) for i in range(streams)]
            assert first_chunk.wait(timeout=60)
            proc.send_signal(signal.SIGTERM)
            while True:  # the ingress drains a moment after the signal: until then it answers as usual
                refused = httpx.post(base + "/v1/chat/completions", timeout=60, json={
                    "model": name, "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 1})
                if refused.status_code != 200:
                    break
                assert time.monotonic() - began < 240, "the ingress never stopped taking requests"
            refused_at = time.monotonic()
            for f in running:
                f.result(timeout=120)  # every stream ends whole, none is cut
        assert refused.status_code == 503 and "shutting down" in refused.json()["error"]["message"], refused.text
        assert sorted(ends) == list(range(streams)) and all(tokens == 200 for tokens, _ in ends.values()), ends
        assert max(at for _, at in ends.values()) > refused_at  # streams ran on after new requests were refused
        assert proc.wait(timeout=60) == 0, Path(log.name).read_text()[-3000:]
        assert "vsurge" not in serve.status().applications  # deleted; the joined cluster's Serve runs on
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()


def test_a_replica_spans_two_processes_as_one_jax_distributed_mesh(ray_app, cache_dir):
    """`--replica-hosts 2`: one replica of two processes, its placement group's two bundles of 1 CPU packed on this
    machine (on a cluster: one per node). The replica's actor is process 0, its follower actor process 1; one
    2-device mesh over jax.distributed (tensor parallel 2) answers the float32 greedy text of the torch model."""
    from test_lora import peft_greedy

    from vsurge.scale.ray_serve.app import APP_NAME, vsurge_application

    from vsurge.cli.arguments import build_parser

    if APP_NAME in serve.status().applications:
        serve.delete(APP_NAME)  # its replicas' CPUs are the group's
    args = build_parser().parse_args(["serve", "--model", str(ray_app["model"]), "--dtype", "float32",
                                      "--compilation-cache", cache_dir, *SERVE_FLAGS])
    serve.run(vsurge_application(args, replica_hosts=2, hosts_strategy="PACK", stats_period_s=0.2), name=APP_NAME,
              route_prefix="/")
    (_, stats), = _replicas().values()
    assert stats["processes"] == 2  # its JAX runtime's
    client, name = _client(ray_app), ray_app["name"]
    prompt, steps = [5, 6, 7, 8, 9, 10], 8
    reply = client.completions.create(model=name, prompt=prompt, max_tokens=steps, temperature=0,
                                      extra_body={"ignore_eos": True})
    tokens = peft_greedy(ray_app["torch_model"], prompt, steps)
    expected = httpx.post(ray_app["base"] + "/detokenize", json={"tokens": tokens}, timeout=30).json()["prompt"]
    assert reply.choices[0].text == expected

    # its follower lost, the replica fails Serve's health check and is replaced whole
    from vsurge.scale.ray_serve.cluster_metrics import replica_actors

    (replica, _), = replica_actors()
    follower = next(a for a in ray.util.list_named_actors(all_namespaces=True)
                    if a["name"].startswith("VsurgeFollower#"))
    ray.kill(ray.get_actor(follower["name"], namespace=follower["namespace"]), no_restart=True)
    began = time.monotonic()
    while replica in dict(replica_actors()):
        assert time.monotonic() - began < 30, "the replica with a lost follower stayed in rotation"
        time.sleep(0.5)
