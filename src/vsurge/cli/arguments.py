"""The command line's flags: each command's parser (`build_parser`), the model and sampling flags the
commands share, and `vsurge serve`'s. commands.py runs the commands."""

from __future__ import annotations

import argparse
import os

from ..config import QUANTIZATIONS
from ..engine.engine_config import EngineConfig
from ..scale.flags import add_parallel_args
from ..scale.ray_serve import add_ray_args
from . import served_models

DEFAULT_MAX_TOKENS = 512  # per reply, when neither --max-tokens nor the model's generation config says
DEFAULT_COMPILATION_CACHE = "~/.cache/vsurge/xla"
COMPILATION_CACHE_ENV = "VSURGE_COMPILATION_CACHE"  # overrides the default directory (e.g. for tests)


QUANTIZATION_CHOICES = list(QUANTIZATIONS)
QUANTIZATION_HELP = ("blocks: keep a GGUF file's or an AWQ/GPTQ checkpoint's blocks (the default on CPU); none: "
                     "dequantize them; int8 / fp8: per-channel int8 / float8_e4m3fn weights (fp8: for GPUs with fp8 "
                     "arithmetic); int4 / q8_0: weights "
                     "quantized at load to GGUF q4_0 / q8_0 blocks (one scale per 32 weights) for the block kernel; "
                     "int4_g64, int4_g128, int8_g64, int8_g128: one scale per 64 / 128 weights")

PASSES_HELP = ("how the block kernel multiplies weights held in blocks: 2 also multiplies the activations' int8 "
               "rounding residual (near-float logits), 1 is llama.cpp's arithmetic (about half the integer work); "
               "default: 2 below ~1B parameters (hidden size < 1024), 1 from there; either holds in every step")


MMPROJ_HELP = ("llama.cpp's mmproj .gguf (a vision-language model's tower and projector) for the text model "
               "--model's .gguf: the pair serves images (SmolVLM / Idefics3, Gemma 3)")
MODEL_HELP = "HF model directory, .gguf file, or 'default' (embedded SmolLM2-135M-Instruct)"
CHAT_ENGINE_FLAGS = ["max_length"]  # EngineConfig's flags generate / chat take (local_engine.py sizes the rest)


def _model_flags() -> dict[str, tuple[dict, dict]]:
    """Every command's model flags, declared once: flag -> (its argparse keywords, what `vsurge serve` changes:
    serve takes several models and names its LoRA adapters). Built per parser: the cache default reads the
    environment then (tests set it)."""
    cache = os.environ.get(COMPILATION_CACHE_ENV) or DEFAULT_COMPILATION_CACHE
    return {
        "--model": (dict(default="default", help=MODEL_HELP),
                    dict(action="append", default=None, metavar="[NAME=]PATH",
                         help=MODEL_HELP + "; repeat to serve several (the first loaded at start, the others on "
                                           "their first request)")),
        "--mmproj": (dict(default=None, metavar="FILE", help=MMPROJ_HELP),
                     dict(help=MMPROJ_HELP + "; with several models, each its own \"mmproj\" in --models-config")),
        "--dtype": (dict(default=None, choices=["float32", "bfloat16", "float16"],
                         help="weights dtype, dequantizing a GGUF file's blocks (default: a GGUF file keeps its "
                              "blocks on CPU; other weights bfloat16 where the CPU multiplies it natively, else "
                              "float32)"), {}),
        "--quantization": (dict(default=None, choices=QUANTIZATION_CHOICES, help=QUANTIZATION_HELP), {}),
        "--activation-passes": (dict(type=int, default=None, choices=[1, 2], help=PASSES_HELP), {}),
        "--lora": (dict(default=None, metavar="PATH",
                        help="generate with this LoRA adapter (a PEFT directory or a llama.cpp LoRA .gguf)"),
                   dict(action="append", default=[], metavar="NAME=PATH",
                        help="serve a LoRA adapter (a PEFT directory) as model NAME; repeat for more (turns on "
                             "--enable-lora)")),
        "--compilation-cache": (dict(default=cache, help=f"directory of compiled programs reused across runs, one "
                                     f"for generate, chat and serve ('none' to disable; default "
                                     f"${COMPILATION_CACHE_ENV} or {DEFAULT_COMPILATION_CACHE})"), {}),
    }


def _add_model_args(p: argparse.ArgumentParser, serve: bool = False) -> None:
    """Which model runs and how: the model flags, EngineConfig's (serve: all of them, in their own group;
    generate / chat: CHAT_ENGINE_FLAGS) and the parallelism flags (serve: multi-host ones too)."""
    for flag, (options, for_serve) in _model_flags().items():
        p.add_argument(flag, **(options | for_serve if serve else options))
    engine = p.add_argument_group("engine (EngineConfig's settings: engine/engine_config.py)") if serve else p
    EngineConfig.add_flags(engine, None if serve else CHAT_ENGINE_FLAGS)
    add_parallel_args(p, multihost=serve)


def _add_generation_config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--generation-config", default="auto", metavar="auto|vsurge|PATH",
                   help="sampling defaults: auto = the model's (generation_config.json, GGUF general.sampling.*) "
                        "over vsurge's; vsurge = vsurge's only; PATH = a generation_config.json (default auto)")


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    """One flag per SamplingParams field that declares `cli=` flags (sampling/params.py)."""
    from ..sampling.defaults import VSURGE_DEFAULTS
    from ..sampling.params import cli_fields

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
    gen.add_argument("--image", action="append", default=[], metavar="FILE",
                     help="an image the prompt is about (a vision-language model; repeat for several)")
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


def runtime_lora_allowed(args) -> bool:
    """Clients may load adapters at run time only when asked for: not by --lora or --max-loras alone."""
    return bool(args.allow_runtime_lora or args.enable_lora or args.lora_dir)


def _add_serve_args(p: argparse.ArgumentParser) -> None:
    _add_model_args(p, serve=True)
    p.add_argument("--served-model-name", default=None, help="the name clients use (default: from the model)")
    served_models.add_arguments(p)
    add_ray_args(p)  # --ray, --replicas (scale/ray_serve/; Ray itself is imported only with --ray)
    p.add_argument("--enable-lora", action="store_true",
                   help="serve LoRA adapters: --lora at start, POST /v1/load_lora_adapter at run time "
                        "(--max-loras on the device at once, default 4)")
    p.add_argument("--allow-runtime-lora", action="store_true",
                   help="let clients load and unload LoRA adapters at run time (POST /v1/load_lora_adapter; "
                        "--enable-lora allows it too, --lora and --max-loras alone do not)")
    p.add_argument("--lora-dir", default=None, metavar="DIR",
                   help="runtime adapter paths are read under DIR and must resolve inside it (implies "
                        "--allow-runtime-lora)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=11556)
    p.add_argument("--uds", default=None, metavar="PATH",
                   help="serve on this unix domain socket instead of TCP (--uds wins over --host/--port; the "
                        "separate metrics port is off unless --metrics-port names one). A socket file a dead "
                        "server left is replaced; any other file at PATH is refused")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="Prometheus port (default port+1, off with --uds; -1: off)")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' (or 'x-api-key: KEY') on every route but /liveness, "
                        "/readiness, /health, /metrics and the web pages (docs/security.md)")
    p.add_argument("--admin-api-key", default=None,
                   help="the key of model and LoRA adapter load/unload and prompt-cache save/restore/erase "
                        "(default: --api-key guards them)")
    p.add_argument("--guard-metrics", action="store_true",
                   help="/metrics takes the API key too, and the separate metrics port is off unless "
                        "--metrics-port names one")
    p.add_argument("--max-queue", type=int, default=256, help="requests waiting for a slot before 503")
    p.add_argument("--engine", default="paged", choices=["dense", "paged"],
                   help="paged: KV pages on demand with prefix caching and preemption; dense: a fixed "
                        "max-length run of pages per slot")
    from ..structured.reasoning import REASONING_PARSERS
    from ..structured.tool_parsers import PARSER_NAMES

    p.add_argument("--tool-call-parser", default="auto", choices=list(PARSER_NAMES),
                   help="how tool calls are read from the model's text (auto: from the chat template)")
    p.add_argument("--reasoning-parser", default=None, choices=list(REASONING_PARSERS),
                   help="split <think> reasoning from answers: chat reasoning_content, Responses reasoning items, "
                        "Messages thinking blocks (default: off)")
    p.add_argument("--pooling", default="auto", choices=["auto", "mean", "last"],
                   help="/v1/embeddings: the mean of the final hidden states or the last token's (auto: the model's "
                        "sentence-transformers pooling config, else last)")
    p.add_argument("--allowed-media-domains", nargs="*", default=[], metavar="DOMAIN",
                   help="hosts (and their subdomains) whose http(s) image URLs the server fetches (default: none; "
                        "images come as base64 data: URIs)")
    p.add_argument("--allowed-local-media-path", default=None, metavar="DIR",
                   help="image inputs may name files under this folder (default: no local files)")
    p.add_argument("--max-images-per-request", type=int, default=16, metavar="N",
                   help="images one request may hold (default %(default)s)")
    p.add_argument("--responses-store-size", type=int, default=1000,
                   help="/v1/responses kept for previous_response_id and GET (oldest dropped beyond; 0: none)")
    p.add_argument("--responses-store-ttl", type=float, default=3600.0,
                   help="seconds a stored response is kept (default 3600)")
    _add_generation_config_arg(p)
    p.add_argument("--ssl-keyfile", default=None)
    p.add_argument("--ssl-certfile", default=None)
    p.add_argument("--log-level", default="warning")
