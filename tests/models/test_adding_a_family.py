"""A new family is its own file: nothing else names a family's weights, and no list names the family.

The toy family below (a Llama variant with its own checkpoint names and a learned output scale)
is written the way docs/adding_a_model.md says and dropped as one file where the registry looks for
families (models/families/: here a folder on that package's search path, so the test writes nothing into
the source tree); the registry finds it, and it loads through the real loaders from a checkpoint in its
own layout, then shards; the loaders, the sharding rules and quantization never hear of it. And a scan of
those modules' source finds no weight or tensor name that any registered family declares.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import vsurge
from vsurge.models import registry

TOY_FILE = '''
"""ToyLM: Llama's layers under other checkpoint names, and a learned scalar on the logits."""
from vsurge.models.parts.base import CausalLM
from vsurge.models.parts.blocks import attention_weights, mlp_weights, norm, pre_norm_layer
from vsurge.models.parts.config_io import hf_fields
from vsurge.models.parts.spec import Weight, tensor
from vsurge.config import ModelConfig


class Toy(CausalLM):
    name = "toy"
    hf_model_types = ("toy",)

    @classmethod
    def config_from_hf(cls, cfg, where):
        return ModelConfig(**hf_fields(cfg, where, cls.name))

    @classmethod
    def global_weights(cls, c):
        v, d = c.vocab_size, c.hidden_size
        return {"embed": Weight((v, d), ("vocab", "embed"), tensor("tok.weight", (v, d), matrix=False)),
                "final_norm": norm(d, "out_norm.weight", None),
                "lm_head": Weight((d, v), ("embed", "vocab"), tensor("head.weight", (v, d)), quantize=True),
                "logit_scale": Weight((1,), (None,), tensor("head.scale", (1,)), init="ones")}

    @classmethod
    def layer_weights(cls, c, i):
        p, d = f"h.{i}", c.hidden_size
        return {"attn_norm": norm(d, f"{p}.ln1.weight", None), **attention_weights(c, hf=f"{p}.attn", gguf=None),
                "mlp_norm": norm(d, f"{p}.ln2.weight", None), **mlp_weights(d, c.intermediate_size, hf=f"{p}.ffn", gguf=None)}

    def layer(self, i, x, w, cache, ctx):
        return pre_norm_layer(self.config, i, x, w, cache, ctx)

    def scale_logits(self, logits):
        return logits * self.logit_scale[...][0]
'''

TOY_NAMES = {"model.embed_tokens.weight": "tok.weight", "model.norm.weight": "out_norm.weight",
             "lm_head.weight": "head.weight", "input_layernorm": "ln1", "post_attention_layernorm": "ln2",
             "self_attn": "attn", "mlp": "ffn"}


def toy_checkpoint(llama_dir: Path, out: Path, scale: float) -> None:
    """The tiny Llama checkpoint renamed into ToyLM's layout, with a logit scale."""
    state = load_file(llama_dir / "model.safetensors")
    renamed = {}
    for name, value in state.items():
        new = TOY_NAMES.get(name, name)
        if new.startswith("model.layers."):
            new = "h." + new[len("model.layers."):]
            for old, short in TOY_NAMES.items():
                new = new.replace(f".{old}.", f".{short}.")
        renamed[new] = value
    renamed["head.scale"] = np.asarray([scale], np.float32)
    out.mkdir()
    save_file(renamed, out / "model.safetensors")
    cfg = json.loads((llama_dir / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg, "model_type": "toy", "architectures": ["ToyForCausalLM"]}))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (out / f).write_bytes((llama_dir / f).read_bytes())


def dropped_in(tmp_path, monkeypatch, name: str, source: str):
    """`source` as models/families/<name>.py: a folder the families package searches (pkgutil and the import
    system look there as in the package's own folder). Undo with forget(name)."""
    folder = tmp_path / f"more_families_{name}"
    folder.mkdir()
    (folder / f"{name}.py").write_text(source)
    monkeypatch.setattr(registry.family_modules, "__path__", [*registry.family_modules.__path__, str(folder)])
    registry.families.cache_clear()


def forget(name: str) -> None:
    sys.modules.pop(f"vsurge.models.families.{name}", None)
    vars(registry.family_modules).pop(name, None)
    registry.families.cache_clear()


@pytest.fixture
def toy_registered(tmp_path, monkeypatch):
    """toy.py, the family's one file, where families are found; -> the class the registry found."""
    before = registry.families()
    assert "toy" not in registry.hf_model_types()
    dropped_in(tmp_path, monkeypatch, "toy", TOY_FILE)
    try:
        found = [family for family in registry.families() if family not in before]
        assert [family.__module__ for family in found] == ["vsurge.models.families.toy"]
        yield found[0]
    finally:
        forget("toy")


def test_a_model_type_two_families_claim_is_an_error(tmp_path, monkeypatch):
    """A new file cannot shadow a family: the registry names both claimants instead of picking one."""
    dropped_in(tmp_path, monkeypatch, "toy_llama", TOY_FILE.replace('("toy",)', '("llama",)'))
    try:
        with pytest.raises(TypeError, match=r"'llama' is declared by both .*families\.llama\.Llama and "
                                            r".*families\.toy_llama\.Toy"):
            registry.families()
    finally:
        forget("toy_llama")


def test_a_new_family_is_one_file(toy_registered, tiny_checkpoints, tmp_path):
    llama_dir, _ = tiny_checkpoints["llama"]
    toy_checkpoint(llama_dir, tmp_path / "toy", scale=0.5)
    toy, _ = vsurge.load(tmp_path / "toy", dtype=jnp.float32, progress=False)
    llama, _ = vsurge.load(llama_dir, dtype=jnp.float32, progress=False)
    assert type(toy) is toy_registered
    ids = jnp.asarray([np.random.default_rng(0).integers(0, 49152, 12)], jnp.int32)
    np.testing.assert_allclose(np.asarray(toy(ids)[0]), 0.5 * np.asarray(llama(ids)[0]), rtol=1e-5, atol=1e-6)
    assert toy.quantize("int8").quantization == "int8"  # quantization reads the declarations too
    from vsurge.hardware.sharding import make_mesh, place_model

    placed = place_model(toy, make_mesh(1))
    assert set(placed.weight_axes()) == set(toy.named_weights())


def declared_names() -> set[str]:
    """Every weight name and checkpoint tensor name that any registered family declares for its
    tiny test checkpoint (layer numbers stripped)."""
    import transformers

    from tiny_models import TINY_CONFIGS
    from vsurge.models.registry import family_for_hf

    names = set()
    for cls_name, extra in TINY_CONFIGS.values():
        from tiny_models import COMMON

        cfg = getattr(transformers, cls_name)(**{**COMMON, **extra}).to_dict()
        family = family_for_hf(cfg)
        config = family.config_from_hf(cfg, "config.json")
        for key, spec in family.weight_specs(config).items():
            names.add(key.split(".")[-1])
            for recipe in (spec.hf, spec.gguf):
                for tensor_name, _ in (recipe.tensors() if recipe is not None else ()):
                    names.update(p for p in re.split(r"\.\d+\.|\.", tensor_name) if not p.isdigit())
    return {n for n in names if len(n) > 3 and n not in ("weight", "bias", "model", "layers")}


def test_loaders_sharding_and_quantization_name_no_family_weight():
    package = Path(vsurge.__file__).parent
    sources = [*sorted((package / "loading").glob("*.py")), package / "hardware" / "sharding.py",
               package / "ops" / "linear.py", package / "kv" / "dense.py", package / "kv" / "paged.py",
               package / "engine" / "programs.py"]
    names = declared_names()
    assert {"wqkv", "w_gate_up", "q_proj", "experts_gate_up", "attn_k_b"} <= names  # the scan sees them
    for path in sources:
        literals = set(re.findall(r"""["']([A-Za-z_][\\w.]*)["']""", path.read_text()))
        words = {w for lit in literals for w in lit.split(".")}
        assert not (words & names), f"{path.name} names family weights: {sorted(words & names)}"
