"""Constrained-decoding libraries compared on the default model's vocabulary (49,152 tokens).

For llguidance, xgrammar and outlines-core (each when installed) and five
constraints (a flat object, a nested object with arrays/enums/numbers, the
OpenAI tool-call array schema, a regex, a choice list) it measures:

- import: seconds to import the library (server start-up pays it once);
- vocab: seconds to preprocess the tokenizer (once per model);
- compile: median seconds to compile the constraint, caches off;
- first mask: the first next-token mask after compiling (lazy work shows here);
- mask p50 / p99: per-token mask time along a walk over the tokens of a valid
  document, `--walks` fresh matchers from one compiled grammar;
- accept p50: per-token time to advance the matcher with the sampled token;

and the same for vsurge's own path ("vsurge": llguidance through vsurge.structured,
compile = validation + compilation, each mask with the end-token rewrite), plus
the time to fill 8 and 32 rows of one step's bitmask, one by one and in parallel,

then what each library pulls in (declared requirements, installed size).
Every library computes the same packed int32 bitmask (ceil(V/32) words per row).
Only llguidance is a vsurge dependency; to reproduce the others:

    pip install xgrammar outlines-core
    python benchmarks/structured_masks.py [--walks 5] [--compile-reps 3] [--libraries llguidance,xgrammar]

All libraries use flexible whitespace here (each one's default); the walk
documents are `json.dumps` output, which all of them accept.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as metadata
import json
import os
import re
import statistics
import sys
import time
from dataclasses import dataclass

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402

# ---------------------------------------------------------------- the constraints

FLAT = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"}, "email": {"type": "string"},
    "active": {"type": "boolean"}}, "required": ["name", "age", "email", "active"],
    "additionalProperties": False}

NESTED = {"type": "object", "properties": {
    "order_id": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
    "customer": {"type": "object", "properties": {
        "name": {"type": "string"}, "tier": {"enum": ["free", "pro", "enterprise"]},
        "since": {"type": "integer", "minimum": 1990, "maximum": 2100}},
        "required": ["name", "tier", "since"], "additionalProperties": False},
    "items": {"type": "array", "minItems": 1, "items": {"type": "object", "properties": {
        "sku": {"type": "string"}, "quantity": {"type": "integer", "minimum": 1},
        "price": {"type": "number"}}, "required": ["sku", "quantity", "price"], "additionalProperties": False}},
    "total": {"type": "number"},
    "tags": {"type": "array", "items": {"type": "string"}},
    "status": {"enum": ["pending", "shipped", "delivered"]}},
    "required": ["order_id", "customer", "items", "total", "tags", "status"], "additionalProperties": False}

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}
SEARCH = {"type": "object", "properties": {
    "query": {"type": "string"}, "max_results": {"type": "integer", "minimum": 1, "maximum": 50}},
    "required": ["query", "max_results"], "additionalProperties": False}


def _call_schema(name, parameters):
    return {"type": "object", "properties": {"name": {"enum": [name]}, "arguments": parameters},
            "required": ["name", "arguments"], "additionalProperties": False}


# What tool_choice="required" compiles to (as vLLM): one or more calls of the request's tools.
TOOL_CALLS = {"type": "array", "minItems": 1,
              "items": {"anyOf": [_call_schema("get_weather", WEATHER), _call_schema("web_search", SEARCH)]}}

EMAIL_REGEX = r"[a-z0-9._%+-]{1,64}@[a-z0-9-]{1,63}(\.[a-z0-9-]{1,63}){0,3}\.[a-z]{2,6}"
CHOICES = ["positive", "negative", "neutral", "mixed"]


@dataclass
class Case:
    name: str
    kind: str  # "json" | "regex" | "choice"
    spec: object  # schema dict | regex str | list of strings
    document: str  # a valid output: the walk follows its tokens


CASES = [
    Case("flat object", "json", FLAT,
         json.dumps({"name": "Ada Lovelace", "age": 36, "email": "ada@example.org", "active": True})),
    Case("nested (arrays, enums, numbers)", "json", NESTED, json.dumps({
        "order_id": "ABC-1234", "customer": {"name": "Grace Hopper", "tier": "pro", "since": 2015},
        "items": [{"sku": "KB-101", "quantity": 2, "price": 49.99}, {"sku": "MS-7", "quantity": 1, "price": 19.5}],
        "total": 119.48, "tags": ["gift", "express"], "status": "shipped"})),
    Case("tool-call array", "json", TOOL_CALLS, json.dumps([
        {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}},
        {"name": "web_search", "arguments": {"query": "Paris museums open on Monday", "max_results": 5}}])),
    Case("regex (email)", "regex", EMAIL_REGEX, "grace.hopper@navy.example.mil"),
    Case("choice (4 strings)", "choice", CHOICES, "negative"),
]


# ---------------------------------------------------------------- the libraries

class Library:
    name = ""
    module = ""
    distribution = ""

    def prepare(self, processor) -> None:
        """Preprocess the vocabulary (timed as `vocab`)."""

    def compile(self, case: Case):
        raise NotImplementedError

    def matcher(self, compiled):
        raise NotImplementedError

    def fill(self, matcher, bitmask: np.ndarray) -> None:  # bitmask (1, ceil(V/32)) int32
        raise NotImplementedError

    def accept(self, matcher, token: int) -> bool:
        raise NotImplementedError


class LLGuidance(Library):
    name, module, distribution = "llguidance", "llguidance", "llguidance"

    def prepare(self, processor):
        import llguidance

        self.llg = llguidance
        self.tokenizer = llguidance.LLTokenizer(processor.tokenizer.to_str(), n_vocab=processor.vocab_size,
                                                eos_token=processor.eos_token_ids)

    def compile(self, case):
        llg = self.llg
        if case.kind == "json":
            grammar = llg.LLMatcher.grammar_from_json_schema(case.spec)
        elif case.kind == "regex":
            grammar = llg.LLMatcher.grammar_from_regex(case.spec)
        else:
            grammar = llg.grammar_from("choice", case.spec)
        compiled = llg.LLMatcher(self.tokenizer, grammar, log_level=0)  # compiling = building the matcher
        assert not compiled.is_error(), compiled.get_error()
        return compiled

    def matcher(self, compiled):
        return compiled.deep_copy()

    def fill(self, matcher, bitmask):
        matcher.unsafe_compute_mask_ptr(bitmask.ctypes.data, bitmask.nbytes)

    def accept(self, matcher, token):
        return matcher.consume_token(token)


class XGrammar(Library):
    name, module, distribution = "xgrammar", "xgrammar", "xgrammar"

    def prepare(self, processor):
        import xgrammar
        from transformers import PreTrainedTokenizerFast

        self.xgr = xgrammar
        hf = PreTrainedTokenizerFast(tokenizer_object=processor.tokenizer, eos_token=processor.eos_token)
        info = xgrammar.TokenizerInfo.from_huggingface(hf, vocab_size=processor.vocab_size,
                                                       stop_token_ids=processor.eos_token_ids)
        # Two threads: this machine has two cores; caching off so every compile is cold.
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=2, cache_enabled=False)

    def compile(self, case):
        if case.kind == "json":
            return self.compiler.compile_json_schema(json.dumps(case.spec), any_whitespace=True)
        if case.kind == "regex":
            return self.compiler.compile_regex(case.spec)
        return self.compiler.compile_regex("(" + "|".join(re.escape(c) for c in case.spec) + ")")

    def matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, matcher, bitmask):
        matcher.fill_next_token_bitmask(bitmask, 0)

    def accept(self, matcher, token):
        return matcher.accept_token(token)


class OutlinesCore(Library):
    name, module, distribution = "outlines-core", "outlines_core", "outlines_core"

    def prepare(self, processor):
        import outlines_core

        self.oc = outlines_core
        byte_of = {c: b for b, c in _bytes_to_unicode().items()}
        special = set(processor.tokenizer.get_added_tokens_decoder())
        tokens: dict[bytes, list[int]] = {}
        for token, i in processor.tokenizer.get_vocab(with_added_tokens=False).items():
            if i not in special:
                tokens.setdefault(bytes(byte_of[c] for c in token), []).append(i)
        self.vocabulary = outlines_core.Vocabulary(processor.eos_token_id, tokens)

    def compile(self, case):
        if case.kind == "json":
            regex = self.oc.json_schema.build_regex_from_schema(json.dumps(case.spec))
        elif case.kind == "regex":
            regex = case.spec
        else:
            regex = "(" + "|".join(re.escape(c) for c in case.spec) + ")"
        return self.oc.Index(regex, self.vocabulary)

    def matcher(self, compiled):
        return self.oc.Guide(compiled)

    def fill(self, matcher, bitmask):
        matcher.write_mask_into(bitmask.ctypes.data, bitmask.size, 4)

    def accept(self, matcher, token):
        matcher.advance(token, return_tokens=False)
        return True


class Vsurge(Library):
    """vsurge's own path: llguidance with vsurge's JSON format (json.dumps separators, no free
    whitespace, undeclared keys refused) and the end-token rewrite of every row."""

    name, module, distribution = "vsurge", "llguidance", "llguidance"

    def prepare(self, processor):
        from vsurge.structured.compiler import GrammarCompiler

        self.compiler = GrammarCompiler(processor)

    def compile(self, case):
        from vsurge.structured.spec import StructuredOutput, check_grammar, grammar_text

        kind = {"json": "json", "regex": "regex", "choice": "choice"}[case.kind]
        self.compiler._cache.clear()  # cold, like the others
        grammar_text.cache_clear()
        check_grammar.cache_clear()
        return self.compiler.compile(StructuredOutput(**{kind: case.spec}))

    def matcher(self, compiled):
        from vsurge.structured.matcher import GrammarMatcher

        return GrammarMatcher(compiled)

    def fill(self, matcher, bitmask):
        matcher.fill_bitmask(bitmask, 0)

    def accept(self, matcher, token):
        return matcher.accept(token)


LIBRARIES = {lib.name: lib for lib in (LLGuidance(), XGrammar(), OutlinesCore(), Vsurge())}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (byte-level BPE token spelling)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


# ---------------------------------------------------------------- measuring

def _allowed(bitmask: np.ndarray, token: int) -> bool:
    return bool((int(bitmask[0, token // 32]) >> (token % 32)) & 1)


def measure(lib: Library, case: Case, processor, walks: int, compile_reps: int) -> dict:
    """Times for one library on one constraint (seconds), or {"error": ...}."""
    words = (processor.vocab_size + 31) // 32
    bitmask = np.zeros((1, words), np.int32)  # (1, ceil(V/32))
    try:
        compile_times = []
        for _ in range(compile_reps):
            start = time.perf_counter()
            compiled = lib.compile(case)
            compile_times.append(time.perf_counter() - start)
        matcher = lib.matcher(compiled)
        start = time.perf_counter()
        lib.fill(matcher, bitmask)
        first_mask = time.perf_counter() - start
    except Exception as exc:  # a library that cannot compile this constraint is a result, not a crash
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"}
    tokens = processor.encode(case.document, add_special_tokens=False)
    mask_times, accept_times = [], []
    for _ in range(walks):
        matcher = lib.matcher(compiled)
        for i, token in enumerate(tokens):
            start = time.perf_counter()
            lib.fill(matcher, bitmask)
            mask_times.append(time.perf_counter() - start)
            if not _allowed(bitmask, token):
                return {"error": f"token {i} ({processor.decode([token])!r}) of the valid document is masked"}
            start = time.perf_counter()
            ok = lib.accept(matcher, token)
            accept_times.append(time.perf_counter() - start)
            if not ok:
                return {"error": f"token {i} of the valid document was refused"}
        lib.fill(matcher, bitmask)
        if not any(_allowed(bitmask, e) for e in processor.eos_token_ids):
            return {"error": "EOS is not allowed after the complete document"}
    return {"compile": statistics.median(compile_times), "first_mask": first_mask,
            "mask_p50": statistics.median(mask_times), "mask_p99": float(np.percentile(mask_times, 99)),
            "accept_p50": statistics.median(accept_times), "tokens": len(tokens)}


def measure_batch(processor, batch: int, reps: int = 50) -> dict:
    """vsurge: one step's masks for `batch` rows (nested schema, rows at different positions),
    one row at a time vs `fill_bitmasks` (llguidance's threads, no GIL). Seconds per step."""
    import vsurge.structured.matcher as matcher_module
    from vsurge.structured.compiler import GrammarCompiler
    from vsurge.structured.matcher import fill_bitmasks

    matcher_module.PARALLEL_MIN_ROWS = matcher_module.PARALLEL_MIN_CPUS = 1  # always the threaded path
    compiler = GrammarCompiler(processor)
    case = CASES[1]
    tokens = processor.encode(case.document, add_special_tokens=False)
    rows = []
    for i in range(batch):
        matcher = compiler.matcher({"json": case.spec})
        matcher.accept_tokens(tokens[: (i * 7) % (len(tokens) - 1)])
        rows.append((i, matcher))
    bitmask = compiler.allocate_bitmask(batch)
    times = {"loop": [], "parallel": []}
    for _ in range(reps):
        start = time.perf_counter()
        for row, matcher in rows:
            matcher.fill_bitmask(bitmask, row)
        times["loop"].append(time.perf_counter() - start)
        start = time.perf_counter()
        fill_bitmasks(bitmask, rows)
        times["parallel"].append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in times.items()}


def requirement_closure(distribution: str) -> list[str]:
    """Installed distributions `distribution` needs (its declared non-extra requirements, transitively)."""
    seen, todo = [], [distribution]
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        seen.append(key)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for req in requires:
            if "extra ==" in req:
                continue
            if ";" in req and not _marker_holds(req.split(";", 1)[1]):
                continue
            todo.append(re.split(r"[\s<>=!~;\[(]", req, maxsplit=1)[0])
    return seen


def _marker_holds(marker: str) -> bool:
    try:
        from packaging.markers import Marker

        return Marker(marker).evaluate()
    except Exception:
        return True


def installed_mib(distribution: str) -> float | None:
    try:
        files = metadata.distribution(distribution).files or []
    except metadata.PackageNotFoundError:
        return None
    total = 0
    for f in files:
        path = f.locate()
        if os.path.isfile(path):
            total += os.path.getsize(path)
    return total / 2**20


# ---------------------------------------------------------------- report

def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g}"


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.0f}" if seconds >= 1e-5 else f"{seconds * 1e6:.1f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--libraries", default=",".join(LIBRARIES))
    parser.add_argument("--walks", type=int, default=5)
    parser.add_argument("--compile-reps", type=int, default=3)
    parser.add_argument("--json", help="also write the raw results to this file")
    args = parser.parse_args(argv)

    from vsurge.loading import load_processor

    processor = load_processor("default")
    print(f"vocabulary: {processor.vocab_size} tokens; walks: {args.walks}; compile reps: {args.compile_reps}\n")
    results: dict = {}
    for name in args.libraries.split(","):
        lib = LIBRARIES[name]
        start = time.perf_counter()
        try:
            importlib.import_module(lib.module)
        except ImportError:
            print(f"{name}: not installed, skipped")
            continue
        imported = time.perf_counter() - start
        start = time.perf_counter()
        lib.prepare(processor)
        vocab = time.perf_counter() - start
        results[name] = {"import": imported, "vocab": vocab, "version": metadata.version(lib.distribution),
                         "cases": {c.name: measure(lib, c, processor, args.walks, args.compile_reps) for c in CASES}}

    print("| library | constraint | compile ms | first mask µs | mask p50 µs | mask p99 µs | accept p50 µs |")
    print("|---|---|---|---|---|---|---|")
    for name, r in results.items():
        for case, t in r["cases"].items():
            if "error" in t:
                print(f"| {name} | {case} | failed: {t['error']} | | | | |")
            else:
                print(f"| {name} | {case} | {_ms(t['compile'])} | {_us(t['first_mask'])} | {_us(t['mask_p50'])} "
                      f"| {_us(t['mask_p99'])} | {_us(t['accept_p50'])} |")
    print("\n| library | version | import s | vocab s | requires (installed closure) | installed MiB |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        closure = requirement_closure(LIBRARIES[name].distribution)
        sizes = [installed_mib(d) for d in closure]
        own = f"{sizes[0]:.1f}" if sizes[0] is not None else "?"
        total = sum(s for s in sizes if s is not None)
        deps = ", ".join(closure[1:]) or "nothing"
        print(f"| {name} | {r['version']} | {r['import']:.2f} | {r['vocab']:.2f} | {deps} | "
              f"{own} alone, {total:.0f} with requirements |")
    if "vsurge" in results:
        print(f"\n| rows per step (vsurge, nested schema, {os.cpu_count()} CPUs) | one by one µs "
              "| llguidance threads µs |")
        print("|---|---|---|")
        for batch in (8, 32):
            t = measure_batch(processor, batch)
            results["vsurge"][f"batch_{batch}"] = t
            print(f"| {batch} | {_us(t['loop'])} | {_us(t['parallel'])} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
