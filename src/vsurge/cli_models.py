"""`vsurge serve` with several models: `--model [NAME=]PATH` repeated and `--models-dir DIR` (llama.cpp's
router), loaded on demand behind server/router.py (`--max-loaded-models`, `--sleep-idle-seconds`)."""

from __future__ import annotations

import argparse
import copy
import os
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models-dir", default=None, metavar="DIR",
                   help="also serve every model in DIR (an HF directory, named by it, or a .gguf file, named by "
                        "its stem), each loaded on its first request")
    p.add_argument("--max-loaded-models", type=int, default=None, metavar="N",
                   help="with several models: at most N loaded at once; a request for another unloads the least "
                        "recently used one with nothing in flight (default: no limit)")
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
    """The models to serve, in order: each --model (default: the embedded one), then --models-dir's."""
    from .server.router import models_in_dir

    given = args.model if isinstance(args.model, list) else [args.model] if args.model else []
    specs = [split_model(m) for m in (given or ["default"])]
    if args.models_dir:
        specs += models_in_dir(args.models_dir)
    return specs


def several(args, specs) -> bool:
    return len(specs) > 1 or bool(args.models_dir or args.max_loaded_models or args.sleep_idle_seconds)


def check(args, specs, fail) -> None:
    if args.max_loaded_models is not None and args.max_loaded_models < 1:
        raise fail(f"--max-loaded-models must be at least 1, got {args.max_loaded_models}")
    if args.sleep_idle_seconds is not None and args.sleep_idle_seconds <= 0:
        raise fail(f"--sleep-idle-seconds must be above 0, got {args.sleep_idle_seconds}")
    names = [name or model_name(path) for name, path in specs]
    if len(set(names)) != len(names):
        raise fail(f"two models share a name: {names} (name them: --model NAME=PATH)")


def builder(args, name: str, path: str, server, build_surge):
    """A callable that loads, compiles and starts model `path` as `name` (on the router's worker thread),
    registering its sampling defaults and pooling with the server, and reusing the compiled programs of its
    last load when given them. build_surge(args, name) -> vSurge."""
    def build(programs: list[dict] | None = None):
        model_args = copy.copy(args)
        model_args.model = path
        surge = build_surge(model_args, name)
        for engine, compiled in zip(surge.driver.engines, programs or []):
            engine._compiled.update(compiled)  # its programs from its last load (server/router.py)
        surge.compile()
        surge.start()
        return surge

    return build
