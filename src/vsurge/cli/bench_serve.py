"""`vsurge bench serve`: load-test any OpenAI-compatible server, like `vllm bench serve`.

Random prompts of a given input length, a fixed number of output tokens (the
end token is banned with logit_bias), requests sent at a Poisson rate or all at
once, optionally capped at a maximum concurrency. Every request streams with
include_usage. `--endpoint` picks the wire format: /v1/completions (the default),
/v1/chat/completions, /v1/responses (OpenAI Responses) or /v1/messages (Anthropic).
Reports request throughput, output tok/s and mean/median/p99 of
TTFT (first content chunk), TPOT ((latency - TTFT) / (tokens - 1)), ITL (gaps
between content chunks) and E2E latency. Against a vsurge server it also reads
/v1/stats before and after each load and prints where the time to first token
went in the engine (mean queue, step wait and prefill per request).

`--images-per-request N` adds N images to every request (`--image-size WxH`, photo-like JPEGs
sent as base64, a different image for every request, so the server's encoder cache does not
answer them; chat, Responses or Messages: /v1/completions is text only), the image load of
`vllm bench serve --dataset-name random-mm`.

`--concurrency 1,16,32` runs one load per level (that many prompts, all in flight
at once) and `--base-url` may be given several times (`--label` names each):
one table row per (server, level); `--plot FILE.png` draws tok/s and TTFT against
concurrency, one line per server (vsurge.cli.bench_plot, matplotlib extra `plot`).

`--uds PATH` sends every request over a unix domain socket (a `vsurge serve --uds PATH` server;
the base URL's host is then ignored), and `--wait-ready SECONDS` waits for the server's
/readiness first (a server started just before the benchmark).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass, field

import httpx

WORDS = ("time year people way day man thing woman life child world school state family student group country "
         "problem hand part place case week company system program question work government number night point "
         "home water room mother area money story fact month lot right study book eye job word business issue "
         "side kind head house service friend father power hour game line end member law car city community name").split()


@dataclass
class RequestResult:
    ok: bool
    ttft: float = 0.0
    latency: float = 0.0
    output_tokens: int = 0
    itls: list[float] = field(default_factory=list)
    error: str = ""


def http_client(uds: str | None = None, **kwargs) -> httpx.Client:
    """A client that reaches the server over TCP, or over the unix socket at `uds` (the URL's host is ignored;
    no proxy from the environment may take the request)."""
    if uds:
        return httpx.Client(transport=httpx.HTTPTransport(uds=uds), trust_env=False, **kwargs)
    return httpx.Client(**kwargs)


def async_client(uds: str | None = None, limits: httpx.Limits | None = None, **kwargs) -> httpx.AsyncClient:
    """http_client's asyncio twin (limits: the connection pool's, which a transport of our own must be given)."""
    limits = limits or httpx.Limits()
    if uds:
        return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=uds, limits=limits), trust_env=False,
                                 **kwargs)
    return httpx.AsyncClient(limits=limits, **kwargs)


def wait_ready(base_url: str, timeout: float, uds: str | None = None) -> float:
    """Wait until the server's /readiness answers 200 (a vsurge server compiling answers 503, one not yet
    listening refuses the connection): the seconds waited. TimeoutError after `timeout` seconds."""
    start = time.perf_counter()
    with http_client(uds, timeout=5) as client:
        while True:
            try:
                if client.get(base_url.rstrip("/") + "/readiness").status_code == 200:
                    return time.perf_counter() - start
            except httpx.HTTPError:
                pass
            if time.perf_counter() - start > timeout:
                raise TimeoutError(f"{uds or base_url}: /readiness did not answer 200 within {timeout:g} s")
            time.sleep(0.25)


def random_prompt(rng: random.Random, approx_tokens: int) -> str:
    # these common words are one token each (with their leading space) in Llama-family vocabularies
    return " ".join(rng.choice(WORDS) for _ in range(approx_tokens))


ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages")


def photo_jpeg(width: int, height: int, seed: int) -> bytes:
    """A photo-like JPEG (smooth colour fields plus a little noise: it compresses as photos do, not as
    noise or one colour), different for every seed."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width] / max(width, height)
    phase = rng.uniform(0, 6.28, 3)
    fields = [np.sin(6 * x + phase[c]) * np.cos(4 * y - phase[c]) for c in range(3)]
    pixels = np.stack(fields, -1) * 100 + 128 + rng.normal(0, 8, (height, width, 3))
    buf = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def image_size(text: str) -> tuple[int, int]:
    """'640x480' -> (640, 480) (argparse type)."""
    try:
        width, height = (int(v) for v in text.lower().split("x"))
    except ValueError:
        width = height = 0
    if width < 1 or height < 1:
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT in pixels, e.g. 512x512, got {text!r}")
    return width, height


def _content(endpoint: str, prompt: str, images: list[bytes]):
    """The user turn's content: the prompt alone, or the images (base64 JPEG) then the prompt."""
    if not images:
        return prompt
    b64 = [base64.b64encode(data).decode() for data in images]
    if endpoint == "/v1/chat/completions":
        return [*({"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{d}"}} for d in b64),
                {"type": "text", "text": prompt}]
    if endpoint == "/v1/responses":
        return [*({"type": "input_image", "image_url": f"data:image/jpeg;base64,{d}"} for d in b64),
                {"type": "input_text", "text": prompt}]
    if endpoint == "/v1/messages":
        return [*({"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": d}} for d in b64),
                {"type": "text", "text": prompt}]
    raise ValueError(f"{endpoint} takes text only: send images to /v1/chat/completions, /v1/responses or /v1/messages")


def request_body(endpoint: str, model: str, prompt: str, output_len: int, images: list[bytes] = ()) -> dict:
    """A streamed greedy request of `output_len` tokens in the endpoint's wire format (with `images`,
    JPEG bytes, before the prompt in the user's turn)."""
    if endpoint not in ENDPOINTS:
        raise ValueError(f"unknown endpoint {endpoint!r} (known: {', '.join(ENDPOINTS)})")
    content = _content(endpoint, prompt, list(images))
    if endpoint == "/v1/completions":
        return {"model": model, "prompt": prompt, "max_tokens": output_len, "temperature": 0.0, "stream": True,
                "stream_options": {"include_usage": True}}
    if endpoint == "/v1/chat/completions":
        return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": output_len,
                "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
    if endpoint == "/v1/responses":
        user = content if isinstance(content, str) else [{"role": "user", "content": content}]
        return {"model": model, "input": user, "max_output_tokens": output_len, "temperature": 0.0, "stream": True,
                "store": False}
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": output_len,
            "temperature": 0.0, "stream": True}


def chunk_content(chunk: dict) -> tuple[str, int | None]:
    """(new text, output tokens if this event reports them) of one streamed event of any endpoint."""
    kind = chunk.get("type")
    if kind == "response.output_text.delta":
        return chunk.get("delta", ""), None
    if kind in ("response.completed", "response.incomplete"):
        return "", ((chunk.get("response") or {}).get("usage") or {}).get("output_tokens")
    if kind == "content_block_delta":
        return (chunk.get("delta") or {}).get("text", ""), None
    if kind == "message_delta":
        return "", (chunk.get("usage") or {}).get("output_tokens")
    choices = chunk.get("choices") or []
    text = (choices[0].get("text") or (choices[0].get("delta") or {}).get("content") or "") if choices else ""
    return text, (chunk.get("usage") or {}).get("completion_tokens")


async def one_request(client: httpx.AsyncClient, url: str, payload: dict) -> RequestResult:
    start = time.perf_counter()
    first = last = None
    itls, tokens, chunks = [], 0, 0
    try:
        async with client.stream("POST", url, json=payload) as response:
            if response.status_code != 200:
                return RequestResult(False, error=f"HTTP {response.status_code}: {(await response.aread())[:200]!r}")
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                text, reported = chunk_content(json.loads(line[6:]))
                if reported:
                    tokens = reported
                if text:
                    chunks += 1
                    now = time.perf_counter()
                    if first is None:
                        first = now
                    else:
                        itls.append(now - last)
                    last = now
    except httpx.HTTPError as exc:
        return RequestResult(False, error=repr(exc))
    end = time.perf_counter()
    if first is None:
        return RequestResult(False, error="no content received")
    # servers without include_usage support: one content chunk per token
    return RequestResult(True, first - start, end - start, tokens or chunks, itls)


async def run(base_url: str, model: str, num_prompts: int, input_len: int, output_len: int, request_rate: float,
              max_concurrency: int | None, api_key: str | None, eos_token_id: int | None, seed: int = 0,
              shared_prefix_len: int = 0, endpoint: str = "/v1/completions", images_per_request: int = 0,
              image_size: tuple[int, int] = (512, 512), temperature: float = 0.0, uds: str | None = None) -> dict:
    """shared_prefix_len: words of one preamble every prompt starts with (a system prompt). model: one name, or
    a list whose names the requests take in turn (a base model's LoRA adapters). images_per_request: JPEGs
    of image_size (width, height) in every request, none the same (made before the clock starts). temperature:
    every request's (0: greedy, the default). uds: send every request over this unix socket."""
    models = [model] if isinstance(model, str) else list(model)
    rng = random.Random(seed)
    preamble = random_prompt(random.Random(seed + 1), shared_prefix_len) + " " if shared_prefix_len else ""
    prompts = [preamble + random_prompt(rng, input_len) for _ in range(num_prompts)]
    url = base_url.rstrip("/") + endpoint
    headers = {"Authorization": f"Bearer {api_key}", "x-api-key": api_key} if api_key else {}
    limit = asyncio.Semaphore(max_concurrency or num_prompts)
    images = [[photo_jpeg(*image_size, seed * 1_000_003 + i * 64 + j) for j in range(images_per_request)]
              for i in range(num_prompts)]

    def payload(prompt, i):
        body = request_body(endpoint, models[i % len(models)], prompt, output_len, images[i])
        if eos_token_id is not None:
            body["logit_bias"] = {str(eos_token_id): -100}
        body["temperature"] = temperature
        return body

    # a connection per request: reusing one a server has just closed after its keep-alive time loses the
    # request ("Server disconnected without sending a response", seen against llama-server at 1 stream)
    async with async_client(uds, timeout=httpx.Timeout(600.0), headers=headers,
                            limits=httpx.Limits(max_connections=None, max_keepalive_connections=0)) as client:
        async def limited(i, prompt, delay):
            await asyncio.sleep(delay)
            async with limit:
                return await one_request(client, url, payload(prompt, i))

        delays, t = [], 0.0
        for _ in prompts:
            delays.append(t)
            if request_rate != float("inf"):
                t += rng.expovariate(request_rate)
        before = await server_trace(client, base_url)
        start = time.perf_counter()
        results = await asyncio.gather(*(limited(i, p, d) for i, (p, d) in enumerate(zip(prompts, delays))))
        duration = time.perf_counter() - start
        after = await server_trace(client, base_url)
    summary = summarize(results, duration)
    if before is not None and after is not None:
        summary["server_trace"] = trace_means(before, after)
    return summary


# a vsurge server's per-request trace (/v1/stats, the same series as /metrics): arrival -> admitted -> the
# first step computing the prompt begins -> first token, plus the whole time to first token as the engine saw it
TRACE_FIELDS = {"queue": "queue_time", "step_wait": "step_wait_time", "prefill": "prefill_time", "ttft": "ttft"}


async def server_trace(client: httpx.AsyncClient, base_url: str) -> dict | None:
    """{stage: (sum of seconds, count)} over the server's models; None when it has no /v1/stats
    with these fields (not a vsurge server)."""
    try:
        response = await client.get(base_url.rstrip("/") + "/v1/stats")
        models = response.json()["models"] if response.status_code == 200 else None
        return {stage: (sum(m[field]["sum"] for m in models), sum(m[field]["count"] for m in models))
                for stage, field in TRACE_FIELDS.items()} if models else None
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None


def trace_means(before: dict, after: dict) -> dict:
    """Mean seconds per stage over the requests of one run (the difference of two scrapes)."""
    means = {}
    for stage in TRACE_FIELDS:
        total, count = (a - b for a, b in zip(after[stage], before[stage]))
        means[stage] = total / count if count else float("nan")
    return means


def format_trace(s: dict) -> str:
    t = s.get("server_trace")
    if not t:
        return ""
    return (f"  server trace, mean ms: queue {t['queue'] * 1000:.0f} + step wait {t['step_wait'] * 1000:.0f} + "
            f"prefill {t['prefill'] * 1000:.0f} = first token {t['ttft'] * 1000:.0f} in the engine "
            f"(client TTFT mean {s['ttft']['mean'] * 1000:.0f})")


def _stats(values: list[float]) -> dict:
    if not values:
        return {"mean": float("nan"), "median": float("nan"), "p99": float("nan")}
    ordered = sorted(values)
    return {"mean": statistics.fmean(ordered), "median": statistics.median(ordered),
            "p99": ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]}


def summarize(results: list[RequestResult], duration: float) -> dict:
    ok = [r for r in results if r.ok]
    output = sum(r.output_tokens for r in ok)
    return {
        "completed": len(ok), "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if not r.ok})[:3],
        "duration_s": duration, "output_tokens": output, "request_throughput": len(ok) / duration,
        "output_throughput": output / duration,
        "ttft": _stats([r.ttft for r in ok]),
        "tpot": _stats([(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]),
        "itl": _stats([x for r in ok for x in r.itls]),
        "e2e": _stats([r.latency for r in ok]),
    }


def format_summary(name: str, s: dict) -> str:
    ms = lambda d, k: f"{d[k] * 1000:.0f}"  # noqa: E731
    return (f"| {name} | {s['completed']}/{s['completed'] + s['failed']} | {s['request_throughput']:.2f} | "
            f"{s['output_throughput']:.1f} | {ms(s['ttft'], 'mean')} / {ms(s['ttft'], 'median')} / "
            f"{ms(s['ttft'], 'p99')} | {ms(s['tpot'], 'median')} | {ms(s['itl'], 'median')} / {ms(s['itl'], 'p99')} | "
            f"{ms(s['e2e'], 'median')} |")


TABLE_HEADER = ("| server | done | req/s | output tok/s | TTFT mean / p50 / p99 ms | TPOT p50 ms | ITL p50 / p99 ms "
                "| E2E p50 ms |\n|---|---|---|---|---|---|---|---|")


DEFAULT_BASE_URL = "http://127.0.0.1:11556"


def concurrency_levels(text: str) -> list[int]:
    """'1,16,32' -> [1, 16, 32] (argparse type)."""
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        levels = []
    if not levels or any(level < 1 for level in levels):
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {text!r}")
    return levels


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", action="append", default=None,
                   help=f"server to load (repeat for several; default {DEFAULT_BASE_URL})")
    p.add_argument("--uds", default=None, metavar="PATH",
                   help="send every request over this unix domain socket (a `vsurge serve --uds PATH` server; the "
                        "base URL's host is ignored, default base URL http://localhost)")
    p.add_argument("--wait-ready", type=float, default=0, metavar="SECONDS",
                   help="first wait up to SECONDS for each server's /readiness to answer 200 (a vsurge server "
                        "still compiling; default 0: do not wait)")
    p.add_argument("--label", action="append", default=None,
                   help="name of each --base-url in the table and the plot, in the same order (default: the URL)")
    p.add_argument("--model", default=None, help="model name (default: each server's first model)")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--shared-prefix-len", type=int, default=0,
                   help="words of a preamble every prompt starts with (prefix caching workload)")
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s (Poisson); inf = all at once")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--concurrency", type=concurrency_levels, default=None, metavar="N[,N...]",
                   help="one run per level, each sending N prompts all at once (replaces --num-prompts, "
                        "--request-rate and --max-concurrency)")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="draw output tok/s and TTFT against concurrency, one line per server (needs matplotlib)")
    p.add_argument("--endpoint", default=None, choices=ENDPOINTS,
                   help="the wire format every request uses (default /v1/completions; with images "
                        "/v1/chat/completions)")
    p.add_argument("--images-per-request", type=int, default=0, metavar="N",
                   help="images in every request (default 0: text only), each its own photo-like JPEG")
    p.add_argument("--image-size", type=image_size, default=(512, 512), metavar="WxH",
                   help="the images' size in pixels (default 512x512)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="every request's sampling temperature (default 0: greedy; most chat clients send ~0.7-1)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--eos-token-id", type=int, default=2, help="banned so every request makes output-len tokens "
                                                               "(-1: do not ban)")
    p.add_argument("--seed", type=int, default=0, help="the random prompts' and images' seed (the same seed, "
                                                       "the same requests: a server's caches may know them)")
    p.add_argument("--json", action="store_true", help="print the raw summary as JSON")


def first_model(base_url: str, api_key: str | None, uds: str | None = None) -> str:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with http_client(uds, timeout=30) as client:
        return client.get(base_url.rstrip("/") + "/v1/models", headers=headers).json()["data"][0]["id"]


def main_from_args(args) -> int:
    if args.uds and args.base_url and len(args.base_url) > 1:
        raise SystemExit("vsurge: error: --uds loads the one server on that socket: give at most one --base-url")
    urls = args.base_url or ["http://localhost" if args.uds else DEFAULT_BASE_URL]
    labels = args.label or []
    if len(labels) > len(urls):
        raise SystemExit(f"vsurge: error: {len(labels)} --label values for {len(urls)} --base-url values")
    labels += [f"unix:{args.uds}" if args.uds else url for url in urls[len(labels):]]
    if len(set(labels)) != len(labels):
        raise SystemExit("vsurge: error: give each server its own --label")
    if args.concurrency and (args.request_rate != float("inf") or args.max_concurrency is not None):
        raise SystemExit("vsurge: error: --concurrency sends each level's prompts all at once; "
                         "drop --request-rate and --max-concurrency")
    if args.temperature < 0:
        raise SystemExit("vsurge: error: --temperature must be 0 or more")
    if args.images_per_request < 0:
        raise SystemExit("vsurge: error: --images-per-request must be 0 or more")
    endpoint = args.endpoint or ("/v1/chat/completions" if args.images_per_request else "/v1/completions")
    if args.images_per_request and endpoint == "/v1/completions":
        raise SystemExit("vsurge: error: /v1/completions takes text only: send images with --endpoint "
                         "/v1/chat/completions, /v1/responses or /v1/messages")
    eos = None if args.eos_token_id < 0 else args.eos_token_id
    # (row name, concurrency, num prompts, rate, max concurrency) per load on each server
    if args.concurrency:
        loads = [(f" @ {n}", n, n, float("inf"), n) for n in args.concurrency]
    else:
        level = min(args.num_prompts, args.max_concurrency or args.num_prompts)
        loads = [("", level, args.num_prompts, args.request_rate, args.max_concurrency)]
    series: dict[str, list[tuple[int, dict]]] = {}
    records, failed = [], 0
    if not args.json:
        if args.images_per_request:
            print(f"each request: {args.images_per_request} image(s) of {args.image_size[0]} x {args.image_size[1]} "
                  f"pixels before its prompt, {endpoint}", flush=True)
        print(TABLE_HEADER, flush=True)
    for label, url in zip(labels, urls):
        if args.wait_ready > 0:
            try:
                wait_ready(url, args.wait_ready, args.uds)
            except TimeoutError as e:
                raise SystemExit(f"vsurge: error: {e}") from None
        model = args.model or first_model(url, args.api_key, args.uds)
        for suffix, level, num_prompts, rate, max_concurrency in loads:
            summary = asyncio.run(run(url, model, num_prompts, args.input_len, args.output_len, rate,
                                      max_concurrency, args.api_key, eos, seed=args.seed,
                                      shared_prefix_len=args.shared_prefix_len,
                                      endpoint=endpoint, images_per_request=args.images_per_request,
                                      image_size=args.image_size, temperature=args.temperature, uds=args.uds))
            series.setdefault(label, []).append((level, summary))
            records.append({"label": label, "base_url": url, "concurrency": level, "summary": summary})
            failed += summary["failed"]
            if not args.json:
                print(format_summary(label + suffix, summary), flush=True)
                if summary.get("server_trace"):
                    print(format_trace(summary), file=sys.stderr, flush=True)
    if args.json:  # one run: the summary itself, as before; several: labelled records
        print(json.dumps(records[0]["summary"] if len(records) == 1 else records, indent=2))
    if args.plot:
        from .bench_plot import plot_summaries

        print(f"plot: {plot_summaries(series, args.plot)}", file=sys.stderr)
    return 0 if failed == 0 else 1
