"""The device programs of an engine (traced under jit; `core.py` compiles them per bucket).

State (`EngineState`, donated to every call so it is updated in place):
    kv     PagedAttentionCache: every sequence's keys/values, in pages
    slots  per-slot sampling state, S = max_slots rows plus one spare row that
           padding rows read and write

Programs:
    decode   D rows, one token each, for up to `num_steps` steps in an on-device
             loop (rows stop at an end token or their budget); each row reads a
             static window of W pages
    mixed    D decode rows and P prompt rows of C tokens in one forward pass;
             rows read a dynamic number of page columns (the step is dominated by
             its prompt tokens, so one program serves every window)
    set_slot load one admitted sequence's sampling state into its slot
    embed    R rows of C tokens, several whole prompts per row (segments, encode.py), no KV
             cache: every prompt's final hidden states pooled (mean, last token)
    score    the same pass, then each token's log-probability given the ones before it
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ..kv.paged import PagedAttentionCache, StepLayout
from ..kv.recurrent import run_fresh
from ..ops.attention import attend
from ..ops.lora import lora_head_rows, lora_rows
from ..ops.quantized import real_rows
from ..ops.sampling import (TOP_LOGPROBS, SamplingArrays, apply_penalties, draw_tokens, penalized_greedy,
                            penalties_active, token_logprobs)
from ..structured.bitmask import apply_token_bitmask
from .encode import EncodeBatch
from .plan import HostStepOutput

jax.tree_util.register_dataclass(EncodeBatch)  # host arrays of an embed/score call (encode.py)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class SlotState:
    """Per-slot sampling state (S+1 rows: the last one is the spare row of padding)."""

    counts: jax.Array  # (S+1, V) i32 generated-token counts (penalties)
    prompt_mask: jax.Array  # (S+1, V) bool tokens of the prompt (repetition penalty)
    bias: jax.Array  # (S+1, V) f32 logit bias
    has_bias: jax.Array  # (S+1,) bool
    sampling: SamplingArrays  # rows of S+1
    want_logprobs: jax.Array  # (S+1,) bool
    # the overlapped loop (driver.py) feeds a step the tokens its predecessor sampled without reading them:
    last_token: jax.Array  # (S+1,) i32 the slot's last sampled token
    stopped: jax.Array  # (S+1,) bool the slot's row ended (end token or budget) in the last decode call


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class EngineState:
    kv: PagedAttentionCache
    slots: SlotState


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class DecodeBatch:
    """Inputs of a decode program (host arrays; D rows, W pages per row)."""

    tokens: np.ndarray  # (D,) i32 last token of each row (its K/V is computed now)
    positions: np.ndarray  # (D,) i32 position of that token
    tables: np.ndarray  # (D, W) i32 page ids
    slots: np.ndarray  # (D,) i32 slot of each row (the spare slot for padding)
    generated: np.ndarray  # (D,) i32 tokens generated so far (folded into the sampling key)
    active: np.ndarray  # (D,) bool
    eos: np.ndarray  # (D, EOS_WIDTH) i32 ids that end the row (-1 = unused)
    budget: np.ndarray  # (D,) i32 tokens the row may still generate
    bitmask: np.ndarray  # (D, ceil(V/32)) i32 allowed next tokens (-1 = all)
    num_steps: np.ndarray  # () i32 steps to run (1 when a row is constrained)
    from_device: np.ndarray  # (D,) bool: the row's token is its slot's last_token (sampled by the step in flight)
    num_columns: np.ndarray | None = None  # () i32: loop over this many page columns (None: all W, unrolled)
    # a hybrid model's speculating engine (kv/paged.py StepLayout): the first step's recurrent rows
    drafts: "DraftRows | None" = None
    adapters: np.ndarray | None = None  # (D,) i32 each row's LoRA adapter slot (-1: none); None: no adapters
    # an M-RoPE model's (Qwen2.5-VL): (D,) i32 each row's rotary offset (its rotary position on every axis is
    # position + rope_delta); None for every other model
    rope_delta: np.ndarray | None = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class DraftRows:
    """Where a speculating hybrid model's decode step reads and writes recurrent states (the first of
    its steps; kv/recurrent.py run_packed). X = EngineConfig.draft_state_rows."""

    state_slots: np.ndarray  # (D,) i32 slot whose states the row updates (the spare for draft rows)
    restore: np.ndarray  # (D,) i32 draft-state row the row starts from (-1: its slot's)
    rows: np.ndarray  # (X,) i32 the draft rows, in order (-1 = none)
    slots: np.ndarray  # (X,) i32 their sequences' slots
    start: np.ndarray  # (X,) i32 draft-state row each starts from (-1: its slot's, the decode row's end)
    to: np.ndarray  # (X,) i32 draft-state row each leaves its end state in


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class MixedBatch:
    """Inputs of a mixed program: N = D + P*C tokens in R = D + P sampling rows."""

    tokens: np.ndarray  # (N,) i32
    positions: np.ndarray  # (N,) i32
    layout: StepLayout  # where tokens go and which pages each row reads
    logits_index: np.ndarray  # (R,) i32 token whose logits each row samples from
    slots: np.ndarray  # (R,) i32
    generated: np.ndarray  # (R,) i32
    samples: np.ndarray  # (R,) bool: the row's token is real (decode rows, prompt rows that end)
    bitmask: np.ndarray  # (R, ceil(V/32)) i32
    from_device: np.ndarray  # (D,) bool: decode row i's token is its slot's last_token
    adapters: np.ndarray | None = None  # (N,) i32 each token's LoRA adapter slot (-1: none); None: no adapters
    # a vision-language model's: (N, D) f32 embeddings fed instead of the token's at image positions (N,) bool
    media_embeds: np.ndarray | None = None
    media_mask: np.ndarray | None = None
    rope_positions: np.ndarray | None = None  # an M-RoPE model's (3, N) i32 rotary (t, h, w) of each token


def _rope_kwargs(rope_positions) -> dict:
    """decode_layers' rotary positions where they are not the KV positions (M-RoPE): (3, N) -> (3, 1, N)."""
    return {} if rope_positions is None else {"rope_positions": rope_positions[:, None]}


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class StepOutput:
    tokens: jax.Array  # (K, R) i32 token of row r at decode step k
    valid: jax.Array  # (K, R) bool
    logprob: jax.Array  # (K, R) f32 log-probability of the token (0 unless requested)
    top_ids: jax.Array  # (K, R, 20) i32
    top_logprobs: jax.Array  # (K, R, 20) f32
    # row of the first prompt row (decode rows are padded to a bucket before them)
    chunk_offset: int = dataclasses.field(default=0, metadata=dict(static=True))

    def to_host(self, with_logprobs: bool) -> HostStepOutput:
        """Copy to numpy (the driver calls this: drivers never touch JAX)."""
        if with_logprobs:
            tokens, valid, *lp = jax.device_get((self.tokens, self.valid, self.logprob, self.top_ids,
                                                 self.top_logprobs))
            return HostStepOutput(tokens, valid, tuple(lp), self.chunk_offset)
        tokens, valid = jax.device_get((self.tokens, self.valid))
        return HostStepOutput(tokens, valid, None, self.chunk_offset)


# ------------------------------------------------------------ sampling
def sample_rows(logits, slots: SlotState, rows, generated, bitmask):
    """One token per row. logits (R, V) f32; rows (R,) slot of each row; generated (R,) i32.

    A greedy batch (the common case) takes its tokens in one pass that applies the mask and the
    penalties as it goes (ops/sampling.penalized_greedy; neutral values leave a logit exactly as it
    was). The branches return tokens, never logits: XLA:CPU copies an (R, V) operand that a
    conditional hands back unchanged, and fused the stages around such conds badly (32 rows of the 49k
    vocabulary held to AVX2: 9.7 ms of a 78 ms decode step with a repetition penalty)."""
    p = jax.tree.map(lambda a: a[rows], slots.sampling)
    masked, penalized = jnp.any(bitmask != -1), penalties_active(p)
    biased = jnp.any(slots.has_bias[rows])

    def greedy(l):
        def adjusted(l):
            return penalized_greedy(l, slots.counts, slots.prompt_mask, rows, p, bitmask)
        return jax.lax.cond(biased, lambda l: adjusted(l + slots.bias[rows]), adjusted, l)

    def sampled(l):  # (the copies of skipped stages are small next to the draw's sort)
        l = jax.lax.cond(masked, apply_token_bitmask, lambda l, _: l, l, bitmask)
        l = jax.lax.cond(penalized, lambda l: apply_penalties(l, slots.counts[rows], slots.prompt_mask[rows], p),
                         lambda l: l, l)
        l = jax.lax.cond(biased, lambda l: l + slots.bias[rows], lambda l: l, l)
        return draw_tokens(l, p, generated)

    return jax.lax.cond(jnp.any(p.temperature > 0), sampled, greedy, logits)


def _logprobs(logits, tokens, wanted):
    """(chosen (R,), top ids (R, 20), top values (R, 20)) when a row wants them, else zeros."""
    r = tokens.shape[0]
    zeros = (jnp.zeros((r,), jnp.float32), jnp.zeros((r, TOP_LOGPROBS), jnp.int32),
             jnp.zeros((r, TOP_LOGPROBS), jnp.float32))
    return jax.lax.cond(jnp.any(wanted), lambda: token_logprobs(logits, tokens), lambda: zeros)


def _count(slots: SlotState, rows, tokens, real) -> SlotState:
    return dataclasses.replace(slots, counts=slots.counts.at[rows, tokens].add(real.astype(jnp.int32)))


def _fed(slots: SlotState, rows, tokens, from_device):
    """Each row's input token: the host's, or its slot's last sampled one (fed back on device)."""
    return jnp.where(from_device, slots.last_token[rows], tokens)


def _remember(slots: SlotState, rows, tokens, real, stopped) -> SlotState:
    """Keep each real row's last token and whether it ended, for a next step the host built before
    seeing them (padding rows write the spare slot)."""
    rows = jnp.where(real, rows, slots.last_token.shape[0] - 1)
    return dataclasses.replace(slots, last_token=slots.last_token.at[rows].set(tokens),
                               stopped=slots.stopped.at[rows].set(stopped))


# ------------------------------------------------------------ programs
def decode(graphdef, graphstate, graphother, state: EngineState, batch: DecodeBatch, *, max_steps: int):
    """Up to `batch.num_steps` decode steps for D rows -> (state, StepOutput with K = max_steps)."""
    model = nnx.merge(graphdef, graphstate, graphother)
    d = batch.tokens.shape[0]
    ps, skip = state.kv.page_size, state.kv.num_pages * state.kv.page_size
    rows = jnp.arange(d)
    empty_chunks = (jnp.zeros((0, 1), jnp.int32), jnp.zeros((0, 1), jnp.int32))
    out = StepOutput(jnp.zeros((max_steps, d), jnp.int32), jnp.zeros((max_steps, d), bool),
                     jnp.zeros((max_steps, d), jnp.float32), jnp.zeros((max_steps, d, TOP_LOGPROBS), jnp.int32),
                     jnp.zeros((max_steps, d, TOP_LOGPROBS), jnp.float32))

    def keep_going(carry):
        step, _, _, _, _, active, _ = carry
        return (step < batch.num_steps) & jnp.any(active)

    def one_step(carry):
        step, state, tokens, positions, generated, active, out = carry
        column = jnp.minimum(positions // ps, batch.tables.shape[1] - 1)
        page = batch.tables[rows, column]
        columns = None if batch.num_columns is None else jnp.maximum(batch.num_columns, jnp.max(column) + 1)
        layout = StepLayout(jnp.where(active, page * ps + positions % ps, skip), batch.tables,
                            jnp.where(active, positions, -1)[:, None], *empty_chunks, columns, batch.slots,
                            jnp.zeros((0,), jnp.int32))
        if batch.drafts is not None:  # restores and drafts happen in the first step only
            first, dr = step == 0, batch.drafts
            layout = dataclasses.replace(
                layout, decode_slots=dr.state_slots, decode_restore=jnp.where(first, dr.restore, -1),
                draft_rows=jnp.where(first, dr.rows, -1), draft_slots=dr.slots, draft_from=dr.start, draft_to=dr.to)
        with real_rows(active if batch.drafts is None else None), lora_rows(batch.adapters):  # (padding: skipped)
            hidden = model.embed_tokens(tokens[None])  # (1, D, Dm)
            rope = None if batch.rope_delta is None else jnp.broadcast_to(positions + batch.rope_delta, (3, d))
            hidden, kv = model.decode_layers(hidden, positions[None], state.kv.for_step(layout), **_rope_kwargs(rope))
        with lora_head_rows(batch.adapters):
            logits = model.logits(hidden[0])  # (D, V)
        new = sample_rows(logits, state.slots, batch.slots, generated, batch.bitmask)
        new = jnp.where(active, new, tokens)
        lp = _logprobs(logits, new, state.slots.want_logprobs[batch.slots] & active)
        slots = _count(state.slots, batch.slots, new, active)
        generated = generated + active
        done = active & (jnp.any(new[:, None] == batch.eos, axis=-1) | (generated >= batch.budget))
        out = StepOutput(out.tokens.at[step].set(new), out.valid.at[step].set(active),
                         out.logprob.at[step].set(lp[0]), out.top_ids.at[step].set(lp[1]),
                         out.top_logprobs.at[step].set(lp[2]))
        state = EngineState(kv.storage_only(), slots)
        return step + 1, state, new, positions + active, generated, active & ~done, out

    # a row fed its token on device whose previous call ended it (an end token the host has not read
    # yet) runs no more: nothing written, nothing sampled
    active = batch.active & ~(batch.from_device & state.slots.stopped[batch.slots])
    tokens = _fed(state.slots, batch.slots, batch.tokens, batch.from_device)
    carry = (jnp.int32(0), state, tokens, batch.positions, batch.generated, active, out)
    _, state, tokens, _, _, still, out = jax.lax.while_loop(keep_going, one_step, carry)
    slots = _remember(state.slots, batch.slots, tokens, batch.active, batch.active & ~still)
    return EngineState(state.kv, slots), out


def mixed(graphdef, graphstate, graphother, state: EngineState, batch: MixedBatch):
    """One forward pass over decode tokens and prompt rows -> (state, StepOutput with K = 1)."""
    model = nnx.merge(graphdef, graphstate, graphother)
    d = batch.from_device.shape[0]
    fed = _fed(state.slots, batch.slots[:d], batch.tokens[:d], batch.from_device)
    with lora_rows(batch.adapters):
        hidden = model.embed_tokens(jnp.concatenate([fed, batch.tokens[d:]])[None])  # (1, N, Dm)
    extra = {}
    if batch.media_embeds is not None:  # image positions take their encoder embeddings
        width, mask = hidden.shape[-1], batch.media_mask[:, None]
        hidden = jnp.where(mask[None], batch.media_embeds[None, :, :width].astype(hidden.dtype), hidden)
        if batch.media_embeds.shape[1] > width:  # deepstack features: added after the first layers
            levels = batch.media_embeds[:, width:].reshape(mask.shape[0], -1, width).transpose(1, 0, 2)  # (K, N, D)
            extra["layer_inputs"] = jnp.where(mask[None], levels, 0.0)[:, None]
    lay = batch.layout  # real tokens: decode rows and prompt tokens with a position (-1: padding)
    real = jnp.concatenate([lay.decode_pos[:, 0] >= 0, lay.chunk_pos.reshape(-1) >= 0])
    with real_rows(real if lay.draft_rows is None else None), lora_rows(batch.adapters):
        hidden, kv = model.decode_layers(hidden, batch.positions[None], state.kv.for_step(batch.layout),
                                         **_rope_kwargs(batch.rope_positions), **extra)
    with lora_head_rows(None if batch.adapters is None else batch.adapters[batch.logits_index]):
        logits = model.logits(hidden[0, batch.logits_index])  # (R, V)
    new = sample_rows(logits, state.slots, batch.slots, batch.generated, batch.bitmask)
    lp = _logprobs(logits, new, state.slots.want_logprobs[batch.slots] & batch.samples)
    slots = _remember(_count(state.slots, batch.slots, new, batch.samples), batch.slots, new, batch.samples,
                      jnp.zeros_like(batch.samples))
    state = EngineState(kv.storage_only(), slots)
    return state, StepOutput(new[None], batch.samples[None], lp[0][None], lp[1][None], lp[2][None])


def vision(graphdef, graphstate, graphother, pixels):
    """A vision-language model's tower: uint8 (n, H, W, C) tiles -> (n * tokens_per_tile, D) f32 (a family
    with `variable_images`: one image (1, H, W, C) -> its tokens)."""
    model = nnx.merge(graphdef, graphstate, graphother)
    return model.encode_images(pixels).astype(jnp.float32)


# ------------------------------------------------------------ whole-prompt passes (engine/encode.py)
@jax.tree_util.register_dataclass
@dataclasses.dataclass
class SegmentAttention:
    """The `cache` of a pass over packed prompts: each layer's own attention (scale, window,
    soft-cap, sinks) within each prompt (segment) only, nothing stored. segments (R, C) i32,
    -1 = padding."""

    segments: jax.Array

    def attend(self, layer, q, k, v, positions, spec, sinks=None):
        """q (R, C, H, dk), k (R, C, KVH, dk), v (R, C, KVH, dv), positions (R, C) -> (R, C, H, dv)."""
        seg = self.segments
        same_prompt = (seg[:, :, None] == seg[:, None, :]) & (seg[:, None, :] >= 0)  # (R, Cq, Cs)
        out = attend(q, k.transpose(0, 2, 3, 1), v.swapaxes(1, 2), positions, positions, spec, sinks,
                     mask=same_prompt)
        return out, self

    def recurrent(self, index, part, op, inputs, positions, shape):
        """Each row from a zero state (a model with recurrent layers gets one prompt per row:
        encode.pack), nothing kept."""
        return run_fresh(op, inputs, shape, self.segments >= 0), self


def _prompt_pass(graphdef, graphstate, graphother, batch):
    """-> (model, hidden (R, C, D) after the final norm) of every packed prompt."""
    model = nnx.merge(graphdef, graphstate, graphother)
    cache = SegmentAttention(batch.segments)
    hidden, _ = model.decode_layers(model.embed_tokens(batch.tokens), batch.positions, cache)
    return model, hidden


def embed(graphdef, graphstate, graphother, batch):
    """-> (mean (S, D), last (S, D)) float32 final hidden states of each of the call's S prompts."""
    _, hidden = _prompt_pass(graphdef, graphstate, graphother, batch)
    flat = hidden.reshape(-1, hidden.shape[-1]).astype(jnp.float32)  # (R*C, D)
    segments = batch.segments.reshape(-1)
    slots = batch.counts.shape[0]
    sums = jax.ops.segment_sum(flat, jnp.where(segments >= 0, segments, slots), num_segments=slots + 1)[:slots]
    mean = sums / jnp.maximum(batch.counts, 1.0)[:, None]
    return mean, flat[batch.last]


def score(graphdef, graphstate, graphother, batch):
    """-> (logprob (R, C), rank (R, C), top ids (R, C, 20), top logprobs (R, C, 20)) of each position's
    next prompt token (`batch.targets`; 0 where there is none), from the model's own distribution;
    rank 1 = the likeliest token."""
    model, hidden = _prompt_pass(graphdef, graphstate, graphother, batch)
    logp = jax.nn.log_softmax(model.logits(hidden), axis=-1)  # (R, C, V)
    chosen = jnp.take_along_axis(logp, jnp.maximum(batch.targets, 0)[..., None], axis=-1)[..., 0]
    rank = jnp.sum(logp > chosen[..., None], axis=-1, dtype=jnp.int32) + 1
    top_values, top_ids = jax.lax.top_k(logp, TOP_LOGPROBS)
    return jnp.where(batch.targets >= 0, chosen, 0.0), rank, top_ids.astype(jnp.int32), top_values


def set_slot(state: EngineState, slot, counts, prompt_mask, bias, has_bias, sampling: SamplingArrays, want_logprobs):
    """Load one sequence's sampling state into `slot` (counts/prompt_mask/bias (V,); sampling rows of 1)."""
    s = state.slots

    def put(full, value):
        return full.at[slot].set(value)

    slots = SlotState(put(s.counts, counts), put(s.prompt_mask, prompt_mask), put(s.bias, bias),
                      put(s.has_bias, has_bias), jax.tree.map(lambda f, v: put(f, v[0]), s.sampling, sampling),
                      put(s.want_logprobs, want_logprobs), s.last_token, put(s.stopped, False))
    return dataclasses.replace(state, slots=slots)


def empty_state(model_config, dtype, num_pages: int, page_size: int, num_slots: int,
                snapshot_rows: int = 0, draft_rows: int = 0, state_dtype=jnp.float32,
                backend: str = "cpu") -> EngineState:
    """Zero pages, states, snapshots and draft states, and neutral slots (traced once as the `init` program).
    dtype: the KV pages' storage; state_dtype: the recurrent states' (kv/recurrent.py); backend: the pages' layout
    (kv/backends)."""
    rows, vocab = num_slots + 1, model_config.vocab_size
    kv = PagedAttentionCache.init(model_config.kv_layout, num_pages, page_size, dtype, model_config.state_layout,
                                  rows, snapshot_rows, draft_rows, state_dtype, backend)
    slots = SlotState(jnp.zeros((rows, vocab), jnp.int32), jnp.zeros((rows, vocab), bool),
                      jnp.zeros((rows, vocab), jnp.float32), jnp.zeros((rows,), bool),
                      jax.tree.map(jnp.asarray, SamplingArrays.neutral(rows)), jnp.zeros((rows,), bool),
                      jnp.zeros((rows,), jnp.int32), jnp.zeros((rows,), bool))
    return EngineState(kv, slots)
