"""The package's shape, read from the source (ast; imports nothing of vsurge, no JAX).

- no import cycle between modules (function-level imports count too: a lazy import is still a
  dependency, and a circle is usually a type that wants its own module);
- no import that climbs back up the layers (LAYERS, lowest first; a module may import its own
  layer and those below);
- the default context length is written in one file (engine/config.py declares it, every CLI
  flag and default reads it from there).

docs/architecture.md describes the layers.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

SRC = pathlib.Path(__file__).resolve().parent.parent / "src" / "vsurge"

# Lowest first. A module's layer is that of its longest prefix listed here (names relative to vsurge).
LAYERS = [
    # plain data and leaves: no vsurge imports beyond this layer
    ["errors", "config", "metrics", "streams", "kernels", "structured", "tokenizer", "multimodal", "bench_plot"],
    ["sampling_params", "devices", "sharding"],  # SamplingParams (its structured-output field); meshes
    ["ops"],  # JAX ops: attention, RoPE, MoE, sampling, matmuls
    ["kv"],  # the KV caches and page pools
    ["models"],  # the model families
    ["loading"],  # checkpoints -> models
    ["lora"],  # LoRA adapters: read, laid out on a model, their device slots
    ["engine"],  # the core step loop: scheduler, programs, engine core, driver
    ["scale"],  # scale-out: replicas, multi-host, disaggregated serving, remote engines
    ["generation", "generation_defaults", "vsurge", "vinference", "seed"],  # the Python faces
    ["server"],  # HTTP
    ["cli", "cli_args", "cli_engine", "cli_chat", "cli_models", "bench_serve", ""],  # the command line; "" = vsurge/__init__.py
]


def _modules() -> dict[str, pathlib.Path]:
    mods = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The longest known module that `name` (relative to vsurge) names or lies in."""
    while name not in MODULES:
        if "." not in name:
            return None
        name = name.rsplit(".", 1)[0]
    return name


def _imports(module: str, path: pathlib.Path, top_level_only: bool = False) -> set[str]:
    """The vsurge modules `module` imports anywhere in its file (relative names); top_level_only:
    only those its import runs (module-level statements)."""
    is_package = path.name == "__init__.py"
    out = set()
    tree = ast.parse(path.read_text(), str(path))
    for node in tree.body if top_level_only else ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name[len("vsurge."):] for a in node.names if a.name.startswith("vsurge.")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if module else []
                if not is_package:
                    base = base[:-1]
                base = base[:len(base) - (node.level - 1)]
                if node.module:
                    base += node.module.split(".")
            elif node.module == "vsurge" or (node.module or "").startswith("vsurge."):
                base = node.module.split(".")[1:]
            else:
                continue
            prefix = ".".join(base)
            targets = [f"{prefix}.{a.name}".strip(".") if f"{prefix}.{a.name}".strip(".") in MODULES else prefix
                       for a in node.names]
        for target in targets:
            found = _resolve(target)
            if found is not None and found != module:
                out.add(found)
    return out


GRAPH = {module: _imports(module, path) for module, path in MODULES.items()}


def _layer(module: str) -> int:
    best, layer = -1, None
    for i, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".") or name == "") and len(name) > best:
                best, layer = len(name), i
    assert layer is not None, f"vsurge.{module} is in no layer: add it to LAYERS in tests/test_structure.py"
    return layer


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return found


def test_the_walk_sees_the_package():
    assert {"engine.core", "engine.scheduler", "kv.page_manager", "server.app", "cli"} <= set(MODULES)
    assert "engine.config" in GRAPH["engine.core"]
    assert "kv.page_table" in GRAPH["kv.page_manager"]


def test_no_import_cycles():
    assert _cycles() == [], "modules that import each other (directly or around a circle)"


def test_no_import_climbs_up_the_layers():
    upward = sorted(f"vsurge.{a} (layer {_layer(a)}) imports vsurge.{b} (layer {_layer(b)})"
                    for a, targets in GRAPH.items() for b in targets if _layer(b) > _layer(a))
    assert upward == []


@pytest.mark.parametrize("module", ["engine.config", "engine.scheduler", "kv.page_manager", "sampling_params",
                                    "server.protocol"])
def test_pure_python_modules_import_no_jax(module):
    """What the server and the CLI's argument parsing load must not pull in JAX (a second of start-up)."""
    seen, todo = set(), [module]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        tree = ast.parse(MODULES[m].read_text())
        for node in tree.body:  # module level only: a lazy import inside a function is the point
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            assert not any(n == "jax" or n.startswith(("jax.", "flax")) for n in names), f"vsurge.{m} imports JAX"
        todo += _imports(m, MODULES[m], top_level_only=True)


def test_default_context_length_is_written_once():
    """The default context length (2048) lives in engine/config.py; every other default reads it."""
    allowed = {"server/adapters/embeddings.py"}  # MAX_INPUTS = 2048: OpenAI's inputs per request, not a length
    files = set()
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        if rel in allowed:
            continue
        if any(isinstance(n, ast.Constant) and n.value == 2048 and type(n.value) is int
               for n in ast.walk(ast.parse(path.read_text()))):
            files.add(rel)
    assert files == {"engine/config.py"}
