"""What the CLI's commands share: a clear exit for bad flags, the engine settings the flags give, and a model's
sampling defaults."""

from __future__ import annotations

from ..engine.engine_config import EngineConfig


def fail(message: str) -> SystemExit:
    return SystemExit(f"vsurge: error: {message}")


def engine_flags(args) -> dict:
    """The EngineConfig settings given on the command line (engine/engine_config.py), each checked."""
    try:
        return EngineConfig.flag_values(args)
    except ValueError as e:
        raise fail(str(e)) from None


def model_generation_defaults(args):
    from ..errors import ModelLoadError
    from ..loading.generation_config import resolve_generation_defaults
    from ..loading import resolve_model_path

    try:
        path = resolve_model_path(args.model)
    except ModelLoadError as e:
        raise fail(str(e)) from None
    try:
        return resolve_generation_defaults(args.generation_config, path)
    except (ModelLoadError, ValueError) as e:
        raise fail(f"--generation-config {args.generation_config}: {e}") from None
