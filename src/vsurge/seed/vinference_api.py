"""vInference's seed step methods: `adjust_kwargs`, `execute_prefill`, `execute_decode`.

Called by: `vInference.generate` (which is built from them) and code written
against the seed's vInference that drives the steps itself. A SampleState
returned here carries its batch run, so each call advances that batch.
"""

from __future__ import annotations

import warnings

import numpy as np

_POSITIONAL = ("position_ids", "token_type_ids")  # derived by the engine from the prompts


class vInferenceSeedAPI:  # noqa: N801
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
        """The SampleState before prefill: nothing generated yet, the batch run attached."""
        from ..vinference.state import SampleState

        run = self.run_rows(rows, graphstate, graphother)
        b = len(rows)
        lengths = np.asarray([len(r.prompt_ids) for r in rows], np.int32)
        state = SampleState(sequences=np.zeros((b, self.generation_config.max_new_tokens), np.int32),
                            current_length=lengths, running_token=np.asarray([[r.prompt_ids[-1]] for r in rows]),
                            is_sequence_finished=np.zeros(b, bool), generated_tokens=0, tokens_per_second=0.0,
                            padded_length=0, generated_tokens_per_row=np.zeros(b, np.int32), prompt_lengths=lengths)
        state.run = run
        return state

    def execute_prefill(self, state, *, graphstate=None, graphother=None, compile_config=None, sampling_params=None,
                        func=None):
        """Prefill the batch of `state` (every row gets its first token). `func`, when given, replaces
        the step; `compile_config`, `sampling_params` and the weights were fixed when the run started."""
        if func is not None:
            return func(state)
        while True:
            state = self._advance(state)
            if (state.generated_tokens_per_row > 0).all() or state.is_sequence_finished.all():
                return state

    def execute_decode(self, state, *, graphstate=None, graphother=None, compile_config=None, sampling_params=None,
                       func=None):
        """One decode call (`streaming_chunks` steps on the device) for the batch of `state`."""
        if func is not None:
            return func(state)
        return self._advance(state)

    def _advance(self, state):
        if state.run is None:
            raise ValueError("this SampleState has no batch run: start one with vInference.generate")
        try:
            snapshot, _ = next(state.run)
        except StopIteration:
            raise ValueError("the batch of this SampleState has finished") from None
        snapshot.run = state.run
        return snapshot
