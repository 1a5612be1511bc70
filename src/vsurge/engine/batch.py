"""Host arrays of one engine step, built from a StepPlan (numpy only) and padded to its bucket.

Row order is the plan's: decode rows first, then prompt rows, so output row i
belongs to plan.decode[i] and row D + j to plan.chunks[j]. Padding rows use
the spare slot, position -1 (attends to nothing) and a slot mapping past the
last page (their K/V writes are dropped).
"""

from __future__ import annotations

import numpy as np

from ..kv.paged import StepLayout
from ..ops.sampling import SamplingArrays
from .engine_config import EOS_WIDTH
from .faults import blame
from ..structured.bitmask import ALL_ALLOWED, bitmask_words
from .programs import DecodeBatch, DraftRows, MixedBatch
from .image_encoder import rope_positions
from .plan import StepPlan
from .sequence import Sequence


PACKING = "packing its rows of a step"  # (faults.py: a failure here is the sequence's alone)


class BatchBuilder:
    def __init__(self, vocab_size: int, num_pages: int, page_size: int, spare_slot: int, table_width: int,
                 draft_state_rows: int = 0, adapters: bool = False, media=None, media_width: int = 0,
                 mrope: bool = False):
        """draft_state_rows: a speculating hybrid model's draft-state rows (EngineConfig.draft_state_rows):
        its steps then say where each row's recurrent states come from and go (programs.DraftRows).
        adapters: the engine serves LoRA adapters: steps say each row's adapter slot.
        media: a vision-language model's MediaEncoder (media.py): prompt steps carry image embeddings
        (media_width wide: the text width times the model's feature_levels) for their image positions, and
        where the model's image tokens see their whole image (media.whole_images: Gemma 3), the last key
        each token sees (chunk_limit).
        mrope: the model's rotary positions are 3-D (Qwen2.5-VL, Qwen3-VL): prompt steps carry each token's
        (media.rope_positions), decode steps each row's rope delta."""
        self.media, self.media_width, self.mrope = media, media_width, mrope
        self.draft_state_rows = draft_state_rows
        self.adapters = adapters
        self.vocab_size = vocab_size
        self.words = bitmask_words(vocab_size)
        self.page_size = page_size
        self.skip = num_pages * page_size  # a slot-mapping value whose write is dropped
        self.spare = spare_slot
        self.table_width = table_width  # pages of a max_length sequence

    def _pages_for(self, last_position: int) -> int:
        return last_position // self.page_size + 1

    def _table(self, seq: Sequence, width: int) -> np.ndarray:
        table = np.zeros(width, np.int32)
        pages = seq.pages.pages[:width]
        table[: len(pages)] = pages
        return table

    def _bitmasks(self, rows: int, masks: dict | None, row_of: dict) -> np.ndarray:
        """(rows, ceil(V/32)) allowed-token bits; masks: sequence -> its row's bits (constrained rows)."""
        out = np.full((rows, self.words), ALL_ALLOWED, np.int32)
        for seq, mask in (masks or {}).items():
            if seq in row_of:
                out[row_of[seq]] = mask
        return out

    # ------------------------------------------------------------ decode
    def decode_window(self, plan: StepPlan) -> int:
        """Pages the furthest row reads during the plan's steps (drafts included)."""
        return max(self._pages_for(s.num_tokens - 1 + max(plan.num_steps - 1, len(plan.drafts.get(s, ()))))
                   for s in plan.decode)

    def decode(self, plan: StepPlan, rows: int, window: int, masks: dict | None = None,
               columns: int | None = None) -> DecodeBatch:
        """columns: pages the rows read (`decode_window`) when the program loops over page columns
        instead of unrolling all `window` of them; None for unrolled programs."""
        d = len(plan.decode)
        tokens, positions = np.zeros(rows, np.int32), np.zeros(rows, np.int32)
        tables = np.zeros((rows, window), np.int32)
        slots = np.full(rows, self.spare, np.int32)
        generated, active = np.zeros(rows, np.int32), np.zeros(rows, bool)
        eos, budget = np.full((rows, EOS_WIDTH), -1, np.int32), np.ones(rows, np.int32)
        from_device = np.zeros(rows, bool)
        rope_delta = np.zeros(rows, np.int32) if self.mrope else None
        rows_of = [(seq, seq.tokens[-1], 0) for seq in plan.decode]
        rows_of += [(seq, token, i + 1) for seq, i, token in plan.draft_rows]  # drafts: later positions
        for i, (seq, token, ahead) in enumerate(rows_of):
            with blame(seq, PACKING):
                tokens[i], positions[i] = token, seq.num_tokens - 1 + ahead
                from_device[i] = not ahead and seq.pending > 0  # sampled by the step in flight: fed on device
                tables[i] = self._table(seq, window)
                slots[i], generated[i], active[i] = seq.slot, seq.num_generated + ahead, True
                ids = seq.request.eos_token_ids
                eos[i, : len(ids)] = ids
                budget[i] = seq.request.max_new_tokens
                if rope_delta is not None:
                    rope_delta[i] = seq.request.rope_delta
        row_of = {seq: i for i, seq in enumerate(plan.decode)}
        adapters = None
        if self.adapters:
            adapters = np.full(rows, -1, np.int32)
            adapters[: len(rows_of)] = [seq.adapter_slot for seq, _, _ in rows_of]
        return DecodeBatch(tokens, positions, tables, slots, generated, active, eos, budget,
                           self._bitmasks(rows, masks, row_of), np.asarray(plan.num_steps if d else 0, np.int32),
                           from_device, None if columns is None else np.asarray(columns, np.int32),
                           self._draft_rows(plan, rows) if self.draft_state_rows else None, adapters, rope_delta)

    def _draft_rows(self, plan: StepPlan, rows: int) -> DraftRows:
        """Draft j of the step (plan.draft_rows order, batch row len(plan.decode) + j) writes draft-state
        row j and starts from its predecessor's (the sequence's decode row left the first one's in the
        slot); draft rows update no slot (verification decides which state the sequence keeps)."""
        x, d = self.draft_state_rows, len(plan.decode)
        state_slots, restore = self._state_rows(plan, rows)
        out = DraftRows(state_slots, restore, np.full(x, -1, np.int32), np.full(x, self.spare, np.int32),
                        np.full(x, -1, np.int32), np.full(x, x, np.int32))
        for j, (seq, i, _) in enumerate(plan.draft_rows):
            out.rows[j], out.slots[j], out.start[j], out.to[j] = d + j, seq.slot, j - 1 if i else -1, j
        return out

    def _state_rows(self, plan: StepPlan, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """(slot, draft-state row to start from or -1) of each decode row: draft rows and padding the spare."""
        slots, restore = np.full(rows, self.spare, np.int32), np.full(rows, -1, np.int32)
        for i, seq in enumerate(plan.decode):
            slots[i] = seq.slot
            restore[i] = -1 if seq.state_restore is None else seq.state_restore
        return slots, restore

    # ------------------------------------------------------------ mixed
    def mixed(self, plan: StepPlan, decode_rows: int, masks: dict | None = None) -> MixedBatch:
        rows_p, length = plan.chunk_shape
        d = decode_rows
        n, r = d + rows_p * length, d + rows_p
        width = self.table_width
        tokens, positions = np.zeros(n, np.int32), np.zeros(n, np.int32)
        slot_mapping = np.full(n, self.skip, np.int32)
        decode_tables, decode_pos = np.zeros((d, width), np.int32), np.full((d, 1), -1, np.int32)
        chunk_tables, chunk_pos = np.zeros((rows_p, width), np.int32), np.full((rows_p, length), -1, np.int32)
        restore, save = np.full(rows_p, -1, np.int32), np.full(rows_p, -1, np.int32)
        logits_index, slots = np.zeros(r, np.int32), np.full(r, self.spare, np.int32)
        generated, samples = np.zeros(r, np.int32), np.zeros(r, bool)
        from_device = np.zeros(d, bool)
        adapters = np.full(n, -1, np.int32) if self.adapters else None
        media = self.media is not None
        embeds = np.zeros((n, self.media_width), np.float32) if media else None  # (N, D) image rows
        is_image = np.zeros(n, bool) if media else None
        rope = np.zeros((3, n), np.int32) if self.mrope else None  # (3, N) rotary (t, h, w) of each token
        columns = 1

        def place(row: int, seq: Sequence, start: int, count: int, at: int) -> None:
            nonlocal columns
            if adapters is not None:
                adapters[at:at + count] = seq.adapter_slot
            pos = np.arange(start, start + count)
            pages = np.asarray(seq.pages.pages, np.int32)
            known = seq.tokens[start:start + count]  # (a token still on the device is fed there)
            if media and seq.request.media:  # image positions: pseudo-tokens in, their embeddings fed instead
                tokens[at:at + len(known)] = np.maximum(known, 0)
                self.media.fill(seq, start, count, embeds, is_image, at)
            else:
                tokens[at:at + len(known)] = known
            positions[at:at + count] = pos
            if rope is not None:
                rope[:, at:at + count] = rope_positions(seq.request, start, count)
            slot_mapping[at:at + count] = pages[pos // self.page_size] * self.page_size + pos % self.page_size
            logits_index[row] = at + count - 1
            slots[row], generated[row] = seq.slot, seq.num_generated
            columns = max(columns, self._pages_for(start + count - 1))

        for i, seq in enumerate(plan.decode):
            with blame(seq, PACKING):
                place(i, seq, seq.num_tokens - 1, 1, i)
                from_device[i] = seq.pending > 0
                decode_tables[i], decode_pos[i, 0], samples[i] = self._table(seq, width), seq.num_tokens - 1, True
        for j, chunk in enumerate(plan.chunks):
            with blame(chunk.seq, PACKING):
                at = d + j * length
                place(d + j, chunk.seq, chunk.start, chunk.length, at)
                chunk_tables[j] = self._table(chunk.seq, width)
                chunk_pos[j, : chunk.length] = np.arange(chunk.start, chunk.start + chunk.length)
                restore[j], save[j] = chunk.restore, chunk.save
                samples[d + j] = chunk.samples
        layout = StepLayout(slot_mapping, decode_tables, decode_pos, chunk_tables, chunk_pos,
                            np.asarray(columns, np.int32), slots[:d], slots[d:], restore, save,
                            self._state_rows(plan, d)[1] if self.draft_state_rows else None,
                            chunk_limit=self._image_limits(plan, chunk_pos) if media and self.media.whole_images
                            else None)
        row_of = {seq: i for i, seq in enumerate(plan.decode)}
        row_of.update({chunk.seq: d + j for j, chunk in enumerate(plan.chunks) if chunk.samples})
        return MixedBatch(tokens, positions, layout, logits_index, slots, generated, samples,
                          self._bitmasks(r, masks, row_of), from_device, adapters, embeds, is_image, rope)

    @staticmethod
    def _image_limits(plan: StepPlan, chunk_pos: np.ndarray) -> np.ndarray:
        """(P, C) the last key each chunk token sees: its own position, an image token its image's last."""
        limit = chunk_pos.copy()
        for j, chunk in enumerate(plan.chunks):
            for item in chunk.seq.request.media:
                pos = item.positions
                lo, hi = np.searchsorted(pos, chunk.start), np.searchsorted(pos, chunk.start + chunk.length)
                limit[j, pos[lo:hi] - chunk.start] = pos[-1]
        return limit

    # ------------------------------------------------------------ shapes to compile
    def decode_spec(self, rows: int, window: int, dynamic: bool = False) -> DecodeBatch:
        return self.decode(StepPlan(), rows, window, columns=1 if dynamic else None)

    def mixed_spec(self, decode_rows: int, shape: tuple[int, int]) -> MixedBatch:
        return self.mixed(StepPlan(chunk_shape=shape), decode_rows)

    def slot_arrays_spec(self) -> tuple:
        v = self.vocab_size
        return (np.int32(0), np.zeros(v, np.int32), np.zeros(v, bool), np.zeros(v, np.float32), np.asarray(False),
                SamplingArrays.neutral(1), np.asarray(False))

    # ------------------------------------------------------------ slot set-up
    def slot_arrays(self, seq: Sequence) -> tuple:
        """(counts, prompt_mask, bias, has_bias, sampling, want_logprobs) of one admitted sequence;
        counts include what it generated before a preemption."""
        request, vocab = seq.request, self.vocab_size
        counts = np.bincount(np.asarray(seq.generated, np.int64), minlength=vocab)[:vocab].astype(np.int32)
        prompt_mask = np.zeros(vocab, bool)
        prompt_mask[request.prompt_ids] = True  # (an image's placeholder ids count, as in the references)
        bias = np.zeros(vocab, np.float32)
        for token, value in (request.params.logit_bias or {}).items():
            bias[token] = value
        sampling = SamplingArrays.from_params([request.params], [request.seed])
        return (counts, prompt_mask, bias, np.asarray(bool(request.params.logit_bias)), sampling,
                np.asarray(request.params.logprobs is not None))
