"""`vsurge serve` with several models: `--model [NAME=]PATH` repeated and `--models-dir DIR` (llama.cpp's
router), loaded on demand behind server/router.py (`--max-loaded-models`, `--sleep-idle-seconds`)."""

from __future__ import annotations

import argparse
import copy
import json
import os
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models-dir", default=None, metavar="DIR",
                   help="also serve every model in DIR (an HF directory, named by it, or a .gguf file, named by "
                        "its stem), each loaded on its first request")
    p.add_argument("--max-loaded-models", type=int, default=None, metavar="N",
                   help="with several models: at most N loaded at once; a request for another unloads the least "
                        "recently used one with nothing in flight (default: no limit)")
    p.add_argument("--models-config", default=None, metavar="FILE",
                   help='per-model options, JSON: {"NAME": {"path": PATH, "max-length": 4096, "quantization": "int8", '
                        '"generation-config": "vsurge", "lora": {"ADAPTER": PATH}, ...}}: a model per entry (loaded on '
                        "demand), each option a `vsurge serve` flag of the model or its engine")
    p.add_argument("--models-memory-budget", type=float, default=None, metavar="GIB",
                   help="with several models: what the loaded models may hold together (weights, KV pool and "
                        "states, GiB); a request for another unloads the least recently used idle ones until it "
                        "fits (default: no bound)")
    p.add_argument("--sleep-idle-seconds", type=float, default=None, metavar="S",
                   help="with several models: unload a model nobody asked for in S seconds (its next request "
                        "loads it again)")


def model_name(path: str) -> str:
    if path == "default":
        return "SmolLM2-135M-Instruct"
    return Path(path).name.removesuffix(".gguf")


def split_model(given: str) -> tuple[str | None, str]:
    """`NAME=PATH` -> (NAME, PATH); a plain path (or one that exists with a '=' in it) -> (None, path)."""
    name, sep, path = given.partition("=")
    if not sep or os.path.exists(given) or "/" in name or not name or not path:
        return None, given
    return name, path


def model_specs(args) -> list[tuple[str | None, str]]:
    """The models to serve, in order: each --model (default: the embedded one), then --models-dir's, then
    --models-config's."""
    from ..server.router import models_in_dir

    given = args.model if isinstance(args.model, list) else [args.model] if args.model else []
    specs = [split_model(m) for m in (given or ["default"])]
    if args.models_dir:
        specs += models_in_dir(args.models_dir)
    specs += [(name, options["path"]) for name, options in models_config(args).items()]
    return specs


# options of a --models-config entry that are not engine flags: the model's own `vsurge serve` flags
MODEL_OPTIONS = ("dtype", "quantization", "activation_passes", "generation_config", "pooling", "mmproj")


def models_config(args) -> dict[str, dict]:
    """--models-config's entries: name -> options (with "path"); ValueError naming what is wrong."""
    if not getattr(args, "models_config", None):
        return {}
    try:
        entries = json.loads(Path(args.models_config).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"--models-config {args.models_config}: {exc}") from None
    if not isinstance(entries, dict) or not all(isinstance(v, dict) and "path" in v for v in entries.values()):
        raise ValueError(f'--models-config {args.models_config}: expected {{"NAME": {{"path": PATH, ...}}, ...}}')
    return entries


def model_options(args, name: str, settings: dict) -> tuple[object, dict]:
    """(the model's args, its engine settings): the command line's, with its --models-config options over them.
    Options are flag names ("max-length" or "max_length"); ValueError for an unknown one or a bad value."""
    from ..engine.engine_config import SETTINGS

    options = dict(models_config(args).get(name, {}))
    options.pop("path", None)
    options.pop("lora", None)  # (its adapters: config_adapters)
    model_args, model_settings = copy.copy(args), dict(settings)
    fields = {f.metadata["setting"].flag.removeprefix("--").replace("-", "_"): f
              for f in SETTINGS if f.metadata["setting"].flag}
    for key, value in options.items():
        dest = key.replace("-", "_")
        if dest in MODEL_OPTIONS:
            setattr(model_args, dest, value)
        elif dest in fields:
            spec = fields[dest].metadata["setting"]
            value = spec.parse(value) if spec.parse and isinstance(value, str) else value
            value = int(value * spec.unit) if spec.unit != 1 else value
            if spec.check is not None and not spec.check.ok(value):
                raise ValueError(f"--models-config {name}: {key} must be {spec.check.what}, got {value!r}")
            model_settings[fields[dest].name] = value
        else:
            raise ValueError(f"--models-config {name}: unknown option {key!r} (options: path, lora, "
                             f"{', '.join(MODEL_OPTIONS)} and the engine flags)")
    return model_args, model_settings


def config_adapters(args, name: str) -> dict[str, str]:
    """A --models-config entry's LoRA adapters ("lora": {"NAME": PATH} or ["NAME=PATH", ...]) -> name -> path."""
    given = models_config(args).get(name, {}).get("lora") or {}
    if isinstance(given, list):
        pairs = [item.partition("=") for item in given]
        if not all(isinstance(item, str) and sep and n and p for item, (n, sep, p) in zip(given, pairs)):
            raise ValueError(f"--models-config {name}: lora takes {{\"NAME\": PATH}} or [\"NAME=PATH\", ...]")
        given = {n: p for n, _, p in pairs}
    if not isinstance(given, dict) or not all(isinstance(v, str) for v in given.values()):
        raise ValueError(f"--models-config {name}: lora takes {{\"NAME\": PATH}} or [\"NAME=PATH\", ...]")
    return dict(given)


def several(args, specs) -> bool:
    return len(specs) > 1 or bool(args.models_dir or args.models_config or args.max_loaded_models
                                  or args.sleep_idle_seconds or args.models_memory_budget)


def check(args, specs, fail) -> None:
    if args.max_loaded_models is not None and args.max_loaded_models < 1:
        raise fail(f"--max-loaded-models must be at least 1, got {args.max_loaded_models}")
    if args.sleep_idle_seconds is not None and args.sleep_idle_seconds <= 0:
        raise fail(f"--sleep-idle-seconds must be above 0, got {args.sleep_idle_seconds}")
    if args.models_memory_budget is not None and args.models_memory_budget <= 0:
        raise fail(f"--models-memory-budget must be above 0 GiB, got {args.models_memory_budget}")
    names = [name or model_name(path) for name, path in specs]
    if len(set(names)) != len(names):
        raise fail(f"two models share a name: {names} (name them: --model NAME=PATH)")


def builder(args, name: str, path: str, server, build_surge):
    """A callable that loads, compiles and starts model `path` as `name` with its LoRA adapters (on the router's
    worker thread), registering its sampling defaults and pooling with the server, and reusing the compiled
    programs of its last load when given them. build_surge(args, name, adapters, strict) -> vSurge."""
    def build(programs: list[dict] | None = None, adapters: dict | None = None):
        model_args = copy.copy(args)
        model_args.model = path
        surge = build_surge(model_args, name, list((adapters or {}).items()), False)
        for engine, compiled in zip(surge.driver.engines, programs or []):
            engine._compiled.update(compiled)  # its programs from its last load (server/router.py)
        surge.compile()
        surge.start()
        return surge

    return build
