"""The commands: `vsurge serve`, `vsurge generate PROMPT`, `vsurge chat` on any supported model, and
`vsurge bench serve` (bench_serve.py); `main` parses the flags (arguments.py) and runs one."""

from __future__ import annotations

import os
import sys
import threading

from .arguments import DEFAULT_MAX_TOKENS, build_parser
from .serve_build import build_server, serving_line
from .support import engine_flags, fail, model_generation_defaults


def _sampling_params(args, defaults, seed: int):
    """The flags over the generation defaults -> SamplingParams (bad values exit with the flag's name)."""
    if args.max_tokens is not None and args.max_tokens < 1:
        raise fail("--max-tokens must be at least 1")
    from ..sampling.params import cli_fields

    flags = {name: spec.cli[0] for name, spec, _ in cli_fields()}
    explicit = {name: getattr(args, name) for name in flags}
    explicit.update(seed=seed, max_tokens=args.max_tokens or defaults.max_tokens or DEFAULT_MAX_TOKENS)
    try:
        return defaults.sampling_params(**explicit)
    except ValueError as e:  # the message in the user's words: the flag, not the field
        message, field = str(e), getattr(e, "param", None)
        if field in flags and message.startswith(field + " "):
            message = flags[field] + message[len(field):]
        raise fail(message) from None


def _check_model_args(args) -> None:
    from ..scale.flags import validate

    validate(args)
    engine_flags(args)


def _read_prompt_file(path: str, flag: str = "--file") -> str:
    """The file's text without its final newline (as llama.cpp's -f), which editors add and models notice."""
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(os.path.expanduser(path), encoding="utf-8") as f:
                text = f.read()
    except OSError as e:
        raise fail(f"cannot read {flag} {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise fail(f"{flag} {path} is not UTF-8 text") from None
    return text[:-1] if text.endswith("\n") else text


def _prepare(args):
    """Everything that can fail on the arguments, checked before the model loads: (defaults, params)."""
    import secrets

    _check_model_args(args)
    defaults = model_generation_defaults(args)
    seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
    return defaults, _sampling_params(args, defaults, seed)


def _start_engine(args):
    from .local_engine import LocalEngine

    return LocalEngine.start(args.model, dtype=args.dtype, quantization=args.quantization,
                             activation_passes=args.activation_passes, settings=engine_flags(args),
                             compilation_cache=args.compilation_cache, tensor_parallel_size=args.tensor_parallel_size,
                             lora=args.lora, mmproj=args.mmproj)


def _describe_sampling(params, defaults) -> str:
    if params.temperature == 0:
        return "Sampling: greedy" + (f", repetition_penalty {params.repetition_penalty:g}"
                                     if params.repetition_penalty != 1 else "")
    return (f"Sampling: temperature {params.temperature:g}, top_k {params.top_k}, top_p {params.top_p:g}, "
            f"min_p {params.min_p:g}, repetition_penalty {params.repetition_penalty:g}, seed {params.seed} "
            f"(unset flags: {defaults.source})")


def _structured(args):
    """--json-schema / --regex -> a StructuredOutput (checked before the model loads), or None."""
    from ..structured.spec import StructuredOutput

    if args.json_schema is not None and args.regex is not None:
        raise fail("give --json-schema or --regex, not both")
    try:
        if args.json_schema is not None:
            return StructuredOutput(json=_read_prompt_file(args.json_schema, "--json-schema"))
        if args.regex is not None:
            return StructuredOutput(regex=args.regex)
    except ValueError as e:
        raise fail(f"--json-schema {args.json_schema}: {e}" if args.json_schema else f"--regex: {e}") from None
    return None


def cmd_generate(args) -> int:
    import json

    from .chat_session import write_text
    from .local_engine import status

    if args.prompt is not None and args.file is not None:
        raise fail("give the prompt as an argument or with --file, not both")
    if args.prompt is None and args.file is None:
        raise fail("give a prompt: vsurge generate \"...\" (or --file PATH)")
    text = args.prompt if args.prompt is not None else _read_prompt_file(args.file)
    if not text.strip():
        raise fail("the prompt is empty")
    if args.image and args.raw:
        raise fail("--image needs the chat template (not --raw)")
    images = [_read_image(path) for path in args.image]
    defaults, params = _prepare(args)
    params = params.replace(structured=_structured(args))
    with _start_engine(args) as engine:
        if args.raw:
            ids = engine.raw_prompt(text)
        else:
            content = [{"type": "image", "data": data} for data in images] + [{"type": "text", "text": text}]
            messages = ([{"role": "system", "content": args.system}] if args.system else []) + \
                [{"role": "user", "content": content if images else text}]
            try:
                ids = engine.chat_prompt(messages)
            except ValueError as e:
                raise fail(str(e)) from None
        if len(ids) >= engine.max_length:
            raise fail(f"the prompt has {len(ids)} tokens; the context (--max-length) holds {engine.max_length}")
        params = params.replace(max_tokens=min(params.max_tokens, engine.max_length - len(ids)))
        status(_describe_sampling(params, defaults))
        try:
            reply = engine.reply(ids, params, on_text=None if args.json else write_text)
        except ValueError as e:  # the engine refused the request (its message says why)
            raise fail(str(e)) from None
        if args.json:
            print(json.dumps(reply.as_json(), ensure_ascii=False), flush=True)
        else:
            write_text("\n")
            status(reply.timing_line())
    return 130 if reply.finish_reason == "interrupted" else 0


def _read_image(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise fail(f"--image {path}: {e.strerror}") from None


def cmd_chat(args) -> int:
    from .chat_session import run_chat
    from .local_engine import status

    defaults, params = _prepare(args)
    first = _read_prompt_file(args.file) if args.file else None
    with _start_engine(args) as engine:
        status(_describe_sampling(params, defaults))
        return run_chat(engine, params, system=args.system, as_json=args.json, first_message=first)


def cmd_serve(args) -> int:
    if getattr(args, "ray", False):  # replicas on a Ray cluster, each built by build_server (scale/ray_serve/)
        from ..scale.ray_serve.launch import serve_on_ray

        return serve_on_ray(args)
    built = build_server(args)
    if isinstance(built, int):  # a multi-host follower's exit status
        return built
    server, surge = built
    name = surge.vsurge_name
    scheme = "https" if args.ssl_certfile else "http"
    if (args.guard_metrics or args.uds) and args.metrics_port is None:
        # the separate Prometheus port takes no key, and --uds asks for no TCP: off unless named
        args.metrics_port = -1
    print(f"Compiling {name} (readiness answers 503 until done) ...", file=sys.stderr, flush=True)

    def announce():
        from ..server.memory_stats import describe, memory_stats

        memory = describe(memory_stats(list(server.surges.values())))
        for served in server.surges.values():
            summary = getattr(served.engine, "compile_summary", None)
            if summary:
                print(f"{served.vsurge_name}: compiled {summary}", file=sys.stderr, flush=True)
            deferred = getattr(served.engine, "deferred", None)
            if deferred is not None and deferred.pending:
                announce_deferred(served.vsurge_name, deferred)
        print(serving_line(name, scheme, args) + (f"; {memory}" if memory else ""), file=sys.stderr, flush=True)

    from ..scale import flags as scale_flags

    try:
        server.fire(host=args.host, port=args.port, metrics_port=args.metrics_port, log_level=args.log_level,
                    ssl_keyfile=args.ssl_keyfile, ssl_certfile=args.ssl_certfile, on_ready=announce, uds=args.uds)
    finally:  # also when the engine's failure ends the server: a lost follower's leader must not tear down
        scale_flags.exit_after_serving(surge)  # the distributed runtime (it aborted there once: status -6, not 1)
    return 0


def announce_deferred(name: str, deferred) -> None:
    """Say that the rest of the step programs compile while serving, and when they are done."""
    print(f"{name}: {deferred.pending} more step programs compile in the background (--compile-at-start all: "
          f"before ready)", file=sys.stderr, flush=True)

    def when_done():
        deferred.wait()
        if deferred.stopped:  # (the server stopped first)
            return
        print(f"{name}: the background programs are compiled ({deferred.seconds or 0:.1f} s): every row count "
              f"and chunk shape is served", file=sys.stderr, flush=True)

    threading.Thread(target=when_done, name="vsurge-deferred-announce", daemon=True).start()


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
