"""The package's shape, read from the source (ast; imports nothing of vsurge, no JAX).

- no import cycle between modules (function-level imports count too: a lazy import is still a
  dependency, and a circle is usually a type that wants its own module; so do `import_module`
  calls, the lazy re-exports' way in);
- no import that climbs back up the layers (LAYERS, lowest first; a module may import its own
  layer and those below), and docs/architecture.md's layer diagram lists LAYERS as they are;
- the seed's fence: nothing outside seed/ imports it but the package root, its one door (and tests
  and benchmarks outside tests/seed/ take its names from there);
- no class name is defined in two modules (one name, one thing);
- program kinds are spelled only in their table (engine/program_kinds.py);
- the default context length is written in one file (engine/engine_config.py declares it, every CLI
  flag and default reads it from there).

LAYERS, here, is where the layering is declared; docs/architecture.md's diagram is checked against it.
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "vsurge"

# Lowest first. A module's layer is that of its longest prefix listed here (names relative to vsurge).
LAYERS = [
    # plain data and leaves: no vsurge imports beyond this layer
    ["errors", "config", "kernels", "structured", "lazy_exports"],
    ["tokenizer"],  # chat templates, detokenizing (no JAX)
    ["multimodal"],  # images: decoded, tiled, their placeholders in the chat prompt (no JAX)
    ["sampling", "hardware"],  # SamplingParams and the defaults of its fields; platform, dtypes, meshes
    ["ops"],  # JAX ops: attention, RoPE, MoE, sampling, matmuls
    ["kv"],  # the KV caches and page pools
    ["models.parts"],  # what the families share: the decoder contract, blocks, MoE, vision towers, config
    ["models.families"],  # the model families, one module each (parts never import a family)
    ["models"],  # the registry: every family module found in models/families/
    ["loading"],  # checkpoints -> models
    ["lora"],  # LoRA adapters: read, laid out on a model, their device slots
    ["engine"],  # the core step loop: scheduler, programs, engine core, driver
    ["scale"],  # scale-out: replicas, multi-host, disaggregated serving, remote engines
    ["vsurge", "seed"],  # the Python faces: vSurge, and the seed's classes (vInference in seed/vinference/)
    ["server"],  # HTTP
    ["cli", "scale.ray_serve", ""],  # the command line; Ray Serve replicas built from its flags; vsurge/__init__.py
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


def _relative(package: list[str], name: str) -> str:
    """`name` ("..seed.engines", ".config") resolved from inside `package` as `from <name> import`
    would, relative to vsurge."""
    level = len(name) - len(name.lstrip("."))
    base = package[:len(package) - (level - 1)] + name[level:].split(".")
    return ".".join(base).strip(".")


def _is_import_module(node) -> bool:
    func = node.func if isinstance(node, ast.Call) else None
    names = ("import_module", "lazy_getattr")  # (lazy_exports.lazy_getattr imports its table's modules)
    return (isinstance(func, ast.Name) and func.id in names) or (
        isinstance(func, ast.Attribute) and func.attr in names)


def _package_walked(package: list[str], arg, tree) -> str | None:
    """The package (relative to vsurge) whose every module `import_module(f"{pkg.__name__}.{name}")` may load,
    where `pkg` is a package the file imported (`from . import families as pkg`; the registry's discovery)."""
    first = arg.values[0] if isinstance(arg, ast.JoinedStr) and arg.values else None
    value = first.value if isinstance(first, ast.FormattedValue) else None
    if not (isinstance(value, ast.Attribute) and value.attr == "__name__" and isinstance(value.value, ast.Name)):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == value.value.id:
                    prefix = "." * node.level + (node.module or "")
                    name = (_relative(package, prefix) if node.level else prefix.removeprefix("vsurge"))
                    return ".".join(p for p in (name.strip("."), alias.name) if p)
    return None


def _dynamic_imports(module: str, is_package: bool, node, tree) -> list[str]:
    """The modules an `import_module(...)` call may load (relative to vsurge): a literal name, else
    (a lazy re-export table, a registry) every string constant of the file that names a module:
    relative ones ("..seed.engines") from the package, and for f"{__package__}.{name}" the package's
    own modules by name. The names are resolved against MODULES: a string that names none is ignored."""
    if not _is_import_module(node) or not node.args:
        return []
    package = (module.split(".") if module else []) if is_package else module.split(".")[:-1]
    arg = node.args[0]
    walked = _package_walked(package, arg, tree)
    if walked is not None:
        return [name for name in MODULES if name.startswith(walked + ".")]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        names = [arg.value]
    else:
        names = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    out = []
    for name in names:
        if not re.fullmatch(r"\.*\w+(\.\w+)*", name):
            continue  # no module name (text, "...")
        if name.startswith("vsurge."):
            out.append(name[len("vsurge."):])
        elif name.startswith("."):
            out.append(_relative(package, name))
        elif isinstance(arg, ast.JoinedStr) and re.fullmatch(r"\w+", name):
            out.append(".".join([*package, name]))  # f"{__package__}.{module}"
    return [name for name in out if name in MODULES]


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
        targets += _dynamic_imports(module, is_package, node, tree)
        for target in targets:
            found = _resolve(target)
            if found is not None and found != module:
                out.add(found)
    return out


EVERY_IMPORT = {module: _imports(module, path) for module, path in MODULES.items()}

# Imports (import_module included) that climb up or close a circle and must stay for now, each with why:
# delete a line when its import goes (test_known_lazy_imports_are_still_there fails until then, so the
# list cannot go stale). Empty: engine/__init__.py's re-export of the seed's classes is gone (issue 61).
KNOWN: dict[tuple[str, str], str] = {}
GRAPH = {module: {t for t in targets if (module, t) not in KNOWN} for module, targets in EVERY_IMPORT.items()}


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
    assert "engine.engine_config" in GRAPH["engine.core"]
    assert "kv.page_table" in GRAPH["kv.page_manager"]


def test_the_walk_follows_import_module():
    """A lazy re-export's table and a registry's f"{__package__}.{name}" count as imports."""
    assert {"engine.core", "engine.scheduler"} <= EVERY_IMPORT["engine"]  # engine/__init__.py's _EXPORTS
    # the registry's discovery: import_module(f"{family_modules.__name__}.{name}") over models/families/
    assert {"models.families.llama", "models.families.qwen3_next"} <= EVERY_IMPORT["models.registry"]


def test_known_lazy_imports_are_still_there():
    assert [edge for edge in KNOWN if edge[1] not in EVERY_IMPORT[edge[0]]] == []


def _in_seed(module: str) -> bool:
    return module == "seed" or module.startswith("seed.")


# The seed's fence (issue 61): seed/ holds the seed's classes on top of vsurge's own API, and only the
# package root (`from vsurge import vEngine`, the seed's documents' `easydel.inference.vsurge.vEngine`)
# re-exports them. Other modules that still import seed/, each with why (delete a line when it goes):
SEED_IMPORTERS_KNOWN: dict[str, str] = {}


def test_nothing_outside_seed_imports_it_but_the_package_root():
    """import_module included: a lazy re-export of a seed name (engine/__init__.py had one) fails here."""
    importers = {module for module, targets in EVERY_IMPORT.items()
                 if not _in_seed(module) and any(_in_seed(t) for t in targets)}
    assert importers - {""} - set(SEED_IMPORTERS_KNOWN) == set()
    assert set(SEED_IMPORTERS_KNOWN) <= importers, "a known seed importer no longer imports it: delete its line"


def test_tests_and_benchmarks_import_the_seed_through_its_door():
    """Outside tests/seed/, the seed's names come from the package root (`from vsurge import vDriver`),
    as users import them, never from vsurge.seed.* or as re-exports of another package."""
    seed_names = {"vEngine", "oEngine", "vDriver", "oDriver", "GenerationState", "ModelOutputBatch",
                  "ActiveSequenceBatch", "AbstractDriver", "AbstractInferenceEngine", "vInference"}
    found = []
    for folder in ("tests", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.is_relative_to(ROOT / "tests" / "seed"):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                module = node.module or "" if isinstance(node, ast.ImportFrom) else None
                if module is None or module == "vsurge" or not module.startswith("vsurge"):
                    continue
                if module.startswith("vsurge.seed") or seed_names & {a.name for a in node.names}:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} from {module} import ...")
    assert found == []


def test_no_import_cycles():
    assert _cycles() == [], "modules that import each other (directly or around a circle)"


def _diagram_layers() -> list[list[str]]:
    """docs/architecture.md's layer diagram: per row (a line that starts with a name), its names."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("## Layers", 1)[1].split("```", 2)[1]
    rows = []
    for line in block.splitlines():
        names = []
        for word in line.split() if line[:1].strip() else ():
            if not re.fullmatch(r"\w+(/\w+)*(\.py|/)", word):
                break
            names.append("" if word == "__init__.py" else word.removesuffix(".py").removesuffix("/").replace("/", "."))
        if names:
            rows.append(names)
    return rows


def test_the_layer_diagram_is_LAYERS():
    """docs/architecture.md draws LAYERS (a row per layer, lowest first, every name of it)."""
    assert _diagram_layers() == LAYERS


def test_no_import_climbs_up_the_layers():
    upward = sorted(f"vsurge.{a} (layer {_layer(a)}) imports vsurge.{b} (layer {_layer(b)})"
                    for a, targets in GRAPH.items() for b in targets if _layer(b) > _layer(a))
    assert upward == []


def test_no_class_name_is_defined_twice():
    """A class name means one thing in the package (an alias, `X = Y`, is the same class)."""
    where: dict[str, list[str]] = {}
    for module, path in MODULES.items():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(module)
    assert {name: modules for name, modules in where.items() if len(modules) > 1} == {}


def test_program_kinds_are_spelled_only_in_their_table():
    """engine/ and scale/ build program keys with the kind objects (DECODE.key(rows, window)) and never
    compare a key's name: no tuple led by a kind's name, no `key[0] == "<kind>"`, outside the table."""
    table = ast.parse(MODULES["engine.program_kinds"].read_text())
    names = {node.args[0].value for node in ast.walk(table) if isinstance(node, ast.Call)
             and getattr(node.func, "id", None) == "ProgramKind" and isinstance(node.args[0], ast.Constant)}
    assert {"init", "set_slot", "decode", "mixed", "export", "import", "copy", "vision"} <= names
    spelled = []
    for module, path in MODULES.items():
        if not module.startswith(("engine", "scale")) or module == "engine.program_kinds":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            # a key: led by a kind's name (a tuple of nothing but kind names lists them: encode.KINDS)
            key = isinstance(node, ast.Tuple) and node.elts and not all(
                isinstance(e, ast.Constant) and e.value in names for e in node.elts[1:] or [None])
            if key and isinstance(node.elts[0], ast.Constant) and node.elts[0].value in names:
                spelled.append(f"{module}:{node.lineno} {ast.unparse(node)}")
            if (isinstance(node, ast.Compare) and isinstance(node.left, ast.Subscript)
                    and any(isinstance(c, ast.Constant) and c.value in names for c in node.comparators)):
                spelled.append(f"{module}:{node.lineno} {ast.unparse(node)}")
    assert spelled == []


@pytest.mark.parametrize("module", ["engine.engine_config", "engine.scheduler", "kv.page_manager", "sampling.params",
                                    "sampling.defaults", "server.protocol"])
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
    """The default context length (2048) lives in engine/engine_config.py; every other default reads it."""
    allowed = {"server/adapters/embeddings.py",  # MAX_INPUTS = 2048: OpenAI's inputs per request, not a length
               "scale/ray_serve/prefixes.py"}  # RECENT_BLOCKS = 2048: prefix hashes a replica remembers
    files = set()
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        if rel in allowed:
            continue
        if any(isinstance(n, ast.Constant) and n.value == 2048 and type(n.value) is int
               for n in ast.walk(ast.parse(path.read_text()))):
            files.add(rel)
    assert files == {"engine/engine_config.py"}


def test_tests_mirror_the_package_with_unique_file_names():
    """tests/<package>/ holds the tests of vsurge/<package>/ (docs/testing.md); every folder is importable by
    module name (tests/conftest.py), so no two test files may share a name."""
    tests = ROOT / "tests"
    files = sorted(tests.rglob("test_*.py"))
    names = [path.name for path in files]
    assert sorted({n for n in names if names.count(n) > 1}) == []
    strays = [str(path.relative_to(tests)) for path in files
              if path.parent != tests and not (SRC / path.parent.relative_to(tests)).is_dir()]
    assert strays == [], "test folders that name no package of vsurge"
