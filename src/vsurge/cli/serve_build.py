"""`vsurge serve`'s models and server built from its flags, not started: `vsurge serve` starts it (commands.py), and
a Ray Serve replica builds its own the same way (scale/ray_serve/replica.py)."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

from ..engine.engine_config import EngineConfig
from . import served_models
from .arguments import runtime_lora_allowed
from .support import engine_flags, fail, model_generation_defaults


def build_server(args):
    """`vsurge serve`'s models and server from its flags, not started: (vSurgeApiServer, first vSurge), or a
    multi-host follower's exit status. A Ray Serve replica builds its server here too (scale/ray_serve/)."""
    from ..engine import memory_ledger

    memory_ledger.mark("start")  # before anything heavy is imported: the interpreter and the CLI alone
    import logging

    from .local_engine import describe_kv_pool, describe_model, status, use_cache_dir
    from ..server import vSurgeApiServer
    from ..vsurge import Surge

    settings = engine_flags(args)
    loras = _lora_flags(args)
    if (loras or runtime_lora_allowed(args)) and not settings.get("max_loras"):
        settings["max_loras"] = 4
    if args.max_queue < 0:
        raise fail(f"--max-queue must be at least 0, got {args.max_queue}")
    if args.responses_store_size < 0 or args.responses_store_ttl <= 0:
        raise fail("--responses-store-size must be >= 0 and --responses-store-ttl > 0")
    if args.uds:  # checked (and a dead server's socket file cleared) before the model loads
        from ..server.unix_socket import claim_socket_path

        try:
            args.uds = claim_socket_path(args.uds)
        except ValueError as e:
            raise fail(str(e)) from None
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    from ..scale import flags as scale_flags

    multihost = scale_flags.init_distributed(args)  # before anything else touches JAX
    memory_ledger.mark_runtime()
    try:
        specs = served_models.model_specs(args)
    except ValueError as e:
        raise fail(str(e)) from None
    served_models.check(args, specs, fail)
    if args.mmproj and served_models.several(args, specs):
        raise fail("--mmproj goes with one --model; to serve several, give a model's mmproj as its \"mmproj\" "
                    "in --models-config")
    first_name, args.model = specs[0]
    use_cache_dir(args.compilation_cache)
    parallel = (scale_flags.disaggregated_kwargs(args) if scale_flags.disaggregated(args)
                else scale_flags.load_kwargs(args))
    if parallel and served_models.several(args, specs):
        raise fail("several models per server are served on one device each for now (no --tensor-parallel-size, "
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
            raise fail(str(e)) from None
        if adapters and not model_settings.get("max_loras"):
            model_settings["max_loras"] = 4
        defaults = model_generation_defaults(model_args)
        with memory_ledger.loading():
            model, processor = _load(model_args)
        status(describe_model(model))
        if name is None:
            name = args.served_model_name or (model.config.name or Path(model_args.model).name.removesuffix(".gguf")
                                              if model_args.model != "default" else "SmolLM2-135M-Instruct")
        try:
            config = EngineConfig.fitted(model.config.max_position_embeddings, **model_settings)
            surge = Surge.from_config(model, processor, config, paged=paged, vsurge_name=name,
                                       max_queue=args.max_queue, **(parallel or {}))
        except ValueError as e:
            raise fail(str(e)) from None
        if paged:
            for engine in surge.driver.engines:
                status(describe_kv_pool(model, engine))
        for lora_name, lora_path in adapters:
            try:
                adapter = surge.load_adapter(lora_name, lora_path)
            except ValueError as e:
                if strict:
                    raise fail(str(e)) from None
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
                raise fail(str(e)) from None
            router.add(other, path, served_models.builder(args, other, path, server, build_surge), adapters=adapters)
        server.router = router
        status(f"Models: {', '.join(router.entries)} (loaded on demand"
               + (f", at most {args.max_loaded_models} at once" if args.max_loaded_models else "")
               + (f", unloaded after {args.sleep_idle_seconds:g} s idle" if args.sleep_idle_seconds else "") + ")")
    status(f"Sampling defaults for unset request fields: {defaults.describe()}")
    return server, surge


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
        raise fail(str(e)) from None


def serving_line(name: str, scheme: str, args) -> str:
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
            raise fail(f"--lora takes NAME=PATH, got {given!r}")
        out.append((name, path))
    return out


def _pooling(args) -> str:
    if args.pooling != "auto":
        return args.pooling
    from ..loading import resolve_model_path
    from ..server.adapters.embeddings import pooling_for_model

    return pooling_for_model(resolve_model_path(args.model))
