"""The commands: `vsurge serve`, `vsurge generate PROMPT`, `vsurge chat` on any supported model, and
`vsurge bench serve` (bench_serve.py); `main` parses the flags (arguments.py) and runs one."""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

from ..engine.engine_config import EngineConfig
from . import served_models
from .arguments import DEFAULT_MAX_TOKENS, build_parser, runtime_lora_allowed


def _fail(message: str) -> SystemExit:
    return SystemExit(f"vsurge: error: {message}")


def _generation_defaults(args):
    from ..errors import ModelLoadError
    from ..generation_defaults import resolve_generation_defaults
    from ..loading import resolve_model_path

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
    from ..sampling_params import cli_fields

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
    from ..scale.flags import validate

    validate(args)
    _engine_flags(args)


def _engine_flags(args) -> dict:
    """The EngineConfig settings given on the command line (engine/engine_config.py), each checked."""
    try:
        return EngineConfig.flag_values(args)
    except ValueError as e:
        raise _fail(str(e)) from None


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
    from .local_engine import LocalEngine

    return LocalEngine.start(args.model, dtype=args.dtype, quantization=args.quantization,
                             activation_passes=args.activation_passes, settings=_engine_flags(args),
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

    from .chat_session import write_text
    from .local_engine import status

    if args.prompt is not None and args.file is not None:
        raise _fail("give the prompt as an argument or with --file, not both")
    if args.prompt is None and args.file is None:
        raise _fail("give a prompt: vsurge generate \"...\" (or --file PATH)")
    text = args.prompt if args.prompt is not None else _read_prompt_file(args.file)
    if not text.strip():
        raise _fail("the prompt is empty")
    if args.image and args.raw:
        raise _fail("--image needs the chat template (not --raw)")
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
                raise _fail(str(e)) from None
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


def _read_image(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise _fail(f"--image {path}: {e.strerror}") from None


def cmd_chat(args) -> int:
    from .chat_session import run_chat
    from .local_engine import status

    defaults, params = _prepare(args)
    first = _read_prompt_file(args.file) if args.file else None
    with _start_engine(args) as engine:
        status(_describe_sampling(params, defaults))
        return run_chat(engine, params, system=args.system, as_json=args.json, first_message=first)


def _load(args):
    from ..scale.flags import load_kwargs, validate
    from ..errors import ModelLoadError
    from ..loading import load

    validate(args)
    print(f"Loading {args.model} ...", file=sys.stderr, flush=True)
    try:
        return load(args.model, dtype=args.dtype, quantization=args.quantization,
                    activation_passes=getattr(args, "activation_passes", None), mmproj=getattr(args, "mmproj", None),
                    expert_parallel=getattr(args, "enable_expert_parallel", False), **load_kwargs(args))
    except (ModelLoadError, ValueError) as e:
        raise _fail(str(e)) from None


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
        print(_serving_line(name, scheme, args) + (f"; {memory}" if memory else ""), file=sys.stderr, flush=True)

    server.fire(host=args.host, port=args.port, metrics_port=args.metrics_port, log_level=args.log_level,
                ssl_keyfile=args.ssl_keyfile, ssl_certfile=args.ssl_certfile, on_ready=announce, uds=args.uds)
    from ..scale import flags as scale_flags

    scale_flags.exit_after_serving(surge)
    return 0


def build_server(args):
    """`vsurge serve`'s models and server from its flags, not started: (vSurgeApiServer, first vSurge), or a
    multi-host follower's exit status. A Ray Serve replica builds its server here too (scale/ray_serve/)."""
    from ..engine import memory_ledger

    memory_ledger.mark("start")  # before anything heavy is imported: the interpreter and the CLI alone
    import logging

    from .local_engine import describe_kv_pool, describe_model, status, use_cache_dir
    from ..server import vSurgeApiServer
    from ..vsurge import vSurge

    settings = _engine_flags(args)
    loras = _lora_flags(args)
    if (loras or runtime_lora_allowed(args)) and not settings.get("max_loras"):
        settings["max_loras"] = 4
    if args.max_queue < 0:
        raise _fail(f"--max-queue must be at least 0, got {args.max_queue}")
    if args.responses_store_size < 0 or args.responses_store_ttl <= 0:
        raise _fail("--responses-store-size must be >= 0 and --responses-store-ttl > 0")
    if args.uds:  # checked (and a dead server's socket file cleared) before the model loads
        from ..server.unix_socket import claim_socket_path

        try:
            args.uds = claim_socket_path(args.uds)
        except ValueError as e:
            raise _fail(str(e)) from None
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    from ..scale import flags as scale_flags

    multihost = scale_flags.init_distributed(args)  # before anything else touches JAX
    memory_ledger.mark_runtime()
    try:
        specs = served_models.model_specs(args)
    except ValueError as e:
        raise _fail(str(e)) from None
    served_models.check(args, specs, _fail)
    if args.mmproj and served_models.several(args, specs):
        raise _fail("--mmproj goes with one --model; to serve several, give a model's mmproj as its \"mmproj\" "
                    "in --models-config")
    first_name, args.model = specs[0]
    use_cache_dir(args.compilation_cache)
    parallel = (scale_flags.disaggregated_kwargs(args) if scale_flags.disaggregated(args)
                else scale_flags.load_kwargs(args))
    if parallel and served_models.several(args, specs):
        raise _fail("several models per server are served on one device each for now (no --tensor-parallel-size, "
                    "--data-parallel-size or disaggregated devices with them)")
    paged = args.engine == "paged"
    if paged and "kv_host_cache_bytes" not in settings:
        from ..kv.memory import default_host_cache_bytes

        settings["kv_host_cache_bytes"] = default_host_cache_bytes()
    served: dict = {}  # name -> (sampling defaults, pooling) of each model built

    def build_surge(model_args, name, adapters=(), strict=True, parallel=None):
        """Load, size and build model `name` with its LoRA adapters [(name, path)]; strict: an adapter that
        cannot be read stops vsurge (at start-up), else it is left out with a warning (a reload)."""
        try:  # a --models-config entry's own options over the command line's
            model_args, model_settings = served_models.model_options(model_args, name or "", settings)
        except ValueError as e:
            raise _fail(str(e)) from None
        if adapters and not model_settings.get("max_loras"):
            model_settings["max_loras"] = 4
        defaults = _generation_defaults(model_args)
        with memory_ledger.loading():
            model, processor = _load(model_args)
        status(describe_model(model))
        if name is None:
            name = args.served_model_name or (model.config.name or Path(model_args.model).name.removesuffix(".gguf")
                                              if model_args.model != "default" else "SmolLM2-135M-Instruct")
        try:
            config = EngineConfig.fitted(model.config.max_position_embeddings, **model_settings)
            surge = vSurge.from_config(model, processor, config, paged=paged, vsurge_name=name,
                                       max_queue=args.max_queue, **(parallel or {}))
        except ValueError as e:
            raise _fail(str(e)) from None
        if paged:
            for engine in surge.driver.engines:
                status(describe_kv_pool(model, engine))
        for lora_name, lora_path in adapters:
            try:
                adapter = surge.load_adapter(lora_name, lora_path)
            except ValueError as e:
                if strict:
                    raise _fail(str(e)) from None
                logging.getLogger("vsurge").warning("model %s: LoRA adapter %s left out: %s", name, lora_name, e)
                continue
            status(f"LoRA adapter {lora_name}: rank {adapter.rank} on {', '.join(adapter.modules)} ({lora_path})")
        served[name] = (defaults, _pooling(model_args))
        if server_box:
            server_box[0].generation_defaults[name], server_box[0].pooling[name] = served[name]
        return surge

    server_box: list = []  # the server, once made (models the router builds later register with it)
    surge = build_surge(args, first_name, loras, parallel=parallel)
    name = surge.vsurge_name
    defaults = served[name][0]
    if multihost and scale_flags.is_follower():
        return scale_flags.follow(surge)
    from ..server.adapters.response_store import ResponseStore

    from ..multimodal import MediaPolicy

    server = vSurgeApiServer({name: surge}, api_key=args.api_key, admin_api_key=args.admin_api_key,
                             guard_metrics=args.guard_metrics, lora_dir=args.lora_dir,
                             allow_runtime_lora=runtime_lora_allowed(args),
                             tool_call_parser=args.tool_call_parser,
                             reasoning_parser=args.reasoning_parser,
                             response_store=ResponseStore(args.responses_store_size, args.responses_store_ttl),
                             media_policy=MediaPolicy(tuple(args.allowed_media_domains), args.allowed_local_media_path,
                                                      max_images=args.max_images_per_request))
    server_box.append(server)
    server.generation_defaults = {name: defaults}  # what requests get for the sampling fields they leave unset
    server.pooling = {name: served[name][1]}
    if served_models.several(args, specs):
        from ..server.router import ModelRouter

        budget = args.models_memory_budget
        router = ModelRouter(server, args.max_loaded_models, args.sleep_idle_seconds,
                             memory_budget=None if budget is None else int(budget * 2**30))
        router.add(name, args.model, served_models.builder(copy.copy(args), name, args.model, server, build_surge),
                   loaded=surge, adapters=dict(loras))
        for other, path in specs[1:]:
            other = other or served_models.model_name(path)
            try:
                adapters = served_models.config_adapters(args, other)
            except ValueError as e:
                raise _fail(str(e)) from None
            router.add(other, path, served_models.builder(args, other, path, server, build_surge), adapters=adapters)
        server.router = router
        status(f"Models: {', '.join(router.entries)} (loaded on demand"
               + (f", at most {args.max_loaded_models} at once" if args.max_loaded_models else "")
               + (f", unloaded after {args.sleep_idle_seconds:g} s idle" if args.sleep_idle_seconds else "") + ")")
    status(f"Sampling defaults for unset request fields: {defaults.describe()}")
    return server, surge


def _serving_line(name: str, scheme: str, args) -> str:
    """The start-up line: where clients reach the API (a URL, or the unix socket's path) and the web pages."""
    from ..server.web import page_url

    metrics = f" (metrics on port {args.metrics_port or args.port + 1})" if args.metrics_port != -1 else ""
    if args.uds:
        return (f"vsurge: serving {name} on unix socket {args.uds} (base URL {scheme}://localhost/v1 through it)"
                f"{metrics}; chat page and dashboard: / through the socket")
    return (f"vsurge: serving {name} at {scheme}://{args.host}:{args.port}/v1{metrics}; "
            f"chat page and dashboard: {page_url(scheme, args.host, args.port)}")


def _lora_flags(args) -> list[tuple[str, str]]:
    """--lora NAME=PATH (or PATH alone: named by its directory) -> [(name, path)]."""
    out = []
    for given in getattr(args, "lora", None) or []:
        name, _, path = given.partition("=") if "=" in given else (Path(given).name, "", given)
        if not name or not path:
            raise _fail(f"--lora takes NAME=PATH, got {given!r}")
        out.append((name, path))
    return out


def _pooling(args) -> str:
    if args.pooling != "auto":
        return args.pooling
    from ..loading import resolve_model_path
    from ..server.adapters.embeddings import pooling_for_model

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
