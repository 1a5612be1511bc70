"""Mixture of experts: routing, then a dropless grouped matmul over only the routed experts.

Routing (`route`) turns router logits into top-k expert ids and weights the way
each family does it (`Routing`). Dispatch (`experts`) sorts the N*k
(token, expert) assignments by expert and runs each expert's gated MLP on its
own rows only:

- "loop" (CPU, GPU): a loop over the experts that received rows; each expert
  multiplies its rows in blocks of `block` rows, reading its weights once per
  block. No expert without rows is touched, no all-experts product is formed.
- "cpp" (CPU, a few rows: decode): kernels/moe_experts.cc reads each used expert's weights where
  they lie in the stack, for all of its rows (XLA's loop copied each expert's slice first).
- "ragged" (TPU): `jax.lax.ragged_dot` over the sorted rows (a grouped matmul
  kernel there; on CPU XLA lowers it to a dense product of every expert, so it
  is never the CPU path).

Both are exact for every routing (dropless). Under a mesh the expert weights
are split over the `model` axis either by their hidden units (tensor parallel)
or by whole experts (expert parallel); `experts` then runs in a shard_map, each
device on its own slice, and one psum combines the devices.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from .. import kernels
from .mlp import gated

MODEL_AXIS = "model"


@dataclasses.dataclass(frozen=True)
class Routing:
    """How a family picks its experts (static).

    scoring: "softmax" (probabilities over all experts, then top-k), "sigmoid" (DeepSeek-V3:
        independent sigmoids, chosen with a correction bias), or "topk_softmax" (GPT-OSS: top-k
        of the logits, softmax over those k).
    norm_topk_prob: renormalize the k weights to sum to 1.
    groups / topk_groups: group-limited routing (DeepSeek): experts in `groups` equal groups,
        only the best `topk_groups` groups are eligible; a group's score is its best expert's
        ("max") or the sum of its best two ("top2").
    scale: multiplies the final weights (DeepSeek's routed_scaling_factor).
    scale_inputs: each chosen expert multiplies its weight into its input rows rather than its
        output (Llama 4: silu(w x) differs from w silu(x)); `experts` takes it as its own flag."""

    num_experts: int
    top_k: int
    scoring: str = "softmax"
    norm_topk_prob: bool = False
    groups: int = 1
    topk_groups: int = 1
    group_score: str = "max"
    scale: float = 1.0
    scale_inputs: bool = False


def route(logits: jax.Array, r: Routing, correction_bias: jax.Array | None = None):
    """logits (N, E) f32 -> ids (N, k) i32, weights (N, k) f32."""
    logits = logits.astype(jnp.float32)
    if r.scoring == "topk_softmax":
        top, ids = jax.lax.top_k(logits, r.top_k)
        return ids.astype(jnp.int32), jax.nn.softmax(top, axis=-1) * r.scale
    scores = jax.nn.sigmoid(logits) if r.scoring == "sigmoid" else jax.nn.softmax(logits, axis=-1)
    choice = scores if correction_bias is None else scores + correction_bias.astype(jnp.float32)
    if r.groups > 1:
        n, e = choice.shape
        grouped = choice.reshape(n, r.groups, e // r.groups)
        if r.group_score == "top2":
            group_scores = jnp.sum(jax.lax.top_k(grouped, 2)[0], axis=-1)
        else:
            group_scores = jnp.max(grouped, axis=-1)
        _, best = jax.lax.top_k(group_scores, r.topk_groups)  # (N, topk_groups)
        keep = jnp.zeros((n, r.groups), bool).at[jnp.arange(n)[:, None], best].set(True)
        keep = jnp.repeat(keep, e // r.groups, axis=1)
        # softmax scores are >= 0, so 0 drops a softmax expert; sigmoid choices use -inf
        choice = jnp.where(keep, choice, -jnp.inf if r.scoring == "sigmoid" else 0.0)
    _, ids = jax.lax.top_k(choice, r.top_k)
    weights = jnp.take_along_axis(scores, ids, axis=-1)
    if r.norm_topk_prob:
        weights = weights / (jnp.sum(weights, axis=-1, keepdims=True) + (1e-20 if r.scoring == "sigmoid" else 0.0))
    return ids.astype(jnp.int32), weights * r.scale


def block_rows(assignments: int, num_experts: int) -> int:
    """Rows per block of the loop: about the mean rows an expert gets, a power of two in [8, 128]."""
    mean = max(1, -(-assignments // num_experts))
    return min(128, max(8, 1 << (mean - 1).bit_length()))


def experts(x, ids, weights, w_gate_up, w_down, b_gate_up=None, b_down=None, *, activation: str = "silu",
            impl: str | None = None, expert_parallel: bool = False, weight_dtype=None, scale_inputs: bool = False):
    """Routed experts of N tokens. x (N, D); ids, weights (N, k); w_gate_up (E, D, 2F) gate/up
    interleaved; w_down (E, F, D); optional biases (E, 2F), (E, D). Returns (N, D) in x.dtype:
    sum_k weight_k * expert_k(x), or with `scale_inputs` sum_k expert_k(weight_k * x) (Llama 4).
    Expert stacks may come as the raw uint16 bits of `weight_dtype` (models/parts/spec.py `indexed`):
    each expert's slice is bit-cast back after it is taken."""
    auto, impl = impl is None, impl or ("ragged" if jax.default_backend() == "tpu" else "loop")
    bits = partial(_from_bits, dtype=weight_dtype)
    if impl == "cpp" and not _cpp_runs(ids, w_gate_up, w_down, b_gate_up, b_down, activation, weight_dtype):
        raise ValueError(f"impl='cpp' takes SiLU experts without biases, bfloat16 or float32 stacks and at most "
                         f"{CPP_MAX_ASSIGNMENTS} assignments, in a CPU program with vsurge's kernels loaded "
                         f"({kernels.unavailable_reason() or 'they are'})")
    mesh = jax.sharding.get_abstract_mesh()
    tp = 1 if mesh.empty or MODEL_AXIS not in mesh.shape else mesh.shape[MODEL_AXIS]
    e, f = w_down.shape[0], w_down.shape[1]
    split = tp > 1 and ((e % tp == 0) if expert_parallel else (f % tp == 0))
    if not split:
        if auto and impl == "loop" and kernels.unsplit() and \
                _cpp_runs(ids, w_gate_up, w_down, b_gate_up, b_down, activation, weight_dtype):
            impl = "cpp"
        return _local_experts(x, ids, weights, w_gate_up, w_down, b_gate_up, b_down, activation=activation,
                              impl=impl, first_expert=0, add_down_bias=True, bits=bits, scale_inputs=scale_inputs)
    if expert_parallel:  # whole experts per device: every bias travels with its expert
        w_specs = (P(MODEL_AXIS), P(MODEL_AXIS), P(MODEL_AXIS), P(MODEL_AXIS))
    else:  # every expert's hidden units split: the down bias is added once, after the sum
        w_specs = (P(None, None, MODEL_AXIS), P(None, MODEL_AXIS), P(None, MODEL_AXIS, None), P())
    d = w_down.shape[-1]
    bias_gu = b_gate_up if b_gate_up is not None else jnp.zeros((e, w_gate_up.shape[-1]), x.dtype)
    bias_down = b_down if b_down is not None else jnp.zeros((e, d), x.dtype)

    def local(x, ids, weights, w_gate_up, b_gate_up, w_down, b_down):
        first = jax.lax.axis_index(MODEL_AXIS) * w_down.shape[0] if expert_parallel else 0
        out = _local_experts(x, ids, weights, w_gate_up, w_down, b_gate_up, b_down, activation=activation,
                             impl=impl, first_expert=first, add_down_bias=expert_parallel, bits=bits,
                             scale_inputs=scale_inputs)
        return jax.lax.psum(out, MODEL_AXIS)

    out = jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P(), w_specs[0], w_specs[1], w_specs[2], w_specs[3]),
                        out_specs=P(), check_vma=False)(x, ids, weights, w_gate_up, bias_gu, w_down, bias_down)
    if not expert_parallel and b_down is not None:
        out = out + _down_bias(ids, jnp.ones_like(weights) if scale_inputs else weights, b_down).astype(out.dtype)
    return out


# Assignments (tokens x k) up to which the C++ kernel (kernels/moe_experts.cc) runs the experts on CPU:
# decode steps and short prompts, where XLA sliced each used expert out of its stack (a copy) before a
# dot of a few rows. An ad hoc timing (not a project benchmark) of a ~0.5B Qwen3-Next's experts (16 of
# 1024 x 128, bfloat16), 24 layers, both paths in one run: 512 assignments 111 ms against XLA's 130 ms,
# 1024 253 against 202; the kernel is no GEMM, so longer prompts keep XLA's blocked dots.
CPP_MAX_ASSIGNMENTS = 512


def _cpp_runs(ids, w_gate_up, w_down, b_gate_up, b_down, activation, weight_dtype) -> bool:
    """Whether the C++ kernel takes these experts: a CPU program with the kernels loaded, few
    assignments, SiLU-gated experts without biases, bfloat16 (or its raw bits) or float32 stacks."""
    if jax.default_backend() != "cpu" or not kernels.available() or ids.size > CPP_MAX_ASSIGNMENTS:
        return False
    if b_gate_up is not None or b_down is not None or activation not in ("silu", "swish"):
        return False
    kind = lambda w: "bf16" if w.dtype == jnp.bfloat16 or (  # noqa: E731
        w.dtype == jnp.uint16 and weight_dtype is not None and jnp.dtype(weight_dtype) == jnp.bfloat16) else str(w.dtype)
    return kind(w_gate_up) == kind(w_down) and kind(w_gate_up) in ("bf16", "float32")


def _down_bias(ids, weights, b_down):
    """sum_k weight_k * b_down[id_k] -> (N, D)."""
    return jnp.einsum("nk,nkd->nd", weights, b_down[ids].astype(jnp.float32))


def _from_bits(w, dtype):
    """An expert's weights held as raw uint16 bits -> `dtype`; others as they are."""
    return jax.lax.bitcast_convert_type(w, dtype) if w.dtype == jnp.uint16 else w


def _local_experts(x, ids, weights, w_gate_up, w_down, b_gate_up, b_down, *, activation, impl, first_expert,
                   add_down_bias, bits, scale_inputs=False):
    """The experts held here: [first_expert, first_expert + E_local). Assignments to other experts
    contribute nothing. Returns (N, D)."""
    n, k = ids.shape
    local_e = w_down.shape[0]
    flat = ids.reshape(-1) - first_expert  # (A,) local expert of each assignment
    mine = (flat >= 0) & (flat < local_e)
    flat = jnp.where(mine, flat, local_e)  # others sort to the end, in a group of their own
    order = jnp.argsort(flat, stable=True)  # (A,)
    token = order // k
    counts = jnp.bincount(flat, length=local_e + 1)[:local_e]  # (E_local,)
    gate = (weights.reshape(-1)[order] * mine[order]).astype(jnp.float32)  # (A,)
    rows = x[token]  # (A, D) sorted by expert
    if scale_inputs:  # the weight goes into the expert (Llama 4); its output is summed as it is
        rows, gate = (rows.astype(jnp.float32) * gate[:, None]).astype(x.dtype), mine[order].astype(jnp.float32)
    if impl == "cpp":
        out = jax.ffi.ffi_call(kernels.MOE_TARGET, jax.ShapeDtypeStruct(rows.shape, jnp.float32),
                               vmap_method="sequential")(rows.astype(jnp.float32), counts.astype(jnp.int32),
                                                         w_gate_up, w_down)
    elif impl == "ragged":
        group_sizes = jnp.concatenate([counts, jnp.asarray([flat.shape[0] - jnp.sum(counts)])]).astype(jnp.int32)
        out = _ragged(rows, group_sizes, bits(w_gate_up), bits(w_down), b_gate_up, b_down, activation, add_down_bias)
    else:
        out = _loop(rows, counts, w_gate_up, w_down, b_gate_up, b_down, activation, add_down_bias,
                    block_rows(flat.shape[0], max(local_e, 1)), bits)
    combined = jnp.zeros((n, x.shape[-1]), jnp.float32).at[token].add(out.astype(jnp.float32) * gate[:, None])
    return combined.astype(x.dtype)


def _expert_mlp(rows, w_gate_up, w_down, b_gate_up, b_down, activation, add_down_bias):
    """rows (M, D) through one expert -> (M, D) float32. The dots run in the weights' dtype and
    accumulate in float32 (as ops/linear.py): converting bfloat16 weights to float32 first would
    cost a copy of the expert per block."""
    h = jnp.dot(rows.astype(w_gate_up.dtype), w_gate_up, preferred_element_type=jnp.float32)
    if b_gate_up is not None:
        h = h + b_gate_up.astype(jnp.float32)
    y = jnp.dot(gated(h, activation).astype(w_down.dtype), w_down, preferred_element_type=jnp.float32)
    if b_down is not None and add_down_bias:
        y = y + b_down.astype(jnp.float32)
    return y


def _loop(rows, counts, w_gate_up, w_down, b_gate_up, b_down, activation, add_down_bias, block: int, bits):
    """rows (A, D) sorted by expert, counts (E,) -> (A, D): each expert with rows, block by block."""
    a, d = rows.shape
    starts = jnp.cumsum(counts) - counts
    order = jnp.argsort(counts == 0, stable=True)  # experts with rows first
    active = jnp.sum(counts > 0)
    padded = jnp.concatenate([rows, jnp.zeros((block, d), rows.dtype)])  # a block never runs past the end
    out = jnp.zeros((a + block, d), jnp.float32)

    def one_expert(j, out):
        e = order[j]
        start, count = starts[e], counts[e]
        wgu, wd = bits(w_gate_up[e]), bits(w_down[e])  # slice first, then bit-cast: one expert, not the stack
        bgu = None if b_gate_up is None else b_gate_up[e]
        bd = None if b_down is None else b_down[e]

        def one_block(b, out):
            first = start + b * block
            y = _expert_mlp(jax.lax.dynamic_slice_in_dim(padded, first, block), wgu, wd, bgu, bd, activation,
                            add_down_bias)
            y = jnp.where((b * block + jnp.arange(block) < count)[:, None], y, 0.0)  # rows of the next expert
            return jax.lax.dynamic_update_slice_in_dim(out, jax.lax.dynamic_slice_in_dim(out, first, block) + y,
                                                       first, 0)

        return jax.lax.fori_loop(0, (count + block - 1) // block, one_block, out)

    return jax.lax.fori_loop(0, active, one_expert, out)[:a]


def _ragged(rows, group_sizes, w_gate_up, w_down, b_gate_up, b_down, activation, add_down_bias):
    """The grouped-matmul form: group_sizes (E+1,) with a last group of rows that belong to no
    local expert (multiplied by zero weights)."""
    e = w_down.shape[0]
    pad = lambda w: jnp.concatenate([w, jnp.zeros((1, *w.shape[1:]), w.dtype)])  # noqa: E731
    expert_of = jnp.repeat(jnp.arange(e + 1), group_sizes, total_repeat_length=rows.shape[0])
    h = jax.lax.ragged_dot(rows, pad(w_gate_up).astype(rows.dtype), group_sizes,
                           preferred_element_type=jnp.float32)
    if b_gate_up is not None:
        h = h + pad(b_gate_up).astype(jnp.float32)[expert_of]
    y = jax.lax.ragged_dot(gated(h, activation).astype(rows.dtype), pad(w_down).astype(rows.dtype), group_sizes,
                           preferred_element_type=jnp.float32)
    if b_down is not None and add_down_bias:
        y = y + pad(b_down).astype(jnp.float32)[expert_of]
    return y

