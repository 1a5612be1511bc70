"""The first answers a new user sees: `vsurge generate` on the default model, over many seeds.

Counts, for each sampling setting, how often "What is the capital of France?" is answered with a
reply naming Paris (32 seeds, with and without `--system "You are terse."`), and how often "Write a
short poem about the sea." repeats one line 3 or more times (16 seeds). Replies come from the engine
`vsurge generate` runs (cli/local_engine.py's LocalEngine, one start for all replies), with the same chat
prompt and the same SamplingParams as `vsurge generate --seed N [flags]`.

    python benchmarks/first_answers.py                          # the defaults `vsurge generate` uses now
    python benchmarks/first_answers.py --setting "temperature=0.8,top_p=0.95,top_k=40,min_p=0.05,repetition_penalty=1.1"
    python benchmarks/first_answers.py --setting ... --setting ...   # several settings, one engine start

    python benchmarks/first_answers.py --first-tokens           # transformers' first-token odds, no engine

A setting lists SamplingParams fields over the defaults (`--generation-config auto`); "defaults" is
what a user gets with no flags.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter

os.environ.setdefault("HF_HUB_OFFLINE", "1")

FRANCE = "What is the capital of France?"
POEM = "Write a short poem about the sea."
SYSTEM = "You are terse."


def loops(text: str, times: int = 3) -> bool:
    """A reply that repeats one (non-empty) line `times` times or more."""
    lines = Counter(line.strip().lower() for line in text.splitlines() if line.strip())
    return any(n >= times for n in lines.values())


def parse_setting(text: str) -> dict:
    if text == "defaults":
        return {}
    values = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        values[name.strip()] = float(value) if "." in value else int(value)
    return values


def first_token_odds(top: int = 5) -> None:
    """The reference model's (transformers on the same GGUF) most likely first tokens of the France answer,
    with and without the system prompt: why sampling cannot answer it reliably under one."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vsurge.loading import default_model_path, load_processor
    from vsurge.tokenizer.compat import chat_prompt_ids

    path = default_model_path()
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    processor = load_processor("default")
    for system in (None, SYSTEM):
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": FRANCE}]
        with torch.no_grad():
            logits = model(torch.tensor([chat_prompt_ids(processor, messages)])).logits[0, -1]
        odds = torch.topk(torch.softmax(logits, -1), top)
        listed = ", ".join(f"{tokenizer.decode([int(i)])!r} {float(p):.3f}" for p, i in zip(odds.values, odds.indices))
        print(f"system {system!r}: {listed}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setting", action="append", help="name=value,... over the defaults ('defaults': none)")
    parser.add_argument("--seeds", type=int, default=32, help="seeds for the France question (poems: half)")
    parser.add_argument("--show", action="store_true", help="print every reply")
    parser.add_argument("--first-tokens", action="store_true", help="only print transformers' first-token odds")
    args = parser.parse_args()
    if args.first_tokens:
        first_token_odds()
        return 0

    from vsurge import kernels
    from vsurge.cli.arguments import DEFAULT_MAX_TOKENS
    from vsurge.cli.local_engine import LocalEngine
    from vsurge.loading.generation_config import resolve_generation_defaults
    from vsurge.loading import resolve_model_path

    defaults = resolve_generation_defaults("auto", resolve_model_path("default"))
    print(f"CPU ISA {kernels.cpu_isa()}; defaults: {defaults.describe()}", file=sys.stderr)
    cases = [("France", FRANCE, None, args.seeds), (f"France, system {SYSTEM!r}", FRANCE, SYSTEM, args.seeds),
             ("poem", POEM, None, args.seeds // 2)]
    rows = []
    with LocalEngine.start("default", compilation_cache=os.path.expanduser("~/.cache/vsurge/xla")) as engine:
        for setting in args.setting or ["defaults"]:
            overrides = parse_setting(setting)
            begin = time.perf_counter()
            counts = []
            for name, question, system, seeds in cases:
                messages = ([{"role": "system", "content": system}] if system else []) + \
                    [{"role": "user", "content": question}]
                ids = engine.chat_prompt(messages)
                hits = 0
                for seed in range(1, seeds + 1):
                    params = defaults.sampling_params(seed=seed, max_tokens=defaults.max_tokens or DEFAULT_MAX_TOKENS,
                                                      **overrides)
                    text = engine.reply(ids, params).text
                    hit = loops(text) if question == POEM else "paris" in text.lower()
                    hits += hit
                    if args.show:
                        print(f"[{setting} | {name} | seed {seed} | {'HIT' if hit else '-'}] {text!r}")
                counts.append(f"{hits}/{seeds}")
            rows.append((setting, *counts, time.perf_counter() - begin))
            print(f"{setting}: {counts} ({rows[-1][-1]:.0f} s)", file=sys.stderr)
    print(f"\n`python benchmarks/first_answers.py`, default model, CPU ISA {kernels.cpu_isa()}\n")
    print("| setting over the defaults | France: names Paris | France with a system prompt: names Paris | "
          "poem: a line 3+ times |")
    print("|---|---|---|---|")
    for setting, france, system, poem, _ in rows:
        print(f"| {setting} | {france} | {system} | {poem} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
