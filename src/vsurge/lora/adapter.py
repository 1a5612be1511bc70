"""A LoRA adapter in host memory, read from HF PEFT's form (a directory with `adapter_config.json` and
`adapter_model.safetensors`), checked against the model it is to serve with.

Each adapted projection keeps A (fan_in, r) and B (r, fan_out) float32 in the model's own layout: B's
rows are those of the projection's rows in a fused checkpoint tensor (Phi-3's qkv_proj), put in the
rotary order the model computes with where the checkpoint interleaves them (models/spec.py), and the
adapter's scaling (lora_alpha / r, or / sqrt(r) with rsLoRA) is folded into B.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from pathlib import Path

import numpy as np

from ..errors import UnsupportedModelError
from ..models.spec import _unpermute
from .layout import Projection, model_projections

_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<part>[AB])(?:\.[\w-]+)?\.weight$")


class AdapterError(ValueError):
    """An adapter that cannot be served with this model (the message names why)."""


@dataclasses.dataclass
class Adapter:
    name: str
    path: str
    rank: int  # the largest rank of its projections
    key: int  # a content hash: the prefix cache keys this adapter's pages by it
    # (layer, site, projection) -> (A (fan_in, r), B (r, fan_out) scaled), float32
    weights: dict[tuple[int, str, str], tuple[np.ndarray, np.ndarray]]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.weights.values())

    @property
    def modules(self) -> list[str]:
        return sorted({name for _, _, name in self.weights})


def _pattern_value(patterns: dict, module: str, default):
    """PEFT's rank_pattern / alpha_pattern: a key matches a module name ending in it (as a regex)."""
    for pattern, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?({pattern})$", module):
            return value
    return default


def _read_config(folder: Path) -> dict:
    path = folder / "adapter_config.json"
    if not path.is_file():
        raise AdapterError(f"{folder}: no adapter_config.json (a PEFT LoRA adapter directory is expected)")
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise AdapterError(f"{path}: not readable JSON ({exc})") from None
    kind = config.get("peft_type", "LORA")
    if str(kind).upper() != "LORA":
        raise AdapterError(f"{path}: peft_type {kind!r} is not LoRA")
    if config.get("use_dora"):
        raise AdapterError(f"{path}: DoRA adapters (use_dora) are not supported")
    if config.get("bias", "none") != "none":
        raise AdapterError(f"{path}: adapters that train biases (bias={config['bias']!r}) are not supported")
    if config.get("fan_in_fan_out"):
        raise AdapterError(f"{path}: fan_in_fan_out adapters (Conv1D models) are not supported")
    if config.get("modules_to_save"):
        raise AdapterError(f"{path}: modules_to_save ({config['modules_to_save']}) are full weights, not LoRA; "
                           "they are not supported")
    return config


def _read_tensors(folder: Path) -> dict[str, np.ndarray]:
    path = folder / "adapter_model.safetensors"
    if not path.is_file():
        found = "adapter_model.bin" if (folder / "adapter_model.bin").is_file() else "none"
        raise AdapterError(f"{folder}: no adapter_model.safetensors (found: {found}); save the adapter with "
                           "safe_serialization=True")
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise AdapterError(f"{path}: not a readable safetensors file ({exc})") from None
    except Exception as exc:  # noqa: BLE001: safetensors raises its own types for other corruption
        if "bfloat16" in str(exc) or "dtype" in str(exc).lower():
            return _read_bf16(path)
        raise AdapterError(f"{path}: not a readable safetensors file ({exc})") from None


def _read_bf16(path: Path) -> dict[str, np.ndarray]:
    """A bfloat16 safetensors file (numpy has no bfloat16): read through ml_dtypes' bfloat16."""
    import ml_dtypes
    from safetensors import safe_open

    out = {}
    with safe_open(str(path), "flax") as f:
        for name in f.keys():
            out[name] = np.asarray(f.get_tensor(name).astype(ml_dtypes.bfloat16)).astype(np.float32)
    return out


def load_peft(name: str, path: str | Path, model, max_rank: int) -> Adapter:
    """Read a PEFT LoRA adapter for `model` (its layout: lora/layout.py). Raises AdapterError naming the
    problem: files missing or corrupt, a module the model has no adaptable projection for, shapes that
    do not fit, a rank above `max_rank`."""
    folder = Path(path)
    if not folder.is_dir():
        raise AdapterError(f"{path}: not a directory (a PEFT LoRA adapter directory is expected)")
    config = _read_config(folder)
    tensors = _read_tensors(folder)
    by_module: dict[str, dict[str, np.ndarray]] = {}
    for key, value in tensors.items():
        match = _KEY.match(key)
        if match is None:
            raise AdapterError(f"{folder}: tensor {key!r} is not a LoRA A/B matrix of a linear projection "
                               "(embedding and other adapters are not supported)")
        by_module.setdefault(match["module"], {})[match["part"]] = np.asarray(value, np.float32)
    if not by_module:
        raise AdapterError(f"{folder}: the adapter holds no LoRA weights")
    targets: dict[str, list[Projection]] = {}
    for layer in model_projections(model):
        for projections in layer.values():
            for p in projections:
                if p.hf_module is not None:
                    targets.setdefault(p.hf_module, []).append(p)
    weights = {}
    rank = 0
    for module, parts in sorted(by_module.items()):
        if set(parts) != {"A", "B"}:
            raise AdapterError(f"{folder}: {module} has lora_{'A' if 'A' not in parts else 'B'} missing")
        projections = targets.get(module)
        if projections is None:
            raise AdapterError(f"adapter {name!r} adapts {module}, which this model ({model.config.architecture}) "
                               "does not serve adapters on (supported: the attention and dense MLP projections)")
        a, b = parts["A"], parts["B"]  # (r, in), (out, r)
        r = a.shape[0]
        if a.ndim != 2 or b.ndim != 2 or b.shape[1] != r:
            raise AdapterError(f"{folder}: {module}'s A {a.shape} and B {b.shape} are not a rank-r pair")
        if r > max_rank:
            raise AdapterError(f"adapter {name!r} has rank {r} on {module}, above the server's --max-lora-rank "
                               f"{max_rank}")
        rank = max(rank, r)
        alpha = _pattern_value(config.get("alpha_pattern"), module, config.get("lora_alpha", r))
        r_config = _pattern_value(config.get("rank_pattern"), module, config.get("r", r))
        if r_config != r:
            raise AdapterError(f"{folder}: {module} has rank {r} but the config says {r_config}")
        scale = alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
        for p in projections:
            if a.shape[1] != p.fan_in:
                raise AdapterError(f"adapter {name!r}: {module}'s A takes {a.shape[1]} inputs, the model's "
                                   f"projection takes {p.fan_in} (an adapter for another base model?)")
            rows = b if p.hf.rows is None else b[p.hf.rows[0]:p.hf.rows[1]]
            if rows.shape[0] != p.fan_out:
                raise AdapterError(f"adapter {name!r}: {module}'s B gives {b.shape[0]} outputs, the model's "
                                   f"projection gives {p.fan_out} (an adapter for another base model?)")
            if p.hf.permuted_heads:  # the checkpoint's rotary rows interleaved: the model's order
                rows = _unpermute(rows, 0, p.hf.permuted_heads, p.hf.permute_span)
            weights[(p.layer, p.site, p.name)] = (np.ascontiguousarray(a.T), np.ascontiguousarray(rows.T * scale))
    digest = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode())
    for key in sorted(tensors):
        digest.update(key.encode())
        digest.update(np.ascontiguousarray(tensors[key]).tobytes())
    return Adapter(name, str(folder), rank, int.from_bytes(digest.digest()[:8], "little") >> 1, weights)


def check_servable(model) -> None:
    """Raise when the model's family does not route its projections through the adapter sites."""
    if not getattr(type(model), "supports_lora", False):
        raise UnsupportedModelError(f"LoRA adapters are not served on {model.config.architecture} models yet")
