"""JSON schemas no output can satisfy, found before they reach the grammar engine.

llguidance compiles them and the model then writes until its length runs out: a 200 with broken
JSON. Two kinds are refused here (ValueError naming the keyword):

- counts no output can hold: `minItems`, `minLength`, `minProperties`, `minContains` above
  MAX_COUNT (2^24: more characters than any context of tokens spells);
- values that must contain themselves: a `$ref` whose every instance needs another instance of
  it (a required property, or an array's required items, leads back to it with no way out).
  A schema is *finite* when some finite JSON value satisfies it; a `$ref`'s finiteness is a least
  fixed point over the refs (iterated until nothing changes), so a cycle is finite only where some
  branch of it (an optional property, an `anyOf` member, `minItems: 0`) ends.

Conservative: a schema refused here has no satisfying value, but not every unsatisfiable schema is
caught (llguidance's own checks, such as minimum above maximum, catch more).
"""

from __future__ import annotations

MAX_COUNT = 1 << 24
COUNTS = ("minItems", "minLength", "minProperties", "minContains")


def check_schema(schema) -> None:
    """ValueError when `schema` (a JSON schema, parsed) certainly has no satisfying value."""
    _check_counts(schema)
    finite_refs = _finite_refs(schema)
    if not _finite(schema, schema, finite_refs):
        cycle = sorted(ref for ref in _refs(schema) if ref not in finite_refs)
        raise ValueError(f"no finite JSON value satisfies the JSON schema: every value of {', '.join(cycle)} "
                         f"must contain another (through required properties or items)")


def _walk(node):
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            yield item
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _check_counts(schema) -> None:
    for node in _walk(schema):
        for key in COUNTS:
            value = node.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value > MAX_COUNT:
                raise ValueError(f"{key} {value} asks for more than any output can hold (at most {MAX_COUNT})")


def _refs(schema) -> set[str]:
    return {node["$ref"] for node in _walk(schema) if isinstance(node.get("$ref"), str)
            and node["$ref"].startswith("#")}


def _resolve(root, ref: str):
    """The subschema a local `$ref` ("#/$defs/a") points at, or None."""
    node = root
    for part in ref[1:].split("/")[1:] if ref != "#" else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _finite_refs(root) -> set[str]:
    """The local refs some finite value satisfies (least fixed point)."""
    refs, finite = _refs(root), set()
    changed = True
    while changed:
        changed = False
        for ref in refs - finite:
            target = _resolve(root, ref)
            if target is None or _finite(target, root, finite):  # an unresolvable ref is not ours to judge
                finite.add(ref)
                changed = True
    return finite


def _finite(node, root, finite_refs: set[str]) -> bool:
    """Whether some finite value satisfies `node`, given which refs are known finite (unknown: not)."""
    if not isinstance(node, dict):
        return node is not False
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#") and ref not in finite_refs:
        return False
    if not all(_finite(sub, root, finite_refs) for sub in node.get("allOf") or [] if isinstance(sub, (dict, bool))):
        return False
    for key in ("anyOf", "oneOf"):
        options = [sub for sub in node.get(key) or [] if isinstance(sub, (dict, bool))]
        if options and not any(_finite(sub, root, finite_refs) for sub in options):
            return False
    if "enum" in node or "const" in node:
        return True
    types = node.get("type")
    types = [types] if isinstance(types, str) else types if isinstance(types, list) else None
    if types is None:  # untyped: its object or array keywords bind only objects and arrays; other values pass
        return True
    return any(_finite_of_type(kind, node, root, finite_refs) for kind in types)


def _finite_of_type(kind: str, node: dict, root, finite_refs: set[str]) -> bool:
    if kind == "object":
        properties = node.get("properties") if isinstance(node.get("properties"), dict) else {}
        extra = node.get("additionalProperties", True)
        for name in node.get("required") or []:
            schema = properties.get(name, extra) if isinstance(name, str) else True
            if not _finite(schema, root, finite_refs):
                return False
        return True
    if kind == "array":
        need = node.get("minItems", 0)
        if not isinstance(need, int) or need <= 0:
            return True
        prefix = node.get("prefixItems") if isinstance(node.get("prefixItems"), list) else []
        items = node.get("items", True)
        if isinstance(items, list):  # draft-4 tuple form
            prefix, items = items, node.get("additionalItems", True)
        needed = prefix[:need] + ([items] if need > len(prefix) else [])
        return all(_finite(sub, root, finite_refs) for sub in needed)
    return True
