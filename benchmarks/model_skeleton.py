"""A Hugging Face checkpoint carried to a borrowed accelerator machine as its skeleton: every file but the
weights, and the weights' names, dtypes and shapes; there, random weights of those shapes fill it again.

The device tool carries 64 MiB a call and the TPU machine has no PyTorch, so transformers cannot write a
random checkpoint there (benchmarks/images.py's SmolVLM-256M shape is 0.5 GB). The filled weights are
normal(0, 0.02) (norm scales 1): the timings hold (same programs, same shapes), the text is meaningless.

    python benchmarks/model_skeleton.py describe CHECKPOINT_DIR SKELETON_DIR   # here
    python benchmarks/model_skeleton.py fill SKELETON_DIR CHECKPOINT_DIR       # there
"""

from __future__ import annotations

import json
import shutil
import struct
import sys
from pathlib import Path

import numpy as np

TENSORS = "skeleton.json"  # {file: {tensor: [dtype, shape]}}


def header(path: Path) -> dict:
    """A safetensors file's header: {tensor: {dtype, shape, data_offsets}} (and "__metadata__")."""
    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(size))


def describe(checkpoint: Path, skeleton: Path) -> None:
    skeleton.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for path in sorted(checkpoint.iterdir()):
        if path.suffix == ".safetensors":
            tensors[path.name] = {name: [spec["dtype"], spec["shape"]]
                                  for name, spec in header(path).items() if name != "__metadata__"}
        elif path.is_file():
            shutil.copy2(path, skeleton / path.name)
    (skeleton / TENSORS).write_text(json.dumps(tensors))
    count = sum(len(t) for t in tensors.values())
    print(f"{checkpoint} -> {skeleton}: {count} tensors described, "
          f"{sum(p.stat().st_size for p in skeleton.iterdir()) / 2**20:.1f} MiB in all")


def random_bytes(dtype: str, shape: list[int], rng: np.random.Generator, norm: bool) -> bytes:
    n = int(np.prod(shape))
    values = np.ones(n, np.float32) if norm else rng.normal(0.0, 0.02, n).astype(np.float32)
    if dtype == "BF16":  # float32's upper halves (numpy has no bfloat16)
        return (values.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    if dtype in ("F16", "F32"):
        return values.astype(np.float16 if dtype == "F16" else np.float32).tobytes()
    raise SystemExit(f"a {dtype} tensor: only float weights are filled")


def fill(skeleton: Path, checkpoint: Path) -> None:
    checkpoint.mkdir(parents=True, exist_ok=True)
    tensors = json.loads((skeleton / TENSORS).read_text())
    for path in skeleton.iterdir():
        if path.name != TENSORS:
            shutil.copy2(path, checkpoint / path.name)
    rng = np.random.default_rng(0)
    for file, specs in tensors.items():
        blobs, table, offset = [], {}, 0
        for name, (dtype, shape) in specs.items():
            blob = random_bytes(dtype, shape, rng, norm="norm" in name and len(shape) == 1)
            table[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(blob)]}
            blobs.append(blob)
            offset += len(blob)
        head = json.dumps(table).encode()
        head += b" " * (-len(head) % 8)
        with (checkpoint / file).open("wb") as f:
            f.write(struct.pack("<Q", len(head)) + head)
            for blob in blobs:
                f.write(blob)
    print(f"{skeleton} -> {checkpoint}: random weights (WEIGHTS: NOT THE REAL ONES), "
          f"{sum(len(s) for s in tensors.values())} tensors")


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in ("describe", "fill"):
        print(__doc__)
        return 2
    (describe if argv[0] == "describe" else fill)(Path(argv[1]), Path(argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
