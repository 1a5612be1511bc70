"""vInference's step methods (the seed's): `adjust_kwargs`, `execute_prefill`, `execute_decode`.

Called by: `vInference.generate` (which is built from them) and code written
against the seed's vInference that drives the steps itself. A SampleState
returned here carries its batch run, so each call advances that batch.
"""

from __future__ import annotations

import warnings

import numpy as np

_POSITIONAL = ("position_ids", "token_type_ids")  # derived by the engine from the prompts


class StepMixin:
    def adjust_kwargs(self, input_ids, attention_mask=None, **model_kwargs) -> dict:
        """Normalize a batch: -> {"prompts": one token-id list per row, left padding removed,
        "input_ids", "attention_mask"}. Position/type ids are derived, so they are ignored."""
        ids = np.asarray(input_ids)
        if ids.ndim == 1:
            ids = ids[None]
        if ids.ndim != 2:
            raise ValueError(f"input_ids must be (batch, length), got shape {ids.shape}")
        mask = np.ones_like(ids) if attention_mask is None else np.asarray(attention_mask).reshape(ids.shape)
        for name in model_kwargs:
            if name not in _POSITIONAL:
                warnings.warn(f"model kwarg {name!r} is not used by vsurge's models", stacklevel=2)
        prompts = [[int(t) for t in row[m.astype(bool)]] for row, m in zip(ids, mask)]
        if any(not p for p in prompts):
            raise ValueError("the prompt is empty")
        return {"prompts": prompts, "input_ids": ids, "attention_mask": mask}

    def start_state(self, rows, graphstate=None, graphother=None):
        """The SampleState before prefill: the prompts in place, nothing generated yet, the batch run
        attached (it starts at the first execute_prefill)."""
        run = BatchRun(self, rows, graphstate, graphother)
        longest = max(len(r.prompt_ids) for r in rows)
        padded = self._buckets.choose(len(rows), longest, self.model_prefill_length)[1]
        state = self.layout_state([r.prompt_ids for r in rows], [[] for _ in rows], padded, [False] * len(rows),
                                  0.0, [r.seed for r in rows])
        state.run = run
        return state

    def execute_prefill(self, state, *, graphstate=None, graphother=None, compile_config=None, sampling_params=None,
                        func=None):
        """Prefill the batch of `state` (every row gets its first token); `func`, when given, replaces
        the step. graphstate / graphother: the weights to run with from now on (None: keep those the
        run has, the model's own unless `generate` was given others). compile_config: the
        (batch_size, prefill_length) bucket(s) to run in, as `precompile` takes them: the smallest
        that holds the prompts (ValueError if none does). sampling_params: this batch's sampling
        from now on (see `BatchRun.set_params`)."""
        if func is not None:
            return func(state)
        run = self._run_of(state)
        run.update(graphstate, graphother, sampling_params)
        if run.gen is None:
            run.begin(compile_config)
        elif compile_config is not None:
            run.check_bucket(compile_config)
        while True:
            state = run.advance()
            if (state.generated_tokens_per_row > 0).all() or state.is_sequence_finished.all():
                return state

    def execute_decode(self, state, *, graphstate=None, graphother=None, compile_config=None, sampling_params=None,
                       func=None):
        """One decode call (`streaming_chunks` steps on the device) for the batch of `state`, with the
        weights and sampling given (as for execute_prefill). compile_config must name the bucket the
        batch was prefilled in (its KV cache lives there): ValueError otherwise."""
        if func is not None:
            return func(state)
        run = self._run_of(state)
        run.update(graphstate, graphother, sampling_params)
        if run.gen is None:
            raise ValueError("this batch was not prefilled yet: call execute_prefill first")
        if compile_config is not None:
            run.check_bucket(compile_config)
        return run.advance()

    @staticmethod
    def _run_of(state) -> "BatchRun":
        if getattr(state, "run", None) is None:
            raise ValueError("this SampleState has no batch run: start one with vInference.generate")
        return state.run

    def layout_state(self, prompts, generated, padded_length: int, finished, elapsed: float, seeds):
        """A SampleState in the seed's layout: row b of `sequences` (B, padded_length + max_new_tokens)
        holds its prompt left-padded to end at `padded_length`, then its generated tokens; the rest is
        pad_token_id. So `sequences[:, padded_length:]` are the generated tokens."""
        from .state import SampleState

        cap = self.generation_config.max_new_tokens
        pad = self.generation_config.pad_token_id or 0
        b = len(prompts)
        sequences = np.full((b, padded_length + cap), pad, np.int32)
        prompt_lengths = np.asarray([len(p) for p in prompts], np.int32)
        counts = np.asarray([min(len(g), cap) for g in generated], np.int32)
        for i, (prompt, gen) in enumerate(zip(prompts, generated)):
            kept = prompt[-padded_length:] if len(prompt) > padded_length else prompt
            sequences[i, padded_length - len(kept): padded_length] = kept
            sequences[i, padded_length: padded_length + counts[i]] = gen[:cap]
        running = [[g[-1] if g else p[-1]] for p, g in zip(prompts, generated)]
        return SampleState(
            sequences=sequences, current_length=prompt_lengths + counts, running_token=np.asarray(running, np.int32),
            is_sequence_finished=np.asarray(finished, bool), generated_tokens=int(counts.max(initial=0)),
            tokens_per_second=float(counts.sum()) / max(elapsed, 1e-9) if elapsed else 0.0,
            padded_length=padded_length, generated_tokens_per_row=counts, prompt_lengths=prompt_lengths,
            prng_key=np.asarray([[seed >> 32 & 0xFFFFFFFF, seed & 0xFFFFFFFF] for seed in seeds], np.uint32))


class BatchRun:
    """One batch that execute_prefill / execute_decode advance: its rows, the weights it runs with
    (read at every step, so a call may swap them), its bucket and its generator of snapshots."""

    def __init__(self, inference, rows, graphstate=None, graphother=None):
        self.inference, self.rows = inference, list(rows)
        self.graphstate, self.graphother = graphstate, graphother
        self.bucket_key: tuple[int, int] | None = None
        self.seqs: list = []  # the engine sequences, once the run started
        self.gen = None

    def update(self, graphstate, graphother, sampling_params) -> None:
        if graphstate is not None:
            self.graphstate = graphstate
        if graphother is not None:
            self.graphother = graphother
        if sampling_params is not None:
            self.set_params(sampling_params)

    def set_params(self, sampling_params) -> None:
        """Sample every row from now on with `sampling_params` (a SamplingParams or a dict): its
        temperature, top_p, top_k, min_p, penalties and logit_bias at the next step, and its
        max_tokens (capped by max_new_tokens) when given. A row's seed, stop strings, structured
        output and n stay as the batch started (they are fixed when its rows are made)."""
        from ...sampling.params import SamplingParams

        from ...engine.validation import fit_vocabulary

        params = fit_vocabulary(SamplingParams.coerce(sampling_params), self.inference.model.config.vocab_size)
        cap = self.inference.generation_config.max_new_tokens
        if params.max_tokens is not None and params.max_tokens > cap:
            raise ValueError(f"max_tokens ({params.max_tokens}) exceeds this vInference's max_new_tokens ({cap})")
        for request in self.rows:
            request.params = params
            if params.max_tokens is not None:
                request.max_new_tokens = params.max_tokens
        for seq in self.seqs:
            if not seq.finished and seq.slot is not None:
                seq.needs_setup = True  # the next step loads the slot's new sampling state

    def begin(self, compile_config=None) -> None:
        slots = None
        if compile_config is not None:
            self.bucket_key = self._bucket_in(compile_config)
            slots = self.bucket_key[0]
        self.gen = self.inference.run_rows(self.rows, slots=slots, run=self, bucket_key=self.bucket_key)

    def _bucket_in(self, compile_config) -> tuple[int, int]:
        longest = max(len(r.prompt_ids) for r in self.rows)
        combos = [c for c in compile_config.combinations() if c[1] >= longest]
        if not combos:
            raise ValueError(f"no bucket of {compile_config} holds a {longest}-token prompt")
        roomy = [c for c in combos if c[0] >= len(self.rows)]
        # the smallest bucket with a slot per row, else the most slots (the other rows wait for one)
        return min(roomy, key=lambda c: (c[0] * c[1], c)) if roomy else max(combos, key=lambda c: (c[0], -c[1]))

    def check_bucket(self, compile_config) -> None:
        if self.bucket_key is not None and self.bucket_key not in compile_config.combinations():
            raise ValueError(f"this batch runs in bucket (batch, prefill_length) = {self.bucket_key}, where its KV "
                             f"cache is; compile_config {compile_config} does not include it")

    def advance(self):
        try:
            snapshot, _ = next(self.gen)
        except StopIteration:
            raise ValueError("the batch of this SampleState has finished") from None
        snapshot.run = self
        return snapshot
