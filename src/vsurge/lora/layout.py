"""Where a model takes LoRA adapters: per layer, its adapter sites (projections that share an input)
and, for each projection of a site, the checkpoint tensor it adapts (HF and GGUF names, the rows of a
fused tensor, a rotary row permutation), read from the family's own weight declarations
(models/parts/spec.py), so a family needs nothing of its own.

    site      weight       projections (ops/lora.py computes them together)
    qkv       wqkv         q, k, v        (input: the normed hidden state)
    o         wo           o              (input: the attention output)
    gate_up   w_gate_up    gate, up       (input: the normed hidden state)
    down      w_down       down           (input: the gated activation)

and, on the model itself (layer -1), PEFT's embedding and output-head adapters:

    embed     embed        embed          (input: the token, as a one-hot row of the vocabulary)
    head      lm_head      head           (input: the final hidden state)
"""

from __future__ import annotations

import dataclasses

from ..models.parts.spec import FusedQKV, GateUp, Tensor

SITES: dict[str, tuple[str, tuple[str, ...]]] = {
    "qkv": ("wqkv", ("q", "k", "v")),
    "o": ("wo", ("o",)),
    "gate_up": ("w_gate_up", ("gate", "up")),
    "down": ("w_down", ("down",)),
}
MODEL_SITES: dict[str, tuple[str, tuple[str, ...]]] = {"embed": ("embed", ("embed",)), "head": ("lm_head", ("head",))}


@dataclasses.dataclass(frozen=True)
class Projection:
    """One adaptable projection of one layer: its input and output widths and the stored tensors it is
    made from (None where the format has no name for it)."""

    layer: int
    site: str
    name: str  # q, k, v, o, gate, up, down
    fan_in: int
    fan_out: int
    hf: Tensor | None
    gguf: Tensor | None

    @property
    def hf_module(self) -> str | None:
        """The HF module an adapter names ("model.layers.3.self_attn.q_proj")."""
        return None if self.hf is None else self.hf.name.removesuffix(".weight")

    @property
    def gguf_tensor(self) -> str | None:
        """The GGUF tensor a llama.cpp LoRA names ("blk.3.attn_q.weight")."""
        return None if self.gguf is None else self.gguf.name


def _parts(recipe, names: tuple[str, ...]) -> tuple:
    if recipe is None:
        return (None,) * len(names)
    if isinstance(recipe, FusedQKV):
        return recipe.q, recipe.k, recipe.v
    if isinstance(recipe, GateUp):
        return recipe.gate, recipe.up
    return (recipe,) if isinstance(recipe, Tensor) else (None,) * len(names)


def layer_projections(model_cls, config, i: int) -> dict[str, list[Projection]]:
    """site -> its projections in layer i (sites the layer lacks, e.g. a mixture of experts' MLP, absent)."""
    specs = model_cls.layer_weights(config, i)
    out: dict[str, list[Projection]] = {}
    for site, (weight, names) in SITES.items():
        spec = specs.get(weight)
        if spec is None or len(spec.shape) != 2:
            continue
        fan_in, total = spec.shape
        if site == "qkv":
            widths = (config.q_size, config.kv_size, config.kv_size)
            if sum(widths) != total:
                continue  # a layer whose heads differ from the config's (not through project_qkv)
        elif site == "gate_up":
            widths = (total // 2, total // 2)
        else:
            widths = (total,)
        hf, gguf = _parts(spec.hf, names), _parts(spec.gguf, names)
        out[site] = [Projection(i, site, name, fan_in, width, h, g)
                     for name, width, h, g in zip(names, widths, hf, gguf)]
    return out


def model_projections(model) -> list[dict[str, list[Projection]]]:
    """Per layer, its sites' projections."""
    return [layer_projections(type(model), model.config, i) for i in range(model.config.num_layers)]


def global_projections(model) -> dict[str, list[Projection]]:
    """The embedding's and output head's adapter sites (layer -1). HF names only: the head is `lm_head` in
    PEFT's names even where the checkpoint ties it to the embedding."""
    c, specs = model.config, type(model).global_weights(model.config)
    embed = specs["embed"].hf
    head = specs["lm_head"].hf if "lm_head" in specs else Tensor("lm_head.weight", (c.vocab_size, c.hidden_size))
    return {"embed": [Projection(-1, "embed", "embed", c.vocab_size, c.hidden_size, embed, None)],
            "head": [Projection(-1, "head", "head", c.hidden_size, c.vocab_size, head, None)]}


def adapter_holders(model) -> list[tuple[object, str, dict[str, list[Projection]]]]:
    """(the object holding a group of stacks, the prefix of its weights' names, its sites' projections): each
    layer, then the model (embedding and head)."""
    layers = [(layer, f"layers.{i}.", sites) for i, (layer, sites) in enumerate(zip(model.layers,
                                                                                     model_projections(model)))]
    return layers + [(model, "", global_projections(model))]


def site_weight(site: str) -> str:
    """The model weight an adapter site rides on (its sharding is the stacks')."""
    return (SITES.get(site) or MODEL_SITES[site])[0]
