"""vsurge replicas on Ray Serve against `vsurge serve` alone, and the prefix-aware router against Serve's own
(issue 62's targets), on one machine: a local Ray cluster, the default model.

    python benchmarks/ray_serve.py                       # both parts
    python benchmarks/ray_serve.py --parts one           # 1 replica behind Ray Serve vs vsurge serve direct
    python benchmarks/ray_serve.py --parts routing       # 2 replicas: prefix-aware vs Serve's default router
    python benchmarks/ray_serve.py --parts kill          # 2 replicas, one killed under load: nothing lost

one: `vsurge serve` in a process of its own, then the Ray application with one replica, each loaded with
`vsurge bench serve`'s random prompts (--concurrency at once, --num-prompts in all); output tok/s and the ratio.
routing: two replicas; --groups conversations, each a ~300-token preamble of its own asked --group-size times:
first every group's opening request at once, then every follow-up at once, shuffled (a chat's next turns). The
replicas' engines count the prompt tokens they were given and, of them, found in their prefix caches: prefilled =
given - found. The same load runs under the prefix-aware router and under Serve's default (power of two
choices by queue length), each on freshly started replicas; TTFT is measured on the follow-ups (streamed).
kill: --kill-requests non-streamed requests (--kill-in-flight at once) and --kill-streams streams on two replicas;
when a fifth are answered the replica holding the most is killed: none may be lost (the ingress retries what the
lost replica had not answered), and every stream it cut must end with an error event.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).parent))

import httpx  # noqa: E402
from serve import free_port  # noqa: E402  (benchmarks/serve.py)

from vsurge.cli import bench_serve  # noqa: E402
from vsurge.cli.arguments import build_parser  # noqa: E402
from vsurge.kernels import cpu_isa  # noqa: E402

FLAGS = ["--max-concurrent-decodes", "8", "--max-length", "1024"]


def serve_args(model: str, cache: str) -> list[str]:
    return ["--model", model, "--compilation-cache", cache, *FLAGS]


async def load(base: str, model: str, args) -> dict:
    return await bench_serve.run(base, model, args.num_prompts, args.input_len, args.output_len, float("inf"),
                                 args.concurrency, None, None)


def direct(args) -> dict:
    """`vsurge serve` alone in its own process: the bench's summary."""
    port = free_port()
    cmd = [sys.executable, "-c", "import sys, vsurge.cli; sys.exit(vsurge.cli.main())", "serve", "--port", str(port),
           *serve_args(args.model, args.cache)]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        bench_serve.wait_ready(base, 600)
        name = bench_serve.first_model(base, None)
        asyncio.run(load(base, name, argparse.Namespace(**{**vars(args), "num_prompts": 4})))  # warm-up
        return asyncio.run(load(base, name, args))
    finally:
        server.terminate()
        server.wait(60)


class RayApp:
    """The application on a local cluster (ray.init once), redeployed per configuration."""

    def __init__(self, args):
        import ray
        from ray import serve

        src = str(Path(__file__).parents[1] / "src")
        env = {"PYTHONPATH": os.pathsep.join([src, *sys.path[1:]]), "HF_HUB_OFFLINE": "1"}
        ray.init(num_cpus=args.ray_cpus, include_dashboard=False, runtime_env={"env_vars": env},
                 logging_level="WARNING")
        self.port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": self.port})
        self.base = f"http://127.0.0.1:{self.port}"
        self.args = args

    def deploy(self, replicas: int, prefix_routing: bool = True) -> str:
        from ray import serve

        from vsurge.scale.ray_serve.app import APP_NAME, vsurge_application

        serve.delete(APP_NAME)
        parsed = build_parser().parse_args(["serve", *serve_args(self.args.model, self.args.cache)])
        began = time.perf_counter()
        serve.run(vsurge_application(parsed, replicas=replicas, replica_cpus=self.args.ray_cpus / replicas,
                                     stats_period_s=0.2, prefix_routing=prefix_routing),
                  name=APP_NAME, route_prefix="/")
        print(f"  {replicas} replica(s), {'prefix-aware' if prefix_routing else 'default'} router: ready in "
              f"{time.perf_counter() - began:.0f} s", flush=True)
        return bench_serve.first_model(self.base, None)

    @staticmethod
    def replica_stats() -> dict:
        """{actor name: routing stats} of the live replicas."""
        import ray

        from vsurge.scale.ray_serve.cluster_metrics import replica_actors

        return {name: ray.get(handle.record_routing_stats.remote(), timeout=30) for name, handle in replica_actors()}

    def close(self) -> None:
        import ray
        from ray import serve

        serve.shutdown()
        ray.shutdown()


async def chat(client: httpx.AsyncClient, base: str, model: str, text: str, tokens: int) -> float:
    """One streamed chat request: seconds to its first content chunk."""
    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": tokens,
            "temperature": 0, "stream": True, "ignore_eos": True}
    start, first = time.perf_counter(), None
    async with client.stream("POST", base + "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if first is None and line.startswith("data: {") and '"content"' in line:
                first = time.perf_counter() - start
    return first if first is not None else time.perf_counter() - start


def conversations(args) -> tuple[list[str], list[str]]:
    """(openings, follow-ups): each group's preamble opens one request and is asked again group_size - 1 times."""
    rng = random.Random(7)
    preambles = [bench_serve.random_prompt(rng, args.preamble_len) for _ in range(args.groups)]
    openings = [p + f" Question 0 of group {g}?" for g, p in enumerate(preambles)]
    follow = [p + f" Question {i} of group {g}: {bench_serve.random_prompt(rng, 12)}?"
              for i in range(1, args.group_size) for g, p in enumerate(preambles)]
    # the next turns come in no particular order: in the openings' order, a router that alternates between two
    # replicas sends each follow-up where its opening went, by construction rather than by its prefix
    rng.shuffle(follow)
    return openings, follow


def routed_load(app: RayApp, model: str, args) -> dict:
    before = app.replica_stats()
    openings, follow = conversations(args)

    async def run():
        async with httpx.AsyncClient(timeout=600) as client:
            await asyncio.gather(*(chat(client, app.base, model, t, args.output_len) for t in openings))
            await asyncio.sleep(0.5)  # the replicas' stats reach the router (polled every 0.2 s)
            return await asyncio.gather(*(chat(client, app.base, model, t, args.output_len) for t in follow))

    ttfts = asyncio.run(run())
    after = app.replica_stats()
    given = sum(after[a]["prompt_tokens"] - before.get(a, {}).get("prompt_tokens", 0) for a in after)
    found = sum(after[a]["prefix_cache_hit_tokens"] - before.get(a, {}).get("prefix_cache_hit_tokens", 0)
                for a in after)
    spread = sorted(after[a]["requests"] - before.get(a, {}).get("requests", 0) for a in after)
    return {"given": given, "prefilled": given - found, "ttft_p50": statistics.median(ttfts), "spread": spread}


async def stream_end(client: httpx.AsyncClient, base: str, model: str, text: str, tokens: int) -> str:
    """One streamed chat request: "done" (whole, [DONE]), "error" (an error event then [DONE]) or the failure."""
    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": tokens,
            "temperature": 0, "stream": True, "ignore_eos": True}
    saw_error = False
    try:
        async with client.stream("POST", base + "/v1/chat/completions", json=body) as response:
            async for line in response.aiter_lines():
                saw_error = saw_error or line.startswith('data: {"error"')
                if line == "data: [DONE]":
                    return "error" if saw_error else "done"
    except httpx.HTTPError as exc:
        return f"failed: {exc!r}"
    return "cut without [DONE]"


def kill_load(app: RayApp, model: str, args) -> dict:
    """--kill-requests non-streamed requests, --kill-in-flight at a time, and --kill-streams streams; once a fifth
    of the requests are answered, the replica holding the most in flight is killed."""
    import ray

    answered, results = [0], []

    async def ask(i: int, gate: asyncio.Semaphore, client: httpx.AsyncClient):
        async with gate:
            body = {"model": model, "messages": [{"role": "user", "content": f"Tell story {i}."}],
                    "max_tokens": args.output_len, "temperature": 0, "ignore_eos": True}
            try:
                reply = await client.post(app.base + "/v1/chat/completions", json=body)
                ok = reply.status_code == 200 and bool(reply.json()["choices"][0]["message"]["content"])
            except (httpx.HTTPError, ValueError, KeyError):
                ok = False
            answered[0] += 1
            results.append(ok)

    async def killer():
        while answered[0] < args.kill_requests // 5:
            await asyncio.sleep(0.05)
        from vsurge.scale.ray_serve.cluster_metrics import replica_actors

        handles = dict(replica_actors())
        stats = app.replica_stats()
        victim = max(stats, key=lambda name: stats[name]["queue_len"])
        ray.kill(handles[victim], no_restart=True)
        return stats[victim]["queue_len"]

    async def run():
        gate = asyncio.Semaphore(args.kill_in_flight)
        async with httpx.AsyncClient(timeout=600) as client:
            streams = [stream_end(client, app.base, model, f"Describe river {i}.", 4 * args.output_len)
                       for i in range(args.kill_streams)]
            asks = [ask(i, gate, client) for i in range(args.kill_requests)]
            *ends, held = await asyncio.wait_for(asyncio.gather(*streams, *asks, killer()), 900)
            return ends[:args.kill_streams], held

    ends, held = asyncio.run(run())
    return {"lost": results.count(False), "answered": results.count(True), "victim_held": held,
            "streams": {end: ends.count(end) for end in set(ends)}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default="one,routing,kill")
    p.add_argument("--model", default="default")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--group-size", type=int, default=3)
    p.add_argument("--preamble-len", type=int, default=300)
    p.add_argument("--kill-requests", type=int, default=200)
    p.add_argument("--kill-in-flight", type=int, default=40)
    p.add_argument("--kill-streams", type=int, default=8)
    p.add_argument("--ray-cpus", type=int, default=2)
    p.add_argument("--cache", default=os.path.expanduser("~/.cache/vsurge-bench/ray-xla"))
    args = p.parse_args()
    parts = args.parts.split(",")
    print(f"machine: {os.cpu_count()} cores, CPU ISA {cpu_isa()}; model {args.model}; vsurge flags {' '.join(FLAGS)}",
          flush=True)
    rows = []
    if "one" in parts:
        alone = direct(args)
        print(f"  vsurge serve direct: {alone['output_throughput']:.1f} tok/s", flush=True)
    app = RayApp(args)
    try:
        if "one" in parts:
            model = app.deploy(1)
            asyncio.run(load(app.base, model, argparse.Namespace(**{**vars(args), "num_prompts": 4})))  # warm-up
            ray_one = asyncio.run(load(app.base, model, args))
            ratio = ray_one["output_throughput"] / alone["output_throughput"]
            rows.append(f"| 1 replica behind Ray Serve vs `vsurge serve` direct, {args.concurrency} concurrent, "
                        f"{args.input_len}-token prompts, {args.output_len} tokens | {ray_one['output_throughput']:.1f} "
                        f"vs {alone['output_throughput']:.1f} tok/s | **{ratio:.2f}x** | >= 0.85x |")
        if "routing" in parts:
            results = {}
            for prefix in (True, False):
                model = app.deploy(2, prefix_routing=prefix)
                results[prefix] = routed_load(app, model, args)
                print(f"  {'prefix-aware' if prefix else 'default'}: {results[prefix]}", flush=True)
            aware, default = results[True], results[False]
            load_name = (f"{args.groups} groups x {args.group_size} requests sharing a {args.preamble_len}-token "
                         f"preamble, 2 replicas")
            rows.append(f"| {load_name}: prefilled tokens, prefix-aware vs Serve's default router | "
                        f"{aware['prefilled']:,} vs {default['prefilled']:,} (of {aware['given']:,} given) | "
                        f"**{aware['prefilled'] / default['prefilled']:.2f}x** | <= 0.6x |")
            rows.append(f"| same load: TTFT p50 of the follow-ups | {aware['ttft_p50']:.3f} vs "
                        f"{default['ttft_p50']:.3f} s | **{aware['ttft_p50'] / default['ttft_p50']:.2f}x** | <= 0.7x |")
            rows.append(f"| same load: requests per replica | {aware['spread']} vs {default['spread']} | - | - |")
        if "kill" in parts:
            model = app.deploy(2)
            killed = kill_load(app, model, args)
            print(f"  kill: {killed}", flush=True)
            cut = sum(n for end, n in killed["streams"].items() if end != "done")
            rows.append(f"| {args.kill_requests} non-streamed requests, {args.kill_in_flight} in flight, + "
                        f"{args.kill_streams} streams; the replica holding the most ({killed['victim_held']}) killed | "
                        f"{killed['answered']} answered, **{killed['lost']} lost** | - | 0 lost |")
            rows.append(f"| same: streams | {killed['streams']} | {cut} cut, "
                        f"{killed['streams'].get('error', 0)} with an error event | all cut end with an error event |")
    finally:
        app.close()
    print(f"\n`python benchmarks/ray_serve.py --parts {args.parts}`, {time.strftime('%Y-%m-%d')}, "
          f"{os.cpu_count()} cores, CPU ISA {cpu_isa()}, Ray {__import__('ray').__version__}\n")
    print("| measure | measured | ratio | must |\n|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
