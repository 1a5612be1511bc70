"""Command line: `vsurge serve`, `vsurge generate PROMPT` and `vsurge chat` on any supported model."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .cli_parallel import add_parallel_args
from .config import QUANTIZATIONS
from .kv import KV_CACHE_DTYPES

DEFAULT_MAX_TOKENS = 512  # per reply, when neither --max-tokens nor the model's generation config says
DEFAULT_COMPILATION_CACHE = "~/.cache/vsurge/xla"
COMPILATION_CACHE_ENV = "VSURGE_COMPILATION_CACHE"  # overrides the default directory (e.g. for tests)


QUANTIZATION_CHOICES = list(QUANTIZATIONS)
QUANTIZATION_HELP = ("blocks: keep a GGUF file's or an AWQ/GPTQ checkpoint's blocks (the default on CPU); none: "
                     "dequantize them; int8 / fp8: per-channel int8 / float8_e4m3fn weights (fp8: for GPUs with fp8 "
                     "arithmetic); int4 / q8_0: weights "
                     "quantized at load to GGUF q4_0 / q8_0 blocks (one scale per 32 weights) for the block kernel; "
                     "int4_g64, int4_g128, int8_g64, int8_g128: one scale per 64 / 128 weights")


def _default_cache() -> str:
    return os.environ.get(COMPILATION_CACHE_ENV) or DEFAULT_COMPILATION_CACHE


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="default",
                   help="HF model directory, .gguf file, or 'default' (embedded SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="weights dtype, dequantizing a GGUF file's blocks (default: a GGUF file keeps its blocks "
                        "on CPU; other weights bfloat16 where the CPU multiplies it natively, else float32)")
    p.add_argument("--quantization", default=None, choices=QUANTIZATION_CHOICES, help=QUANTIZATION_HELP)
    p.add_argument("--max-length", type=int, default=2048,
                   help="context length: the conversation plus the reply (default 2048, at most the model's)")
    p.add_argument("--compilation-cache", default=_default_cache(),
                   help=f"directory of compiled programs reused across runs ('none' to disable; default "
                        f"${COMPILATION_CACHE_ENV} or {DEFAULT_COMPILATION_CACHE}, shared with `vsurge serve`)")
    add_parallel_args(p, multihost=False)


def _add_generation_config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--generation-config", default="auto", metavar="auto|vsurge|PATH",
                   help="sampling defaults: auto = the model's (generation_config.json, GGUF general.sampling.*) "
                        "over vsurge's; vsurge = vsurge's only; PATH = a generation_config.json (default auto)")


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    """One flag per SamplingParams field that declares `cli=` flags (sampling_params.py)."""
    from .generation_defaults import VSURGE_DEFAULTS
    from .sampling_params import cli_fields

    g = p.add_argument_group("sampling (unset: from --generation-config; --temperature 0 is greedy)")
    for name, spec, kind in cli_fields():
        default = DEFAULT_MAX_TOKENS if name == "max_tokens" else VSURGE_DEFAULTS.values.get(name)
        shown = f" (default {default:g})" if isinstance(default, (int, float)) and name != "seed" else ""
        if name == "stop":
            g.add_argument(*spec.cli, dest=name, action="append", default=None, metavar="TEXT", help=spec.help)
        else:
            g.add_argument(*spec.cli, dest=name, type=kind, default=None, help=spec.help + shown)
    _add_generation_config_arg(g)


def _add_prompt_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--system", default=None, help="system prompt")
    p.add_argument("--file", "-f", default=None, help="read the prompt from this file ('-' = stdin)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object per reply (text, tokens, finish_reason, timings) instead of text")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vsurge", description="Run Llama-family models with JAX.")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate a reply to one prompt, streamed to stdout")
    gen.add_argument("prompt", nargs="?", help="the prompt text (or --file)")
    gen.add_argument("--raw", action="store_true", help="do not apply the chat template")
    gen.add_argument("--json-schema", default=None, metavar="FILE",
                     help="constrain the reply to this JSON schema (a file; '-' = stdin)")
    gen.add_argument("--regex", default=None, help="constrain the reply to match this regular expression")
    _add_prompt_args(gen)
    _add_sampling_args(gen)
    _add_model_args(gen)
    chat = sub.add_parser("chat", help="interactive chat with streaming replies",
                          description="Interactive chat. A line ending with \\ continues on the next line; "
                                      '""" opens and closes a multi-line block. /reset forgets the conversation, '
                                      "/exit or Ctrl-D quits; Ctrl-C stops a reply, and quits at the prompt.")
    _add_prompt_args(chat)
    _add_sampling_args(chat)
    _add_model_args(chat)
    serve = sub.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API")
    _add_serve_args(serve)
    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    from .bench_serve import add_arguments

    add_arguments(bench_sub.add_parser("serve", help="load-test an OpenAI-compatible server (like vllm bench serve)"))
    return parser


def _add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="default",
                   help="HF model directory, .gguf file, or 'default' (embedded SmolLM2-135M-Instruct)")
    p.add_argument("--served-model-name", default=None, help="the name clients use (default: from the model)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    p.add_argument("--quantization", default=None, choices=QUANTIZATION_CHOICES, help=QUANTIZATION_HELP)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=11556)
    p.add_argument("--metrics-port", type=int, default=None, help="Prometheus port (default port+1, -1: off)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1/*")
    p.add_argument("--max-concurrent-decodes", type=int, default=None,
                   help="sequences generating at once (default: chosen for the machine, 32 on a small CPU)")
    p.add_argument("--max-queue", type=int, default=256, help="requests waiting for a slot before 503")
    p.add_argument("--max-length", type=int, default=2048, help="context length per sequence (prompt + output)")
    p.add_argument("--max-prefill-length", type=int, default=None, help="longest prompt (default: max-length - 1)")
    p.add_argument("--prefill-tokens", type=int, default=512,
                   help="prompt tokens one step computes (prompts longer than this take several steps)")
    p.add_argument("--prefill-lengths", default=None,
                   help="comma-separated prompt-row lengths a step may use (default: prefill-tokens and 1/16 of it)")
    p.add_argument("--decode-steps", type=int, default=4,
                   help="decode steps per device call while no prompt waits")
    p.add_argument("--no-async-scheduling", action="store_true",
                   help="read each step's tokens before planning the next (default: the next step is planned "
                        "and dispatched while the device runs this one, fed its tokens on the device)")
    p.add_argument("--engine", default="paged", choices=["dense", "paged"],
                   help="paged: KV pages on demand with prefix caching and preemption; dense: a fixed "
                        "max-length run of pages per slot")
    p.add_argument("--page-size", type=int, default=128, help="tokens per KV page (paged engine)")
    p.add_argument("--num-pages", type=int, default=None,
                   help="KV pages (paged engine; default: --hbm-utilization of the free memory)")
    p.add_argument("--hbm-utilization", type=float, default=0.6,
                   help="fraction of the memory left after the weights that KV pages may take (paged engine)")
    p.add_argument("--no-prefix-caching", action="store_true", help="paged engine: never reuse cached prefixes")
    p.add_argument("--kv-host-cache-gb", type=float, default=None,
                   help="host-memory tier of the prefix cache: pages evicted from the KV pool (and those of "
                        "preempted sequences) are kept there and copied back on a hit (default: 0 on CPU, where "
                        "the pool is already host memory; a quarter of the free RAM, at most 64, on accelerators)")
    p.add_argument("--kv-cache-dir", default=None,
                   help="disk tier of the prefix cache: prefix pages persist in this directory across restarts")
    p.add_argument("--kv-cache-dir-gb", type=float, default=4.0, help="size cap of --kv-cache-dir (LRU)")
    p.add_argument("--kv-prefetch-gb", type=float, default=0.5,
                   help="at start-up, read this much of --kv-cache-dir's most recent pages into the KV pool (0: none)")
    p.add_argument("--kv-cache-dtype", default="auto", choices=list(KV_CACHE_DTYPES),
                   help="how the paged KV pool stores keys and values: auto (the model's activation dtype; on a "
                        "CPU with vsurge's C++ kernels float16, as llama.cpp's default cache); float32; bfloat16 or "
                        "float16 (a float32 model's cache in half the memory); int8 or "
                        "fp8 (float8_e4m3fn), each token's vector per KV head with a float16 scale: about twice "
                        "the pages of a bfloat16 pool in the same memory (the start-up line prints them)")
    p.add_argument("--prefix-wait-steps", type=int, default=64,
                   help="steps a prompt may wait for a prefix another request is computing (0: never wait)")
    p.add_argument("--scheduling-policy", default="fcfs", choices=["fcfs", "priority"],
                   help="priority: requests' `priority` (lower first) orders the queue, and a waiting request "
                        "preempts a running one of lower priority (default fcfs: first come, first served)")
    p.add_argument("--speculative-tokens", type=int, default=0,
                   help="prompt-lookup drafts per greedy request and step (0 = off; requests may set their own)")
    from .structured.reasoning import REASONING_PARSERS
    from .structured.tool_parsers import PARSER_NAMES

    p.add_argument("--tool-call-parser", default="auto", choices=list(PARSER_NAMES),
                   help="how tool calls are read from the model's text (auto: from the chat template)")
    p.add_argument("--reasoning-parser", default=None, choices=list(REASONING_PARSERS),
                   help="split <think> reasoning from answers: chat reasoning_content, Responses reasoning items, "
                        "Messages thinking blocks (default: off)")
    p.add_argument("--pooling", default="auto", choices=["auto", "mean", "last"],
                   help="/v1/embeddings: the mean of the final hidden states or the last token's (auto: the model's "
                        "sentence-transformers pooling config, else last)")
    p.add_argument("--responses-store-size", type=int, default=1000,
                   help="/v1/responses kept for previous_response_id and GET (oldest dropped beyond; 0: none)")
    p.add_argument("--responses-store-ttl", type=float, default=3600.0,
                   help="seconds a stored response is kept (default 3600)")
    p.add_argument("--compilation-cache", default=_default_cache(),
                   help=f"directory of compiled programs reused across restarts ('none' to disable; default "
                        f"${COMPILATION_CACHE_ENV} or {DEFAULT_COMPILATION_CACHE})")
    _add_generation_config_arg(p)
    p.add_argument("--ssl-keyfile", default=None)
    p.add_argument("--ssl-certfile", default=None)
    p.add_argument("--log-level", default="warning")
    add_parallel_args(p, multihost=True)


def _fail(message: str) -> SystemExit:
    return SystemExit(f"vsurge: error: {message}")


def _generation_defaults(args):
    from .errors import ModelLoadError
    from .generation_defaults import resolve_generation_defaults
    from .loading import resolve_model_path

    try:
        path = resolve_model_path(args.model)
    except ModelLoadError as e:
        raise _fail(str(e)) from None
    try:
        return resolve_generation_defaults(args.generation_config, path)
    except (ModelLoadError, ValueError) as e:
        raise _fail(f"--generation-config {args.generation_config}: {e}") from None


def _sampling_params(args, defaults, seed: int):
    """The flags over the generation defaults -> SamplingParams (bad values exit with the flag's name)."""
    if args.max_tokens is not None and args.max_tokens < 1:
        raise _fail("--max-tokens must be at least 1")
    from .sampling_params import cli_fields

    flags = {name: spec.cli[0] for name, spec, _ in cli_fields()}
    explicit = {name: getattr(args, name) for name in flags}
    explicit.update(seed=seed, max_tokens=args.max_tokens or defaults.max_tokens or DEFAULT_MAX_TOKENS)
    try:
        return defaults.sampling_params(**explicit)
    except ValueError as e:  # the message in the user's words: the flag, not the field
        message, field = str(e), getattr(e, "param", None)
        if field in flags and message.startswith(field + " "):
            message = flags[field] + message[len(field):]
        raise _fail(message) from None


def _check_model_args(args) -> None:
    from .cli_parallel import validate

    validate(args)
    if args.max_length < 2:
        raise _fail("--max-length must be at least 2")


def _read_prompt_file(path: str, flag: str = "--file") -> str:
    """The file's text without its final newline (as llama.cpp's -f), which editors add and models notice."""
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(os.path.expanduser(path), encoding="utf-8") as f:
                text = f.read()
    except OSError as e:
        raise _fail(f"cannot read {flag} {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise _fail(f"{flag} {path} is not UTF-8 text") from None
    return text[:-1] if text.endswith("\n") else text


def _prepare(args):
    """Everything that can fail on the arguments, checked before the model loads: (defaults, params)."""
    import secrets

    _check_model_args(args)
    defaults = _generation_defaults(args)
    seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
    return defaults, _sampling_params(args, defaults, seed)


def _start_engine(args):
    from .cli_engine import LocalEngine

    return LocalEngine.start(args.model, dtype=args.dtype, quantization=args.quantization,
                             max_length=args.max_length, compilation_cache=args.compilation_cache,
                             tensor_parallel_size=args.tensor_parallel_size)


def _describe_sampling(params, defaults) -> str:
    if params.temperature == 0:
        return "Sampling: greedy" + (f", repetition_penalty {params.repetition_penalty:g}"
                                     if params.repetition_penalty != 1 else "")
    return (f"Sampling: temperature {params.temperature:g}, top_k {params.top_k}, top_p {params.top_p:g}, "
            f"min_p {params.min_p:g}, repetition_penalty {params.repetition_penalty:g}, seed {params.seed} "
            f"(unset flags: {defaults.source})")


def _structured(args):
    """--json-schema / --regex -> a StructuredOutput (checked before the model loads), or None."""
    from .structured.spec import StructuredOutput

    if args.json_schema is not None and args.regex is not None:
        raise _fail("give --json-schema or --regex, not both")
    try:
        if args.json_schema is not None:
            return StructuredOutput(json=_read_prompt_file(args.json_schema, "--json-schema"))
        if args.regex is not None:
            return StructuredOutput(regex=args.regex)
    except ValueError as e:
        raise _fail(f"--json-schema {args.json_schema}: {e}" if args.json_schema else f"--regex: {e}") from None
    return None


def cmd_generate(args) -> int:
    import json

    from .cli_chat import write_text
    from .cli_engine import status

    if args.prompt is not None and args.file is not None:
        raise _fail("give the prompt as an argument or with --file, not both")
    if args.prompt is None and args.file is None:
        raise _fail("give a prompt: vsurge generate \"...\" (or --file PATH)")
    text = args.prompt if args.prompt is not None else _read_prompt_file(args.file)
    if not text.strip():
        raise _fail("the prompt is empty")
    defaults, params = _prepare(args)
    params = params.replace(structured=_structured(args))
    with _start_engine(args) as engine:
        if args.raw:
            ids = engine.raw_prompt(text)
        else:
            messages = ([{"role": "system", "content": args.system}] if args.system else []) + \
                [{"role": "user", "content": text}]
            ids = engine.chat_prompt(messages)
        if len(ids) >= engine.max_length:
            raise _fail(f"the prompt has {len(ids)} tokens; the context (--max-length) holds {engine.max_length}")
        params = params.replace(max_tokens=min(params.max_tokens, engine.max_length - len(ids)))
        status(_describe_sampling(params, defaults))
        try:
            reply = engine.reply(ids, params, on_text=None if args.json else write_text)
        except ValueError as e:  # the engine refused the request (its message says why)
            raise _fail(str(e)) from None
        if args.json:
            print(json.dumps(reply.as_json(), ensure_ascii=False), flush=True)
        else:
            write_text("\n")
            status(reply.timing_line())
    return 130 if reply.finish_reason == "interrupted" else 0


def cmd_chat(args) -> int:
    from .cli_chat import run_chat
    from .cli_engine import status

    defaults, params = _prepare(args)
    first = _read_prompt_file(args.file) if args.file else None
    with _start_engine(args) as engine:
        status(_describe_sampling(params, defaults))
        return run_chat(engine, params, system=args.system, as_json=args.json, first_message=first)


def _load(args):
    from .cli_parallel import load_kwargs, validate
    from .errors import ModelLoadError
    from .loading import load

    validate(args)
    print(f"Loading {args.model} ...", file=sys.stderr, flush=True)
    try:
        return load(args.model, dtype=args.dtype, quantization=args.quantization,
                    expert_parallel=getattr(args, "enable_expert_parallel", False), **load_kwargs(args))
    except (ModelLoadError, ValueError) as e:
        raise _fail(str(e)) from None


def cmd_serve(args) -> int:
    import logging

    from .cli_engine import describe_kv_pool, describe_model, status, use_cache_dir
    from .server import vSurgeApiServer
    from .vsurge import vSurge

    if (args.max_concurrent_decodes is not None and args.max_concurrent_decodes < 1) or args.max_queue < 0 \
            or args.max_length < 2:
        raise SystemExit("vsurge: error: --max-concurrent-decodes, --max-queue and --max-length must be positive")
    if not 0 <= args.speculative_tokens <= 16:
        raise _fail("--speculative-tokens must be in [0, 16]")
    if ((args.kv_host_cache_gb or 0) < 0 or args.kv_cache_dir_gb <= 0 or args.prefix_wait_steps < 0
            or args.kv_prefetch_gb < 0):
        raise _fail("--kv-host-cache-gb, --kv-prefetch-gb and --prefix-wait-steps must be >= 0, --kv-cache-dir-gb > 0")
    if args.responses_store_size < 0 or args.responses_store_ttl <= 0:
        raise _fail("--responses-store-size must be >= 0 and --responses-store-ttl > 0")
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    from . import cli_parallel

    multihost = cli_parallel.init_distributed(args)  # before anything else touches JAX
    defaults = _generation_defaults(args)
    use_cache_dir(args.compilation_cache)
    model, processor = _load(args)
    status(describe_model(model))
    buckets = [int(x) for x in args.prefill_lengths.split(",")] if args.prefill_lengths else None
    name = args.served_model_name or (model.config.name or Path(args.model).name.removesuffix(".gguf")
                                      if args.model != "default" else "SmolLM2-135M-Instruct")
    parallel = (cli_parallel.disaggregated_kwargs(args) if cli_parallel.disaggregated(args)
                else cli_parallel.load_kwargs(args))
    common = dict(max_concurrent_decodes=args.max_concurrent_decodes, prefill_lengths=buckets,
                  max_prefill_length=args.max_prefill_length, max_length=args.max_length, vsurge_name=name,
                  max_queue=args.max_queue, prefill_tokens=args.prefill_tokens, decode_steps=args.decode_steps,
                  async_scheduling=not args.no_async_scheduling, speculative_tokens=args.speculative_tokens,
                  scheduling_policy=args.scheduling_policy, kv_cache_dtype=args.kv_cache_dtype, **parallel)
    try:
        if args.engine == "paged":
            from .kv.memory import default_host_cache_bytes

            host = (default_host_cache_bytes() if args.kv_host_cache_gb is None
                    else int(args.kv_host_cache_gb * 2**30))
            surge = vSurge.create_odriver(model, processor, page_size=args.page_size, num_pages=args.num_pages,
                                          hbm_utilization=args.hbm_utilization,
                                          enable_prefix_caching=not args.no_prefix_caching,
                                          kv_host_cache_bytes=host, kv_cache_dir=args.kv_cache_dir,
                                          kv_disk_cache_bytes=int(args.kv_cache_dir_gb * 2**30),
                                          kv_disk_prefetch_bytes=int(args.kv_prefetch_gb * 2**30),
                                          prefix_wait_steps=args.prefix_wait_steps, **common)
            for engine in surge.driver.engines:
                status(describe_kv_pool(model, engine))
        else:
            surge = vSurge.create_vdriver(model, processor, **common)
    except ValueError as e:
        raise SystemExit(f"vsurge: error: {e}") from None
    if multihost and cli_parallel.is_follower():
        return cli_parallel.follow(surge)
    from .server.adapters.response_store import ResponseStore

    server = vSurgeApiServer({name: surge}, api_key=args.api_key, tool_call_parser=args.tool_call_parser,
                             reasoning_parser=args.reasoning_parser,
                             response_store=ResponseStore(args.responses_store_size, args.responses_store_ttl))
    server.generation_defaults = {name: defaults}  # what requests get for the sampling fields they leave unset
    server.pooling = {name: _pooling(args)}
    status(f"Sampling defaults for unset request fields: {defaults.describe()}")
    scheme = "https" if args.ssl_certfile else "http"
    print(f"Compiling {name} (readiness answers 503 until done) ...", file=sys.stderr, flush=True)

    def announce():
        from .server.web import page_url

        print(f"vsurge: serving {name} at {scheme}://{args.host}:{args.port}/v1 "
              f"(metrics on port {args.metrics_port or args.port + 1}); "
              f"chat page and dashboard: {page_url(scheme, args.host, args.port)}", file=sys.stderr, flush=True)

    server.fire(host=args.host, port=args.port, metrics_port=args.metrics_port, log_level=args.log_level,
                ssl_keyfile=args.ssl_keyfile, ssl_certfile=args.ssl_certfile, on_ready=announce)
    cli_parallel.exit_after_serving(surge)
    return 0


def _pooling(args) -> str:
    if args.pooling != "auto":
        return args.pooling
    from .loading import resolve_model_path
    from .server.adapters.embeddings import pooling_for_model

    return pooling_for_model(resolve_model_path(args.model))


def cmd_bench(args) -> int:
    from .bench_serve import main_from_args

    return main_from_args(args)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    handlers = {"generate": cmd_generate, "chat": cmd_chat, "serve": cmd_serve, "bench": cmd_bench}
    try:
        return handlers[args.command](args)
    except KeyboardInterrupt:  # Ctrl-C while loading or compiling: no traceback
        print("\nvsurge: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
