"""Cut OpenAI's OpenAPI spec (github.com/openai/openai-openapi, MIT) down to what vsurge serves:
the operations below and every schema they reference, transitively -> tests/data/openapi/openai_subset.json
(read by tests/server/test_conformance_schemas.py).

    git clone https://github.com/openai/openai-openapi /tmp/openai-openapi
    python tests/tools/cut_openapi.py /tmp/openai-openapi            # openapi.json (or .yaml) of its HEAD

The spec is OpenAPI 3.1 (its schemas are JSON Schema 2020-12); any OpenAPI 3.0 `nullable: true`
left in it becomes a type union with "null", so jsonschema reads it as OpenAPI means it.
Descriptions and examples are dropped (they are most of the size and validate nothing).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

OPERATIONS = {  # path -> the methods vsurge serves
    "/chat/completions": ("post",),
    "/completions": ("post",),
    "/responses": ("post",),
    "/responses/{response_id}": ("get", "delete"),
    "/embeddings": ("post",),
    "/models": ("get",),
    "/models/{model}": ("get",),
}
EXTRA_SCHEMAS = ("ErrorResponse", "Error")  # every error body (the operations list only 429's)
DROP_KEYS = ("description", "example", "examples", "x-oaiMeta", "x-stainless-naming", "title", "deprecated",
             "x-oaiExpandable", "x-oaiTypeLabel", "x-stainless-const", "x-oaiDocs")
OUT = Path(__file__).resolve().parent.parent / "data" / "openapi" / "openai_subset.json"
LICENSE = ("MIT License, Copyright (c) OpenAI (https://openai.com): the spec's schemas are copied from "
           "https://github.com/openai/openai-openapi under the MIT License; its full text is in "
           "tests/data/openapi/LICENSE-openai-openapi.")


def load(repo: Path) -> dict:
    if (repo / "openapi.json").exists():
        return json.loads((repo / "openapi.json").read_text())
    import yaml  # only for a checkout that has no openapi.json

    return yaml.safe_load((repo / "openapi.yaml").read_text())


def refs(node) -> set[str]:
    found: set[str] = set()
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            found.add(node["$ref"])
        for value in node.values():
            found |= refs(value)
    elif isinstance(node, list):
        for value in node:
            found |= refs(value)
    return found


def strip(node, in_properties: bool = False):
    """Drops documentation keys (not property names that happen to be spelled so); nullable -> a null union."""
    if isinstance(node, list):
        return [strip(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if not in_properties and key in DROP_KEYS:
            continue
        out[key] = strip(value, in_properties=key in ("properties", "patternProperties", "$defs", "schemas"))
    if not in_properties and out.pop("nullable", False) is True:
        if isinstance(out.get("type"), str):
            out["type"] = [out["type"], "null"]
        elif isinstance(out.get("type"), list):
            out["type"] = list(out["type"]) + ["null"]
        elif "enum" in out:
            out = {"anyOf": [out, {"type": "null"}]}
        else:
            out = {"anyOf": [out, {"type": "null"}]}
    return out


def cut(spec: dict) -> dict:
    paths = {}
    for path, methods in OPERATIONS.items():
        if path not in spec["paths"]:
            continue
        item = spec["paths"][path]
        paths[path] = {m: item[m] for m in methods if m in item}
        if "parameters" in item:
            paths[path]["parameters"] = item["parameters"]
    components: dict[str, dict] = {}
    todo = refs(paths) | {f"#/components/schemas/{name}" for name in EXTRA_SCHEMAS}
    while todo:
        ref = todo.pop()
        _, _, kind, name = ref.split("/", 3)
        if name in components.get(kind, {}):
            continue
        node = spec["components"][kind][name]
        components.setdefault(kind, {})[name] = node
        todo |= refs(node)
    for kind in components:
        components[kind] = dict(sorted(components[kind].items()))
    return {"openapi": spec["openapi"], "info": {"title": spec["info"]["title"], "version": spec["info"]["version"]},
            "paths": strip(paths), "components": strip(components)}


def main(argv: list[str]) -> None:
    repo = Path(argv[1] if len(argv) > 1 else ".")
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    if len(argv) > 2:  # the commit, when the spec file was exported from a git dir with no work tree
        commit = argv[2]
    subset = cut(load(repo))
    subset = {"x-vsurge-source": {"repository": "https://github.com/openai/openai-openapi", "commit": commit,
                                  "file": "openapi.json", "license": LICENSE,
                                  "cut_by": "tests/tools/cut_openapi.py"}, **subset}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(subset, indent=1, sort_keys=False) + "\n")
    print(f"{OUT}: {OUT.stat().st_size} bytes, {len(subset['components']['schemas'])} schemas")


if __name__ == "__main__":
    main(sys.argv)
