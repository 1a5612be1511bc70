"""Per-sequence output assembly: tokens in, ReturnSamples out.

The one place that decides a sequence is finished: an end token, a stop
string (through TextStream), max_tokens, or cancellation.
"""

from __future__ import annotations

import time
from typing import Sequence

from ..tokenizer.text_stream import TextStream
from .request import ActiveRequest, ReturnSample


class SequenceOutput:
    def __init__(self, request: ActiveRequest, processor):
        self.request = request
        self.stream = (TextStream(processor, request.params.stop, request.eos_token_ids,
                                  request.params.skip_special_tokens, request.prompt_ids)
                       if request.detokenize else None)
        self.stop_ids = set(request.eos_token_ids)
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None
        self.stop_reason = None
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.previous_update_at: float | None = None  # when the update before the last one came

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def text(self) -> str:
        return self.stream.text if self.stream else ""

    def add(self, tokens: Sequence[int], logprobs: Sequence | None = None) -> ReturnSample | None:
        """Consume this step's tokens; returns the update to send (None if nothing new).

        logprobs: per token (logprob, top_ids, top_values) when the request asked for them."""
        if self.finished:
            return None
        now = time.perf_counter()
        self.first_token_at = self.first_token_at or now
        self.previous_update_at, self.last_token_at = self.last_token_at, now
        new_ids: list[int] = []
        new_logprobs = []
        text = ""
        want = self.request.params.logprobs
        for i, token in enumerate(tokens):
            token = int(token)
            new_ids.append(token)
            if want is not None and logprobs is not None:
                chosen, top_ids, top_values = logprobs[i]
                new_logprobs.append({"token_id": token, "logprob": float(chosen),
                                     "top_logprobs": [(int(t), float(v)) for t, v in
                                                      zip(top_ids[:want], top_values[:want])]})
            self.token_ids.append(token)
            if self.stream is not None:
                text += self.stream.add([token])
                if self.stream.finished:
                    self.finish_reason, self.stop_reason = self.stream.finish_reason, self.stream.stop_reason
                    break
            elif token in self.stop_ids:
                self.finish_reason, self.stop_reason = "stop", token
                break
            if len(self.token_ids) >= self.request.max_new_tokens:
                self.finish_reason = "length"
                if self.stream is not None:
                    text += self.stream.finish("length")
                break
        return self._sample(text, new_ids, new_logprobs if want is not None else None)

    def abort(self, reason: str = "abort") -> ReturnSample:
        """End the sequence now (cancelled, or the driver is stopping)."""
        text = self.stream.finish(reason) if self.stream is not None and not self.stream.finished else ""
        self.finish_reason = self.finish_reason or reason
        return self._sample(text, [])

    def _sample(self, text: str, ids: list[int], logprobs=None) -> ReturnSample:
        elapsed = time.perf_counter() - self.request.submitted_at
        count = len(self.token_ids)
        return ReturnSample(
            text=text,
            token_ids=ids,
            accumulated_text=self.text,
            tokens_per_second=count / max(elapsed, 1e-9),
            num_generated_tokens=count,
            time_spent_computing=elapsed,
            finish_reason=self.finish_reason,
            index=self.request.index,
            prompt_tokens=len(self.request.prompt_ids),
            stop_reason=self.stop_reason,
            logprobs=logprobs,
        )
