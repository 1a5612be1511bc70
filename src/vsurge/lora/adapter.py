"""A LoRA adapter in host memory, read from HF PEFT's form (a directory with `adapter_config.json` and
`adapter_model.safetensors`), checked against the model it is to serve with.

Each adapted projection keeps A (fan_in, r) and B (r, fan_out) float32 in the model's own layout: B's
rows are those of the projection's rows in a fused checkpoint tensor (Phi-3's qkv_proj), put in the
rotary order the model computes with where the checkpoint interleaves them (models/parts/spec.py), and the
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
from ..models.parts.spec import _unpermute
from .layout import Projection, adapter_holders

# PEFT's names: `<module>.lora_A.weight` of a linear projection, `<module>.lora_embedding_A` of an embedding
_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?:embedding_)?(?P<part>[AB])(?:\.[\w-]+)?"
                  r"(?:\.weight)?$")


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
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # ValueError: not JSON, or not UTF-8 text (UnicodeDecodeError)
        raise AdapterError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(config, dict):
        raise AdapterError(f"{path}: not a JSON object")
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
    from safetensors.flax import load_file  # (jax arrays: bfloat16 files too, which numpy cannot hold)

    try:
        return {name: np.asarray(value, np.float32) for name, value in load_file(str(path)).items()}
    except Exception as exc:  # noqa: BLE001: safetensors raises its own error types on a corrupt file
        raise AdapterError(f"{path}: not a readable safetensors file ({exc})") from None


def load_peft(name: str, path: str | Path, model, max_rank: int) -> Adapter:
    """Read a PEFT LoRA adapter for `model` (its layout: lora/layout.py). Raises AdapterError naming the
    problem: files missing or corrupt, a module the model has no adaptable projection for, shapes that
    do not fit, a rank above `max_rank`."""
    folder = Path(path)
    if str(path).endswith(".gguf"):
        return load_gguf_lora(name, path, model, max_rank)
    if not folder.is_dir():
        raise AdapterError(f"{path}: not a directory (a PEFT LoRA adapter directory or a llama.cpp LoRA .gguf "
                           "file is expected)")
    config = _read_config(folder)
    tensors = _read_tensors(folder)
    pairs: dict[str, dict[str, np.ndarray]] = {}
    for key, value in tensors.items():
        if key.endswith(".base_layer.weight"):  # PEFT's copy of a base embedding or head it adapts: the model's own
            _check_base_copy(folder, key, value, model)
            continue
        match = _KEY.match(key)
        if match is None:
            raise AdapterError(f"{folder}: tensor {key!r} is not a LoRA A/B matrix of a linear projection or "
                               "an embedding")
        pairs.setdefault(match["module"], {})[match["part"]] = np.asarray(value, np.float32)

    def scale(module: str, r: int) -> float:
        alpha = _pattern_value(config.get("alpha_pattern"), module, config.get("lora_alpha", r))
        r_config = _pattern_value(config.get("rank_pattern"), module, config.get("r", r))
        if r_config != r:
            raise AdapterError(f"{folder}: {module} has rank {r} but the config says {r_config}")
        return alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r

    digest = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode())
    return _assemble(name, folder, pairs, scale, model, max_rank, "hf", digest)


def _check_base_copy(folder: Path, key: str, value, model) -> None:
    """PEFT saves the base embedding and head beside their adapters (save_embedding_layers): the model's own
    weights serve them, which holds while the vocabulary is the model's (a resized one is refused)."""
    c = model.config
    if tuple(value.shape) != (c.vocab_size, c.hidden_size):
        raise AdapterError(f"{folder}: {key} is {tuple(value.shape)}, the model's embedding is "
                           f"{(c.vocab_size, c.hidden_size)}: adapters that resize the vocabulary are not supported")


def load_gguf_lora(name: str, path: str | Path, model, max_rank: int) -> Adapter:
    """Read a llama.cpp LoRA adapter (convert_lora_to_gguf.py's .gguf: `blk.N.attn_q.weight.lora_a` (r, in) and
    `.lora_b` (out, r) per projection, rows as the converter laid out the base tensor, scaled alpha / r)."""
    from ..loading.gguf import dequantize
    from ..loading.gguf_file import GGUFFile

    try:
        reader = GGUFFile(path)
    except (OSError, ValueError) as exc:
        raise AdapterError(f"{path}: not a readable GGUF file ({exc})") from None
    if reader.fields.get("general.type") != "adapter" or reader.fields.get("adapter.type") != "lora":
        raise AdapterError(f"{path}: not a LoRA adapter GGUF (general.type {reader.fields.get('general.type')!r}, "
                           f"adapter.type {reader.fields.get('adapter.type')!r})")
    arch = reader.fields.get("general.architecture")
    if arch not in type(model).gguf_architectures:
        raise AdapterError(f"adapter {name!r} is for {arch!r} models, not {model.config.architecture}")
    alpha = float(reader.fields.get("adapter.lora.alpha") or 0.0)
    pairs: dict[str, dict[str, np.ndarray]] = {}
    for tensor in reader.tensors:
        base, _, part = tensor.name.rpartition(".lora_")
        if part not in ("a", "b"):
            raise AdapterError(f"{path}: tensor {tensor.name!r} is not a LoRA A/B matrix (norms and other tensors "
                               "in adapters are not supported)")
        pairs.setdefault(base, {})[part.upper()] = dequantize(tensor)
    digest = hashlib.sha256(f"gguf lora {alpha}".encode())
    return _assemble(name, Path(path), pairs, lambda module, r: alpha / r if alpha else 1.0, model, max_rank,
                     "gguf", digest)


def _assemble(name: str, source: Path, pairs: dict[str, dict[str, np.ndarray]], scale_of, model, max_rank: int,
              fmt: str, digest) -> Adapter:
    """pairs: the checkpoint's module (HF) or tensor (GGUF) name -> {"A": (r, in), "B": (out, r)} -> the Adapter,
    each pair checked against and laid out as the model's projections (lora/layout.py)."""
    if not pairs:
        raise AdapterError(f"{source}: the adapter holds no LoRA weights")
    targets: dict[str, list[Projection]] = {}
    for _, _, sites in adapter_holders(model):
        for projections in sites.values():
            for p in projections:
                key = p.hf_module if fmt == "hf" else p.gguf_tensor
                if key is not None:
                    targets.setdefault(key, []).append(p)
    weights, rank = {}, 0
    for module, parts in sorted(pairs.items()):
        if set(parts) != {"A", "B"}:
            raise AdapterError(f"{source}: {module} has lora_{'A' if 'A' not in parts else 'B'} missing")
        projections = targets.get(module)
        if projections is None:
            raise AdapterError(f"adapter {name!r} adapts {module}, which this model ({model.config.architecture}) "
                               "does not serve adapters on (supported: the attention and dense MLP projections, "
                               "and in PEFT's form the embedding and output head)")
        a, b = parts["A"], parts["B"]  # (r, in), (out, r)
        r = a.shape[0]
        if a.ndim != 2 or b.ndim != 2 or b.shape[1] != r:
            raise AdapterError(f"{source}: {module}'s A {a.shape} and B {b.shape} are not a rank-r pair")
        if r > max_rank:
            raise AdapterError(f"adapter {name!r} has rank {r} on {module}, above the server's --max-lora-rank "
                               f"{max_rank}")
        rank = max(rank, r)
        scale = scale_of(module, r)
        for p in projections:
            recipe = p.hf if fmt == "hf" else p.gguf
            if a.shape[1] != p.fan_in:
                raise AdapterError(f"adapter {name!r}: {module}'s A takes {a.shape[1]} inputs, the model's "
                                   f"projection takes {p.fan_in} (an adapter for another base model?)")
            rows = b if recipe.rows is None else b[recipe.rows[0]:recipe.rows[1]]
            if rows.shape[0] != p.fan_out:
                raise AdapterError(f"adapter {name!r}: {module}'s B gives {b.shape[0]} outputs, the model's "
                                   f"projection gives {p.fan_out} (an adapter for another base model?)")
            if recipe.permuted_heads:  # the checkpoint's rotary rows interleaved: the model's order
                rows = _unpermute(rows, 0, recipe.permuted_heads, recipe.permute_span)
            weights[(p.layer, p.site, p.name)] = (np.ascontiguousarray(a.T), np.ascontiguousarray(rows.T * scale))
        digest.update(module.encode())
        digest.update(np.ascontiguousarray(a).tobytes())
        digest.update(np.ascontiguousarray(b).tobytes())
    return Adapter(name, str(source), rank, int.from_bytes(digest.digest()[:8], "little") >> 1, weights)


def check_servable(model) -> None:
    """Raise when the model's family does not route its projections through the adapter sites."""
    if not getattr(type(model), "supports_lora", False):
        raise UnsupportedModelError(f"LoRA adapters are not served on {model.config.architecture} models yet")
