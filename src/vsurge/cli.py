"""Command line: `vsurge serve`, `vsurge generate PROMPT` and `vsurge chat` on any supported model."""

from __future__ import annotations

import argparse
import sys
import time

from .cli_parallel import add_parallel_args


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="default",
                   help="HF model directory, .gguf file, or 'default' (embedded SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="weights/compute dtype (default: float32 on CPU, bfloat16 on GPU/TPU)")
    p.add_argument("--quantization", default=None, choices=["int8"],
                   help="int8: per-channel int8 weights, faster on CPU (slightly less exact)")
    p.add_argument("--max-tokens", type=int, default=256, help="most new tokens to generate")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (the default)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--max-length", type=int, default=2048, help="context length of the KV cache")
    add_parallel_args(p, multihost=False)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vsurge", description="Run Llama-family models with JAX.")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate a reply to one prompt, streamed to stdout")
    gen.add_argument("prompt", help="the prompt text")
    gen.add_argument("--raw", action="store_true", help="do not apply the chat template")
    _add_model_args(gen)
    chat = sub.add_parser("chat", help="interactive chat with streaming replies")
    chat.add_argument("--system", default=None, help="system prompt")
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
    p.add_argument("--quantization", default=None, choices=["int8"])
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
                   help="comma-separated prompt-row lengths a step may use (default: 512, 128, 32)")
    p.add_argument("--decode-steps", type=int, default=4,
                   help="decode steps per device call while no prompt waits")
    p.add_argument("--engine", default="paged", choices=["dense", "paged"],
                   help="paged: KV pages on demand with prefix caching and preemption; dense: a fixed "
                        "max-length run of pages per slot")
    p.add_argument("--page-size", type=int, default=128, help="tokens per KV page (paged engine)")
    p.add_argument("--num-pages", type=int, default=None,
                   help="KV pages (paged engine; default: --hbm-utilization of the free memory)")
    p.add_argument("--hbm-utilization", type=float, default=0.6,
                   help="fraction of the memory left after the weights that KV pages may take (paged engine)")
    p.add_argument("--no-prefix-caching", action="store_true", help="paged engine: never reuse cached prefixes")
    p.add_argument("--compilation-cache", default="~/.cache/vsurge/xla",
                   help="directory of compiled programs reused across restarts ('none' to disable)")
    p.add_argument("--ssl-keyfile", default=None)
    p.add_argument("--ssl-certfile", default=None)
    p.add_argument("--log-level", default="warning")
    add_parallel_args(p, multihost=True)


def _validate(args) -> None:
    if args.max_tokens < 1:
        raise SystemExit("vsurge: error: --max-tokens must be at least 1")
    if args.temperature < 0:
        raise SystemExit("vsurge: error: --temperature must be non-negative")


def _load(args):
    from .cli_parallel import load_kwargs, validate
    from .loading import load
    from .errors import ModelLoadError

    validate(args)
    print(f"Loading {args.model} ...", file=sys.stderr, flush=True)
    try:
        return load(args.model, dtype=args.dtype, quantization=args.quantization, **load_kwargs(args))
    except (ModelLoadError, ValueError) as e:
        raise SystemExit(f"vsurge: error: {e}") from None


def _stream_reply(generator, processor, prompt_ids, args, out=sys.stdout) -> str:
    """Generate, printing text as it completes; returns the full reply."""
    detok = processor.incremental_detokenizer(prompt_ids=prompt_ids)
    stops = processor.eos_token_ids
    start, first, count = time.perf_counter(), None, 0
    for token in generator.stream(prompt_ids, args.max_tokens, temperature=args.temperature,
                                  seed=args.seed, stop_token_ids=stops):
        first = first or time.perf_counter()
        count += 1
        if token in stops:
            break
        out.write(detok.add([token]))
        out.flush()
    out.write(detok.flush() + "\n")
    out.flush()
    if count > 1:
        rate = (count - 1) / max(time.perf_counter() - first, 1e-9)
        print(f"[{count} tokens, first after {first - start:.2f}s, then {rate:.1f} tok/s]",
              file=sys.stderr, flush=True)
    return detok.text


def cmd_generate(args) -> int:
    from .generation import Generator

    _validate(args)
    model, processor = _load(args)
    if args.raw:
        prompt_ids = processor.encode(args.prompt)
    else:
        prompt_ids = processor.apply_chat_template([{"role": "user", "content": args.prompt}])
    print("Compiling ...", file=sys.stderr, flush=True)
    _stream_reply(Generator(model, max_length=args.max_length), processor, prompt_ids, args)
    return 0


def cmd_chat(args) -> int:
    from .generation import Generator

    _validate(args)
    model, processor = _load(args)
    generator = Generator(model, max_length=args.max_length)
    history = [{"role": "system", "content": args.system}] if args.system else []
    print("Chat with the model. Empty line or Ctrl-D to quit.", file=sys.stderr, flush=True)
    while True:
        try:
            line = input("> ")
        except EOFError:
            break
        if not line.strip():
            break
        history.append({"role": "user", "content": line})
        prompt_ids = processor.apply_chat_template(history)
        reply = _stream_reply(generator, processor, prompt_ids, args)
        history.append({"role": "assistant", "content": reply})
    return 0


def cmd_serve(args) -> int:
    import logging
    from pathlib import Path

    from .server import vSurgeApiServer
    from .vsurge import vSurge

    if (args.max_concurrent_decodes is not None and args.max_concurrent_decodes < 1) or args.max_queue < 0 \
            or args.max_length < 2:
        raise SystemExit("vsurge: error: --max-concurrent-decodes, --max-queue and --max-length must be positive")
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    from . import cli_parallel

    multihost = cli_parallel.init_distributed(args)  # before anything else touches JAX
    if args.compilation_cache and args.compilation_cache.lower() != "none":
        from .vinference.persistence import use_compilation_cache

        use_compilation_cache(Path(args.compilation_cache).expanduser())
    model, processor = _load(args)
    buckets = [int(x) for x in args.prefill_lengths.split(",")] if args.prefill_lengths else None
    name = args.served_model_name or (model.config.name if args.model != "default" else "SmolLM2-135M-Instruct")
    common = dict(max_concurrent_decodes=args.max_concurrent_decodes, prefill_lengths=buckets,
                  max_prefill_length=args.max_prefill_length, max_length=args.max_length, vsurge_name=name,
                  max_queue=args.max_queue, prefill_tokens=args.prefill_tokens, decode_steps=args.decode_steps,
                  **cli_parallel.load_kwargs(args))
    try:
        if args.engine == "paged":
            surge = vSurge.create_odriver(model, processor, page_size=args.page_size, num_pages=args.num_pages,
                                          hbm_utilization=args.hbm_utilization,
                                          enable_prefix_caching=not args.no_prefix_caching, **common)
            manager = surge.engine.manager
            print(f"Paged KV cache: {manager.num_pages} pages of {manager.page_size} tokens "
                  f"({manager.max_tokens} tokens)", file=sys.stderr, flush=True)
        else:
            surge = vSurge.create_vdriver(model, processor, **common)
    except ValueError as e:
        raise SystemExit(f"vsurge: error: {e}") from None
    if multihost and cli_parallel.is_follower():
        return cli_parallel.follow(surge)
    server = vSurgeApiServer({name: surge}, api_key=args.api_key)
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


def cmd_bench(args) -> int:
    from .bench_serve import main_from_args

    return main_from_args(args)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    handlers = {"generate": cmd_generate, "chat": cmd_chat, "serve": cmd_serve, "bench": cmd_bench}
    return handlers[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
