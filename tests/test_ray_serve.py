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

SERVE_FLAGS = ("--max-concurrent-decodes", "4", "--max-length", "256", "--prefill-lengths", "64,128",
               "--max-queue", "64")
PREAMBLE = ("You are the assistant of a small bakery. The bakery opens at seven, sells rye and wheat bread, "
            "croissants on weekends, and closes at six. Answer in one short sentence, politely, and never "
            "invent prices. Orders above ten loaves need a day's notice, and gifts go out on Fridays. ")
# (~330 characters: 5 routing blocks of 64, prefixes.py; the router wants 4 shared)


def _args(model: Path, cache: str):
    from vsurge.cli.arguments import build_parser

    return build_parser().parse_args(["serve", "--model", str(model), "--compilation-cache", cache, *SERVE_FLAGS])


@pytest.fixture(scope="module")
def ray_app(tiny_checkpoints, cache_dir):
    """The application on a 2-CPU local cluster: base URL; the module's one cluster, shut down after."""
    from vsurge.scale.ray_serve.app import APP_NAME, vsurge_application

    import vsurge

    src = str(Path(vsurge.__file__).parents[1])
    env = {k: ENV[k] for k in ("HF_HUB_OFFLINE", "JAX_PLATFORMS", "XLA_FLAGS") if k in ENV}
    env["PYTHONPATH"] = os.pathsep.join([src, *sys.path[1:]])  # the replicas import this checkout's vsurge
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": env}, logging_level="WARNING")
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    model = tiny_checkpoints["llama"][0]
    serve.run(vsurge_application(_args(model, cache_dir), replicas=2, stats_period_s=0.2), name=APP_NAME,
              route_prefix="/")
    base = f"http://127.0.0.1:{port}"
    name = httpx.get(base + "/v1/models", timeout=30).json()["data"][0]["id"]
    yield {"base": base, "model": model, "name": name}
    ray.shutdown()  # the cluster ends with its Serve controller and replicas (serve.shutdown's drain took ~5 s)


def _client(ray_app, timeout=120.0):
    return openai.OpenAI(base_url=ray_app["base"] + "/v1", api_key="unused", max_retries=0, timeout=timeout)


def _replicas() -> dict:
    """Each live replica actor's routing stats (what it reports to the router), by actor name."""
    out = {}
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if "#VsurgeReplica#" not in actor["name"]:
            continue
        try:
            handle = ray.get_actor(actor["name"], namespace=actor["namespace"])
            out[actor["name"]] = (handle, ray.get(handle.record_routing_stats.remote(), timeout=10))
        except (ValueError, ray.exceptions.RayError):
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


def test_a_killed_replica_loses_no_non_streamed_request(ray_app):
    """4 streamed requests sharing a preamble (on one replica by prefix, mostly) and 12 non-streamed ones with
    it (on both: the preamble's replica is soon overloaded, the rest go to the least loaded) in flight; the
    replica holding the most streams is killed. Every non-streamed request answers (those it held are retried
    on the other replica); the streams it held end with the ingress's error event, the others whole."""

    client, name = _client(ray_app, timeout=180.0), ray_app["name"]
    results, stream_ends = {}, {}
    first_began, streams_began = threading.Event(), threading.Barrier(5)
    before = {actor: stats["requests"] for actor, (_, stats) in _replicas().items()}

    def ask(i):
        results[i] = _chat(client, name, PREAMBLE + f"Tell a story number {i}.", max_tokens=100,
                           extra_body={"ignore_eos": True})

    def stream(i):
        try:
            chunks = client.chat.completions.create(
                model=name, messages=[{"role": "user", "content": PREAMBLE + f"Describe river {i}."}], temperature=0,
                max_tokens=100, stream=True, extra_body={"ignore_eos": True})
            for n, _ in enumerate(chunks):
                if n == 1:
                    first_began.set()
                    streams_began.wait(timeout=120)
            stream_ends[i] = "done"
        except openai.APIError as e:
            stream_ends[i] = f"error: {e}"

    with ThreadPoolExecutor(16) as pool:
        streams = [pool.submit(stream, 0)]
        assert first_began.wait(timeout=120)  # the preamble is on a replica: the next three follow it there
        streams += [pool.submit(stream, i) for i in range(1, 4)]
        streams_began.wait(timeout=120)
        asks = [pool.submit(ask, i) for i in range(12)]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until (nearly) all 16 are in flight
            replicas = _replicas()
            if sum(stats["queue_len"] for _, stats in replicas.values()) >= 14:
                break
            time.sleep(0.02)
        victim, (handle, stats) = max(replicas.items(), key=lambda item: item[1][1]["streaming"])
        assert 0 < stats["streaming"] < stats["queue_len"], replicas  # it holds streams and non-streamed ones
        ray.kill(handle, no_restart=True)
        for f in asks + streams:
            f.result(timeout=240)  # nothing hangs
    after = {actor: stats["requests"] for actor, (_, stats) in _replicas().items()}
    survivor = next(actor for actor in after if actor in before and actor != victim)
    assert sorted(results) == list(range(12)) and all(results.values())
    # the requests the victim had taken, and every one the survivor took: more than were sent, so some of
    # them (the victim's unanswered ones) were answered by the survivor on a second try
    assert (stats["requests"] - before[victim]) + (after[survivor] - before[survivor]) > 16
    assert sorted(stream_ends) == list(range(4))
    cut = [end for end in stream_ends.values() if end != "done"]
    assert len(cut) == stats["streaming"], stream_ends  # the victim's streams ended with the error, the rest whole
    assert all("replica serving this stream was lost" in end for end in cut), stream_ends


def test_the_serve_config_in_the_docs_names_the_app_and_flags_the_code_has():
    """docs/scaling.md's Serve config: its import path is the application builder, its args are flags of
    `vsurge serve` (no cluster: the application is only built)."""
    import importlib
    import re

    import yaml

    docs = (Path(__file__).parents[1] / "docs" / "scaling.md").read_text()
    config = yaml.safe_load(re.search(r"```yaml\n# vsurge.yaml\n(.*?)```", docs, re.S).group(1))
    app = config["applications"][0]
    module, _, attr = app["import_path"].partition(":")
    builder = getattr(importlib.import_module(module), attr)
    from vsurge.scale.ray_serve.app import build_app

    assert builder is build_app
    assert isinstance(builder(app["args"]), serve.Application)
    with pytest.raises(SystemExit):
        builder({"serve_args": "--no-such-flag 1"})
