"""Qwen3-VL-MoE (Qwen3-VL-30B-A3B, 235B-A22B): Qwen3-VL's tower, merger, deepstack and interleaved M-RoPE
(qwen3_vl.py) before a Qwen3-MoE text model (routed experts, top-k renormalized, no shared expert).

HF: Qwen3VLMoeForConditionalGeneration (model_type "qwen3_vl_moe"): each layer's experts fused, gate/up in
one tensor (gate half first). The hub's checkpoints store them (in, out): gate_up_proj (E, D, 2F), down_proj
(E, F, D); transformers 5 holds and saves them (out, in): (E, 2F, D), (E, D, F). HubExperts presents the
second layout as the first (gate_up_proj's middle axis is twice down_proj's last only in the second).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from .qwen2_moe import Qwen2MoeConfig
from .qwen3_moe import Qwen3Moe
from .qwen3_vl import Qwen3VisionTower, Qwen3VLConfig
from ..parts.spec import Columns, GateUp, tensor

EXPERTS = (".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")


@dataclass(frozen=True)
class Qwen3VLMoeConfig(Qwen3VLConfig, Qwen2MoeConfig):
    pass  # (no shared expert: shared_intermediate_size stays 0)


class Qwen3VLMoe(Qwen3VisionTower, Qwen3Moe):
    name = "qwen3_vl_moe"
    hf_architectures = ("Qwen3VLMoeForConditionalGeneration",)
    gguf_architectures = ()  # (a text GGUF alone is a Qwen3-MoE's; with its mmproj: config_from_mmproj)
    mmproj_text_architecture = "qwen3vlmoe"
    config_class = Qwen3VLMoeConfig

    @classmethod
    def hf_source(cls, source):
        return HubExperts(source)

    @classmethod
    def layer_weights(cls, c: Qwen3VLMoeConfig, i: int):
        out = super().layer_weights(c, i)  # (Qwen-MoE's per-expert HF names: replaced by the fused stacks)
        if c.is_moe(i):
            e, d, f, pre = c.num_experts, c.hidden_size, c.moe_intermediate_size, f"model.layers.{i}"
            gate_up = (f"{pre}{EXPERTS[0]}", (e, d, 2 * f))
            out["experts_gate_up"] = dataclasses.replace(
                out["experts_gate_up"], hf=GateUp(Columns(*gate_up, (0, f)), Columns(*gate_up, (f, 2 * f))))
            out["experts_down"] = dataclasses.replace(
                out["experts_down"], hf=tensor(f"{pre}{EXPERTS[1]}", (e, f, d), matrix=False))
        return out


class HubExperts:
    """A Qwen3-VL-MoE checkpoint's tensors with its expert stacks in the hub's (in, out) layout, whichever
    layout they are stored in."""

    def __init__(self, source):
        self.source = source
        self._flipped = set()
        for name in source.names():
            if name.endswith(EXPERTS[1]):
                gate_up = name[:-len(EXPERTS[1])] + EXPERTS[0]
                if source.shape(gate_up)[1] == 2 * source.shape(name)[2]:  # (E, 2F, D), (E, D, F): transformers 5's
                    self._flipped |= {name, gate_up}

    def names(self) -> set[str]:
        return self.source.names()

    def where(self, name: str) -> str:
        return self.source.where(name)

    def shape(self, name: str) -> tuple[int, ...]:
        shape = tuple(self.source.shape(name))
        return (*shape[:-2], shape[-1], shape[-2]) if name in self._flipped else shape

    def read(self, name: str, index=()) -> np.ndarray:
        if name not in self._flipped:
            return self.source.read(name, index)
        index = list(index) + [None] * (3 - len(index))
        stored = self.source.read(name, index[:1])  # (e, out, in): the experts asked for
        out = np.swapaxes(stored, -1, -2)
        return out[(slice(None), *(slice(*r) if r is not None else slice(None) for r in index[1:]))]

    def release(self) -> None:
        self.source.release()
