"""The scheduler: which sequences compute what in the next engine step (pure Python, no JAX).

    plan = scheduler.schedule()                  # decode rows + prompt chunk rows
    out = engine.step(state, plan)               # device work
    updates = scheduler.postprocess(plan, out)   # tokens in, text out, finished sequences freed

Each step, every running sequence with one token left to compute (its last
sampled token) decodes; then prompt chunks fill the prompt-token budget:
prompts being prefilled first, then waiting sequences admitted FIFO while a
slot and pages are free. A prompt is cut into rows of the step's chunk length,
so one step prefills many short prompts, or one long prompt in several rows.
With no prompt to prefill, a step runs several decode steps on the device.
When a decoding sequence needs a page and none is left, the most recently
admitted sequence is preempted: its pages are freed and it goes back to the
front of the queue with everything it generated, to be recomputed (vLLM's
recompute preemption); with a host tier (kv/tiers.py) its full pages are swapped
out to host memory and come back when it resumes, so only its last partial page
is recomputed. A waiting prompt whose prefix a running sequence is computing
right now waits for those pages (at most `prefix_wait_steps` steps) instead of
computing them a second time; others may overtake it meanwhile. With `scheduling_policy="priority"` the queue is ordered by
(priority, arrival) (lower priority values first, as vLLM), the victim is the running
sequence with the largest (priority, arrival), and a waiting sequence that finds no
free slot preempts a running one of lower priority. The page pool is an HBMPageManager (paged engine:
pages on demand, prefix cache) or SlotPages (dense engine: a fixed run per slot).

Disaggregated serving (engine/disaggregated.py) gives each engine one `role`
(EngineConfig.role): a "prefill" scheduler computes prompt chunks only, and a
sequence whose prompt is computed (its first token sampled, or every token but
the last found in the prefix cache) waits in `running` until the driver hands it
over (`ready_for_handover`, `detach`); a "decode" scheduler never sees a prompt:
handed-over sequences arrive with their K/V (`attach`), and a preempted one goes
to `evicted`, for a prefill engine to recompute.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
from typing import Sequence as Seq

from . import speculation
from .engine_config import EngineConfig
from .decode_budget import DecodeBudget
from .faults import SequenceFault, find_culprit
from .image_encoder import waits_for_program, whole_images, within_image_budget
from .plan import ChunkRow, HostStepOutput, NextIterationPlan, StepPlan  # noqa: F401 (re-exported)
from ..kv.page_table import PageTable
from ..kv.state_snapshots import chain_to
from .sequence import Sequence, Status


class _NeedsResults(Exception):
    """Planning ahead of a step in flight would have to preempt: plan after reading its results."""


class Scheduler:
    def __init__(self, pool, config: EngineConfig, adapters=None, media=None, shape_ready=None):
        """adapters: the engine's LoRA adapter slots (lora/slots.py), or None. media: a vision-language
        engine's MediaEncoder (engine/image_encoder.py: which images are encoded already), or None.
        shape_ready: chunk shape -> whether its program is compiled (engine/deferred_programs.py), or None."""
        self.pool = pool
        self.config = config
        self.adapters = adapters
        self.media = media
        self.shape_ready = shape_ready
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: list[Sequence] = []  # admission order: the last one is preempted first
        self._free_slots = list(range(config.max_slots))  # a min-heap: lowest slot first
        self.num_preemptions = 0
        self.num_swap_ins = 0  # pages a resumed sequence found in the host or disk tier
        self.num_prefix_waits = 0  # steps waiting prompts spent waiting for prefixes in flight
        self.num_draft_tokens = self.num_accepted_tokens = 0  # speculation: drafts verified, and kept
        self.role = config.role
        self.evicted: list[Sequence] = []  # decode role: preempted sequences, for a prefill engine to recompute
        self._ahead = False  # planning while a step is in flight (schedule(ahead=True))
        self.decode_budget = DecodeBudget(config.decode_call_ms)  # multi-step calls cut to a time (the driver measures)

    # ------------------------------------------------------------ membership
    @property
    def by_priority(self) -> bool:
        return self.config.scheduling_policy == "priority"

    @staticmethod
    def _rank(seq: Sequence) -> tuple[int, int]:
        """Order under the priority policy: lower priority values first, then arrival."""
        return seq.request.params.priority, seq.request.request_id

    def add(self, seq: Sequence) -> None:
        if self.by_priority:
            self._enqueue(seq)
        else:
            self.waiting.append(seq)

    def _enqueue(self, seq: Sequence) -> None:
        """Insert in (priority, arrival) order."""
        rank = self._rank(seq)
        at = next((i for i, other in enumerate(self.waiting) if self._rank(other) > rank), len(self.waiting))
        self.waiting.insert(at, seq)

    def _victim(self) -> Sequence:
        """The running sequence to preempt: the newest (FCFS), or the one ranked last (priority)."""
        return max(self.running, key=self._rank) if self.by_priority else self.running[-1]

    def _preempt_for_priority(self) -> None:
        """A waiting sequence with no free slot takes the slot of a running one of lower priority."""
        while self.by_priority and self.waiting and not self._free_slots and self.running:
            victim = self._victim()
            if victim.request.params.priority <= self.waiting[0].request.params.priority:
                return
            self._preempt(victim)

    def requeue(self, seq: Sequence) -> None:
        """A preempted sequence from elsewhere (a decode engine): first in line, with what it generated."""
        seq.num_computed, seq.status = 0, Status.WAITING
        if self.by_priority:
            self._enqueue(seq)
        else:
            self.waiting.appendleft(seq)

    def abort(self, seq: Sequence, reason: str = "abort"):
        """End a sequence now (cancelled, or the engine stops); returns its last update."""
        if seq.status is Status.RUNNING:
            self._release(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = Status.FINISHED
        return seq.output.abort(reason)

    def drop(self, seq: Sequence) -> None:
        """End a sequence that failed (faults.py): its slot and pages free, and no last update made (its
        text may be what failed)."""
        if seq.status is Status.RUNNING:
            self._release(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = Status.FINISHED
        seq.output.finish_reason = seq.output.finish_reason or "error"

    @property
    def has_work(self) -> bool:
        """Something for the next step to compute (a prefill engine's sequences waiting to be
        handed over are not: they wait for the transfer queue)."""
        if self.role == "prefill":
            return bool(self.waiting) or any(s.remaining > 1 for s in self.running)
        return bool(self.waiting or self.running)

    @property
    def free_slots(self) -> int:
        return len(self._free_slots)

    def _release(self, seq: Sequence, swap: bool = False) -> None:
        self.running.remove(seq)
        if seq.adapter_slot >= 0:
            self.adapters.release(seq.adapter_slot)
            seq.adapter_slot = -1
        self.pool.free_sequence(seq.pages, swap=swap)
        heapq.heappush(self._free_slots, seq.slot)
        seq.slot, seq.state_restore = None, None

    def _preempt(self, seq: Sequence) -> None:
        if self._ahead:  # never preempt what a step in flight computes: decide once its results are in
            raise _NeedsResults
        self._release(seq, swap=self.role != "decode")  # (a decode engine has no prefix cache)
        seq.num_computed, seq.status, seq.preempted = 0, Status.WAITING, True
        if self.role == "decode":  # a decode engine never prefills: a prefill engine recomputes it
            seq.pages = PageTable()
            self.evicted.append(seq)
        elif self.by_priority:
            self._enqueue(seq)
        else:
            self.waiting.appendleft(seq)
        self.num_preemptions += 1

    # ------------------------------------------------------------ hand-over (disaggregated serving)
    def ready_for_handover(self) -> list[Sequence]:
        """Prefill role: running sequences whose prompt is computed (one token left: their last)."""
        return [s for s in self.running if s.remaining == 1]

    def detach(self, seq: Sequence) -> None:
        """Prefill role: the sequence leaves for a decode engine (its K/V already copied out); its
        slot and pages are free again (full pages stay in the prefix cache)."""
        self._release(seq)
        seq.pages, seq.status = PageTable(), Status.WAITING

    def attach(self, seq: Sequence) -> bool:
        """Decode role: a handed-over sequence takes a slot and pages for its tokens (its K/V are
        written into them next); False, changing nothing, while either is not free."""
        if not self._free_slots:
            return False
        slot = self._free_slots[0]
        self.pool.add_sequence(seq.pages, (), slot)  # no prefix-cache lookup: the prefill side has the cache
        if not self.pool.reserve(seq.pages, len(seq.tokens)):
            self.pool.free_sequence(seq.pages)
            return False
        heapq.heappop(self._free_slots)
        seq.mark_admitted(slot)
        self.running.append(seq)
        return True

    def pages_to_attach(self, seq: Sequence) -> int:
        """Pages `attach` would take for `seq` (0 for a dense pool: a slot owns its pages)."""
        return self.pool.pages_needed(PageTable(), len(seq.tokens))

    # ------------------------------------------------------------ planning
    def schedule(self, ahead: bool = False) -> StepPlan | None:
        """The next step's plan. ahead: a step is in flight whose tokens the host has not read (the
        overlapped loop, driver.py): its sequences count them as `pending` (their K/V computed) and
        decode rows are fed them on the device. None when such a plan needs the step's results
        first: it would preempt, or has nothing to compute without them."""
        self._ahead = ahead
        try:
            plan = self._plan()
        except _NeedsResults:
            return None
        finally:
            self._ahead = False
        return None if ahead and plan.empty else plan

    def can_plan_ahead(self, plan: StepPlan) -> bool:
        """Whether the next step can be planned before `plan`'s tokens are read: not when one of its
        sequences is constrained (its next mask follows from that token), drafted (verification
        decides how many tokens it keeps) or would draft next (drafts come from its tokens)."""
        return not plan.drafts and all(seq.matcher is None and not self._speculates(seq) for seq in plan.sequences)

    def _speculates(self, seq: Sequence) -> bool:
        if self.config.recurrent_state and not self.config.draft_state_rows:  # (no draft states kept)
            return False
        k = seq.request.params.speculative_tokens
        return (self.config.speculative_tokens if k is None else k) > 0 and speculation.eligible(seq)

    def _plan(self) -> StepPlan:
        self._preempt_for_priority()
        decode = self._schedule_decodes()
        plan = StepPlan(decode)
        if self.role != "decode":
            self._schedule_chunks(plan)
        if self.config.prefill_first and plan.chunks:
            plan.decode = []  # decode rows wait until every admitted prompt is prefilled
        # (a prefill engine's sequences waiting for hand-over free their pages without help)
        # (a prompt whose image waits for its vision program to compile is not blocked on pages; looked
        # at only when the step is empty)
        blocked = [s for s in self.running if (self.role != "prefill" or s.remaining > 1)
                   and not waits_for_program(s, self.media)] if plan.empty else []
        if len(blocked) > 1:
            # every running prompt waits for pages the others hold: recompute the newest later
            self._preempt(max(blocked, key=self._rank) if self.by_priority else blocked[-1])
            return self._plan()
        if not plan.chunks and decode:
            self._speculate(plan)
            if not self.waiting and not plan.drafts:
                plan.num_steps = self._decode_steps(decode)
        return plan

    def _speculate(self, plan: StepPlan) -> None:
        """Prompt-lookup drafts for greedy rows while the step stays small (speculation.py)."""
        room = min(self.config.speculative_rows, self.config.decode_rows[-1]) - len(plan.decode)
        if self.config.recurrent_state and (not self.config.draft_state_rows or any(
                seq.state_restore is not None and seq not in plan.decode for seq in self.running)):
            return  # (drafts would overwrite the draft states a sequence outside the plan resumes from)
        for seq in plan.decode:
            k = seq.request.params.speculative_tokens
            k = self.config.speculative_tokens if k is None else k
            k = min(k, room, seq.tokens_left - 1)
            if k <= 0 or seq.pending or not speculation.eligible(seq):
                continue
            drafts = speculation.propose(seq.tokens, k)
            if drafts and self.pool.reserve(seq.pages, len(seq.tokens) + len(drafts)):
                plan.drafts[seq] = drafts
                room -= len(drafts)

    def _schedule_decodes(self) -> list[Sequence]:
        """Running sequences with one token to compute; preempts the newest when pages run out.
        None on a prefill engine: such a sequence waits to be handed over."""
        decode: list[Sequence] = []
        if self.role == "prefill":
            return decode
        for seq in list(self.running):
            if seq.status is not Status.RUNNING or seq.remaining != 1 or seq.tokens_left <= 0:
                continue  # (no tokens left: the step in flight ends it)
            while not self.pool.reserve(seq.pages, seq.num_tokens):
                victim = self._victim()
                self._preempt(victim)
                if victim in decode:
                    decode.remove(victim)
                if victim is seq:
                    break
            else:
                decode.append(seq)
        return decode

    def _decode_steps(self, decode: list[Sequence]) -> int:
        """Steps one device call may run: bounded by what every row may still generate, by pages and by
        `decode_call_ms` (a call's tokens reach clients together, and a prompt arriving meanwhile waits
        for it and for the call planned behind it: 32 rows of the default model take ~55 ms a step on
        a 2-core machine, so 4 steps made 220 ms gaps in each stream). One step when a row is
        constrained (its next mask depends on the token the host has not seen) or samples its first
        token (a resent, fully cached prompt's first token streams after one step), or, where prompts
        join running decodes, its second (right after a prompt step more prompts of a burst are
        likely arriving, and they wait for less)."""
        fresh = 0 if self.config.prefill_first else 1
        if any(seq.matcher is not None or seq.num_generated <= fresh for seq in decode):
            return 1
        steps = self.decode_budget.steps(len(decode), min(self.config.decode_steps,
                                                          min(seq.tokens_left for seq in decode)))
        if steps > 1 and not all(self.pool.reserve(seq.pages, seq.num_tokens + steps - 1) for seq in decode):
            steps = 1  # pages already reserved stay with their sequences: they are used next steps
        return max(1, steps)

    def _prompt_candidates(self) -> list[Sequence]:
        """Running sequences still prefilling, then waiting ones that a free slot could take."""
        prefilling = [s for s in self.running if s.remaining > 1]
        return prefilling + list(self.waiting)[: len(self._free_slots)]

    def _choose_shape(self, candidates: list[Sequence]) -> tuple[int, int] | None:
        """The chunk shape that schedules the most prompt tokens among those it fills at least half
        (else among all); among equals the smallest (a step costs the tokens its shape holds), then
        the one of longer rows (fewer gathers). A waiting prompt needs what the prefix cache does not
        hold (a shared preamble: a few rows, not a whole 512-token row each), and one that will wait
        for a prefix in flight needs nothing yet."""
        needs = []
        for seq in candidates:
            if seq.status is Status.RUNNING:
                needs.append(seq.remaining)
            elif seq.prefix_waits < self.config.prefix_wait_steps and self.pool.inflight_pages(seq.tokens, seq.pages.root):
                continue
            else:
                needs.append(len(seq.tokens) - self.pool.cached_tokens(seq.tokens, seq.pages.root))
        best, best_key = None, None
        for rows, length in self.config.chunk_shapes:
            if self.shape_ready is not None and not self.shape_ready((rows, length)):
                continue  # still compiling in the background
            tokens, left = 0, rows
            for need in needs:
                if not left:
                    break
                used = min(left, -(-need // length))
                tokens, left = tokens + min(need, used * length), left - used
            # a shape at least half full beats any emptier one: one 130-token prompt takes the
            # 128-token shape and then 2 tokens (256 tokens' work) rather than a 512-token step
            key = (2 * tokens >= rows * length, tokens, -rows * length, length)
            if tokens and (best_key is None or key > best_key):
                best, best_key = (rows, length), key
        return best

    def _schedule_chunks(self, plan: StepPlan) -> None:
        candidates = self._prompt_candidates()
        shape = self._choose_shape(candidates) if candidates else None
        if shape is None:
            return
        rows, length = shape
        images = [self.config.prefill_tokens]  # image embeddings this step may still encode (a vision model)
        for seq in candidates:
            if len(plan.chunks) == rows:
                break
            if seq.status is Status.WAITING and self._waits_for_prefix(seq):
                continue  # its prefix is being computed: it needs no slot or pages yet
            if seq.status is Status.WAITING and not self._adapter_fits(seq):
                continue  # its adapter waits for a slot: sequences of the base or loaded adapters go on
            if seq.status is Status.WAITING and not self._admit(seq):
                break  # FIFO: nobody overtakes a prompt that does not fit yet
            if seq.remaining == 1:  # a cached or one-token prompt: its last token decodes
                if self.role != "prefill" and self.pool.reserve(seq.pages, seq.num_tokens):
                    plan.decode.append(seq)  # (a prefill engine hands it over with no step at all)
                continue
            want = min(seq.remaining, (rows - len(plan.chunks)) * length)
            whole = bool(seq.request.media) and self.media is not None and self.media.whole_images
            if seq.request.media:  # (a vision model: the step's image budget, engine/image_encoder.py)
                want = within_image_budget(seq, want, images, self.config.prefill_tokens, self.media)
                want = whole_images(seq, want) if whole else want
                if not want:
                    continue  # (admitted: its images come in a later step)
            got = self._fit_pages(seq, want)
            if whole and got < want:
                got = whole_images(seq, got)  # (pages ran out inside an image: it waits for the next step)
            start = seq.num_computed
            for offset in range(0, got, length):
                plan.chunks.append(ChunkRow(seq, start + offset, min(length, got - offset)))
            if got < want:
                break  # out of pages
        if plan.chunks:
            plan.chunk_shape = shape
            self._mark_snapshots(plan)

    def _mark_snapshots(self, plan: StepPlan) -> None:
        """Hybrid models' prefix cache (kv/state_snapshots.py): a sequence's first row after admission
        resumes from the snapshot its cached prefix ends at; a row ending on a page boundary leaves its
        states in a snapshot keyed by that page. Restored rows are released only after every save of
        the plan has its row, so no save in this step overwrites a snapshot the step reads."""
        snaps = getattr(self.pool, "snapshots", None)
        if snaps is None:
            return
        ps, restored = self.pool.page_size, []
        for chunk in plan.chunks:
            table = chunk.seq.pages
            if table.restore is not None:  # its first row (rows of a sequence are consecutive)
                chunk.restore, table.restore = table.restore, None
                restored.append(chunk.restore)
            end = chunk.start + chunk.length
            if end % ps or end > len(chunk.seq.tokens):
                continue
            table.chain = chain_to(chunk.seq.tokens, end // ps, ps, table.chain)
            chunk.save = snaps.row_to_save(table.chain[1])
        for row in restored:
            snaps.release(row)

    def _waits_for_prefix(self, seq: Sequence) -> bool:
        """A running sequence is computing pages of this prompt's prefix: wait for them to be
        committed (they are hits then) rather than compute them again; bounded, so it never starves."""
        if seq.prefix_waits >= self.config.prefix_wait_steps or not self.pool.inflight_pages(seq.tokens, seq.pages.root):
            return False
        seq.prefix_waits += 1
        self.num_prefix_waits += 1
        return True

    def _adapter_fits(self, seq: Sequence) -> bool:
        return seq.request.adapter is None or self.adapters.can_take(seq.request.adapter)

    def _admit(self, seq: Sequence) -> bool:
        if not self._free_slots:
            return False
        slot = self._free_slots[0]
        adapter = seq.request.adapter
        adapter_slot = -1 if adapter is None else self.adapters.acquire(adapter)
        if adapter_slot is None:
            return False  # every adapter slot is held by running sequences of other adapters
        cached = self.pool.add_sequence(seq.pages, seq.tokens, slot)
        # the first row must get its pages, unless nobody else could ever free pages for it
        first = min(len(seq.tokens) - cached, self.config.chunk_shapes[-1][1])
        if not self.pool.can_reserve(seq.pages, cached + first) and self.running:
            self.pool.free_sequence(seq.pages)
            if adapter_slot >= 0:
                self.adapters.release(adapter_slot)
            return False
        seq.adapter_slot = adapter_slot
        heapq.heappop(self._free_slots)
        self.waiting.remove(seq)
        if seq.preempted:
            hits = self.pool.last_hits
            self.num_swap_ins += (hits.get("host", 0) + hits.get("disk", 0)) // self.pool.page_size
        seq.num_computed = cached
        seq.mark_admitted(slot)
        self.running.append(seq)
        return True

    def _fit_pages(self, seq: Sequence, length: int) -> int:
        """Shrink a chunk to the pages that can be had now (whole pages beyond the table)."""
        if self.pool.reserve(seq.pages, seq.num_computed + length):
            return length
        have = len(seq.pages) + self.pool.num_free_pages
        length = min(length, have * self.pool.page_size - seq.num_computed)
        if length > 0 and self.pool.reserve(seq.pages, seq.num_computed + length):
            return length
        return 0

    def masks(self, plan: StepPlan) -> dict | None:
        """Packed allowed-token bits of every constrained sequence that samples in `plan`."""
        from ..structured.bitmask import allocate_bitmask
        from ..structured.matcher import fill_bitmasks

        sampling = [*plan.decode, *(c.seq for c in plan.chunks if c.samples)]
        constrained = [seq for seq in sampling if seq.matcher is not None]
        if not constrained:
            return None
        bits = allocate_bitmask(len(constrained), constrained[0].matcher.compiled.vocab_size)
        try:
            fill_bitmasks(bits, list(enumerate(seq.matcher for seq in constrained)))
        except Exception:  # one matcher's failure is its request's (faults.py): find which
            find_culprit(constrained, "filling its allowed-token mask",
                         lambda seq: fill_bitmasks(allocate_bitmask(1, seq.matcher.compiled.vocab_size),
                                                   [(0, seq.matcher)]))
            raise
        return {seq: bits[i] for i, seq in enumerate(constrained)}

    # ------------------------------------------------------------ results
    def advance(self, plan: StepPlan) -> None:
        """The plan is dispatched: its K/V count as computed and the tokens it samples as `pending`,
        so the next plan can be made before they are read (drafted rows wait for postprocess)."""
        if plan.dispatched:
            return
        plan.dispatched = True
        for seq in plan.decode:
            seq.state_restore = None  # (the step starts from it)
            if seq not in plan.drafts:
                seq.num_computed += plan.num_steps
                seq.pending += plan.num_steps
        for chunk in plan.chunks:
            chunk.seq.num_computed += chunk.length
            chunk.seq.pending += chunk.samples

    def postprocess(self, plan: StepPlan, out: HostStepOutput) -> list[tuple[Sequence, object]]:
        """Account a finished step: new tokens, text, finished sequences (freed), prefix-cache commits.
        A sequence that finished (or was cancelled) after the plan was made takes nothing from it:
        no token is emitted after a stop.

        Returns (sequence, ReturnSample) updates in row order; a finished sequence's is its last. A
        sequence whose text or grammar failed ends alone: its update is a RequestFailed (faults.py)."""
        self.advance(plan)
        new: dict[Sequence, list[int]] = {}
        logprobs: dict[Sequence, list] = {}

        def take(seq, k, row):
            seq.tokens.append(int(out.tokens[k][row]))
            new.setdefault(seq, []).append(seq.tokens[-1])
            if out.logprobs is not None:
                chosen, ids, values = out.logprobs
                logprobs.setdefault(seq, []).append((chosen[k][row], ids[k][row], values[k][row]))

        draft_row = len(plan.decode)
        for row, seq in enumerate(plan.decode):
            drafts = plan.drafts.get(seq)
            if seq.finished:
                draft_row += len(drafts or ())
                continue
            if drafts:  # the row's token, then one row per draft: keep what verification accepts
                rows = [row, *range(draft_row, draft_row + len(drafts))]
                draft_row += len(drafts)
                kept = speculation.accepted([int(out.tokens[0][r]) for r in rows], drafts)
                self.num_draft_tokens += len(drafts)
                self.num_accepted_tokens += len(kept) - 1
                if len(kept) == 1:
                    seq.speculate_after = len(seq.tokens) + speculation.BACKOFF_TOKENS
                elif self.config.draft_state_rows:  # its states after the last accepted draft (kv/recurrent.py)
                    seq.state_restore = rows[len(kept) - 1] - len(plan.decode)
                for r in rows[: len(kept)]:
                    seq.num_computed += 1
                    take(seq, 0, r)
                continue
            taken = 0
            for k in range(len(out.tokens)):
                if out.valid[k][row]:
                    taken += 1
                    take(seq, k, row)
            seq.pending -= plan.num_steps
            seq.num_computed -= plan.num_steps - taken  # the row ended early (it finishes below)
        for j, chunk in enumerate(plan.chunks):
            if chunk.seq.finished:
                continue
            if chunk.start + chunk.length == len(chunk.seq.tokens):  # the row samples (chunk.samples)
                take(chunk.seq, 0, out.chunk_offset + j)
                chunk.seq.pending -= 1
        updates = []
        for seq in plan.sequences:
            if seq.status is not Status.RUNNING:
                continue
            if self.role != "decode":  # the prefill side caches prefixes, also of a sequence finishing now
                self.pool.commit(seq.pages, seq.tokens, seq.num_computed)
            if seq in new:
                try:
                    sample = seq.output.add(new[seq], logprobs.get(seq))
                    if seq.matcher is not None and not seq.output.finished and self._grammar_done(seq, new[seq]):
                        sample = _joined(sample, seq.output.abort("stop"))  # the constrained output is complete
                except Exception as exc:  # noqa: BLE001: its text or grammar failed: this request ends alone
                    self.drop(seq)
                    updates.append((seq, SequenceFault(seq, "reading its new tokens", exc).failure()))
                    continue
                if seq.output.finished:
                    self._release(seq)
                    seq.status = Status.FINISHED
                if sample is not None:
                    updates.append((seq, sample))
        return updates

    @staticmethod
    def _grammar_done(seq: Sequence, tokens: list[int]) -> bool:
        """Feed new tokens to the sequence's grammar: True when it cannot go on (complete or failed)."""
        for token in tokens:
            if not seq.matcher.accept(token):
                return True
        return seq.matcher.is_finished

    # ------------------------------------------------------------ stats
    def slots_in_use(self) -> list[int]:
        return sorted(s.slot for s in self.running)

    def decoding(self) -> Seq[Sequence]:
        return [s for s in self.running if s.remaining == 1]


def _joined(first, last):
    """One update from two consecutive ones of the same sequence (the second ends it)."""
    if first is None:
        return last
    return dataclasses.replace(last, text=first.text + last.text, token_ids=first.token_ids + last.token_ids,
                               logprobs=(first.logprobs or []) + (last.logprobs or []) if first.logprobs else
                               last.logprobs)
