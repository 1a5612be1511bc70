"""Mixture-of-experts layers shared by the MoE families: config fields, weight declarations
(HF per-expert tensors or fused 3-D ones, llama.cpp's stacked *_exps tensors) and the forward
pass (ops/moe.py routes and runs only the routed experts).

Weights of an MoE layer (E experts of F units, D hidden):
    router (D, E) [+ router_bias (E,)]        experts_gate_up (E, D, 2F) gate/up interleaved
    experts_down (E, F, D)                    [+ experts_gate_up_bias (E, 2F), experts_down_bias (E, D)]
    shared_gate_up (D, 2Fs), shared_down (Fs, D) [+ shared_gate (D, 1)]   (shared experts)
Tensor parallelism splits every expert's F units over `model`; expert parallelism
(`expert_parallel`) splits whole experts instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax

from ...config import ModelConfig
from ...ops.linear import linear
from ...ops.moe import Routing, experts, route
from .spec import GateUp, MXFP4, Stack, Weight, tensor


@dataclass(frozen=True)
class MoEConfig(ModelConfig):
    num_experts: int = 0
    num_experts_per_tok: int = 1
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    shared_intermediate_size: int = 0  # 0: no shared expert
    moe_layers: tuple[bool, ...] = ()  # per layer: routed experts (True) or a dense MLP
    expert_parallel: bool = False
    activation: str = "silu"

    def is_moe(self, layer: int) -> bool:
        return self.moe_layers[layer] if self.moe_layers else True

    @property
    def routing(self) -> Routing:
        return Routing(self.num_experts, self.num_experts_per_tok, norm_topk_prob=self.norm_topk_prob)

    def split_sizes(self) -> dict[str, int]:
        sizes = {"expert count (expert parallelism)": self.num_experts} if self.expert_parallel else {
            "experts' intermediate size (or use expert parallelism)": self.moe_intermediate_size}
        if not all(self.is_moe(i) for i in range(self.num_layers)):
            sizes["intermediate size"] = self.intermediate_size
        if self.shared_intermediate_size:
            sizes["shared expert's intermediate size"] = self.shared_intermediate_size
        return sizes


def expert_axes(c: MoEConfig, kind: str) -> tuple:
    """Logical axes of a stacked expert weight: whole experts over `model` with expert
    parallelism, else each expert's units."""
    if kind == "gate_up":
        return ("experts", "embed", None) if c.expert_parallel else (None, "embed", "mlp")
    if kind == "down":
        return ("experts", None, "embed") if c.expert_parallel else (None, "mlp", "embed")
    if kind == "gate_up_bias":
        return ("experts", None) if c.expert_parallel else (None, "mlp")
    return ("experts", None) if c.expert_parallel else (None, None)  # down bias


def router_weights(c: MoEConfig, hf: str, gguf: str | None, *, bias: bool = False) -> dict[str, Weight]:
    d, e = c.hidden_size, c.num_experts
    out = {"router": Weight((d, e), ("embed", None), tensor(f"{hf}.weight", (e, d)),
                            gguf and tensor(f"{gguf}.weight", (e, d)))}
    if bias:
        out["router_bias"] = Weight((e,), (None,), tensor(f"{hf}.bias", (e,)), gguf and tensor(f"{gguf}.bias", (e,)),
                                    init="zeros")
    return out


def expert_weights(c: MoEConfig, *, hf_expert=None, hf_fused: tuple[str, str] | None = None, mxfp4: bool = False,
                   gguf: str | None = None, biases: bool = False) -> dict[str, Weight]:
    """The routed experts. hf_expert(e, kind) -> the HF name of expert e's "gate" / "up" / "down"
    matrix (per-expert checkpoints); hf_fused: the names of fused (E, D, 2F) gate/up (interleaved)
    and (E, F, D) down tensors (GPT-OSS), MXFP4 when `mxfp4`; gguf: the layer's GGUF prefix
    ("blk.3"), whose ffn_{gate,up,down}_exps hold every expert."""
    d, f, e = c.hidden_size, c.moe_intermediate_size, c.num_experts
    if hf_fused is not None:
        gate_up_name, down_name = hf_fused
        if mxfp4:
            hf_gate_up = MXFP4(f"{gate_up_name}_blocks", f"{gate_up_name}_scales", e, 2 * f, d)
            hf_down = MXFP4(f"{down_name}_blocks", f"{down_name}_scales", e, d, f)
        else:
            hf_gate_up = tensor(gate_up_name, (e, d, 2 * f), matrix=False)
            hf_down = tensor(down_name, (e, f, d), matrix=False)
    else:
        hf_gate_up = Stack(tuple(GateUp(tensor(hf_expert(x, "gate"), (f, d)), tensor(hf_expert(x, "up"), (f, d)))
                                 for x in range(e)))
        hf_down = Stack(tuple(tensor(hf_expert(x, "down"), (d, f)) for x in range(e)))
    gg = None if gguf is None else (GateUp(tensor(f"{gguf}.ffn_gate_exps.weight", (e, f, d)),
                                           tensor(f"{gguf}.ffn_up_exps.weight", (e, f, d))),
                                    tensor(f"{gguf}.ffn_down_exps.weight", (e, d, f)))
    out = {
        "experts_gate_up": Weight((e, d, 2 * f), expert_axes(c, "gate_up"), hf_gate_up, gg and gg[0], indexed=True),
        "experts_down": Weight((e, f, d), expert_axes(c, "down"), hf_down, gg and gg[1], indexed=True),
    }
    if biases:
        gate_up_name, down_name = hf_fused
        out["experts_gate_up_bias"] = Weight(
            (e, 2 * f), expert_axes(c, "gate_up_bias"), tensor(f"{gate_up_name}_bias", (e, 2 * f), matrix=False),
            gguf and GateUp(tensor(f"{gguf}.ffn_gate_exps.bias", (e, f), matrix=False),
                            tensor(f"{gguf}.ffn_up_exps.bias", (e, f), matrix=False)),
            init="zeros")
        out["experts_down_bias"] = Weight((e, d), expert_axes(c, "down_bias"),
                                          tensor(f"{down_name}_bias", (e, d), matrix=False),
                                          gguf and tensor(f"{gguf}.ffn_down_exps.bias", (e, d), matrix=False),
                                          init="zeros")
    return out


def qwen_moe_weights(c: MoEConfig, hf: str, gguf: str, shared_gate: bool) -> dict[str, Weight]:
    """A Qwen-style sparse MLP's weights (Qwen2-MoE, Qwen3-Next): the router, the experts, and the shared expert
    with, where `shared_gate`, its sigmoid gate."""
    from .blocks import mlp_weights

    d = c.hidden_size
    out = {**router_weights(c, f"{hf}.mlp.gate", f"{gguf}.ffn_gate_inp"),
           **expert_weights(c, hf_expert=lambda e, kind: f"{hf}.mlp.experts.{e}.{kind}_proj.weight", gguf=gguf)}
    if c.shared_intermediate_size:
        shared = mlp_weights(d, c.shared_intermediate_size, hf=f"{hf}.mlp.shared_expert", gguf=gguf,
                             gguf_suffix="_shexp")
        out.update({"shared_gate_up": shared["w_gate_up"], "shared_down": shared["w_down"]})
        if shared_gate:
            out["shared_gate"] = Weight((d, 1), ("embed", None), tensor(f"{hf}.mlp.shared_expert_gate.weight", (1, d)),
                                        tensor(f"{gguf}.ffn_gate_inp_shexp.weight", (1, d)))
    return out


def routed(model, x, w: dict, routing: Routing | None = None, correction=None):
    """The routed experts of x (B, T, D) -> (B, T, D) (`model`: its config and weights' dtype)."""
    c = model.config
    flat = x.reshape(-1, x.shape[-1])
    logits = linear(flat, w["router"]).astype("float32")  # (N, E)
    if "router_bias" in w:
        logits = logits + w["router_bias"].astype(logits.dtype)
    with jax.named_scope("moe"):
        routing = routing or c.routing
        ids, weights = route(logits, routing, correction)
        out = experts(flat, ids, weights, w["experts_gate_up"], w["experts_down"], w.get("experts_gate_up_bias"),
                      w.get("experts_down_bias"), activation=c.activation, expert_parallel=c.expert_parallel,
                      weight_dtype=model.stack_dtype, scale_inputs=routing.scale_inputs)
    return out.reshape(x.shape)


def routed_and_shared(model, x, w: dict):
    """Routed experts plus the shared expert (`shared_gate_up` / `shared_down`) when the layer has one,
    scaled by sigmoid(x @ shared_gate) when it has that gate (Qwen2-MoE, Qwen3-Next)."""
    from .blocks import mlp

    out = routed(model, x, w)
    if "shared_gate_up" in w:
        shared = mlp(x, w, prefix="shared")
        if "shared_gate" in w:
            shared = jax.nn.sigmoid(linear(x, w["shared_gate"])) * shared
        out = out + shared
    return out
