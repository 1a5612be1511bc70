"""A package's names imported on first use (PEP 562): `import vsurge` stays instant, and the pure-Python parts
(scheduler, page manager, CLI argument parsing) never load JAX."""

from __future__ import annotations

import sys
from importlib import import_module
from typing import Callable


def lazy_getattr(package: str, exports: dict[str, str]) -> Callable[[str], object]:
    """The module `__getattr__` of `package`: imports each name of `exports` (name -> the module defining it,
    relative to `package`) on its first lookup and keeps it in the package, so later lookups skip this."""

    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(exports[name], package), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
