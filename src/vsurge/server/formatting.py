"""OpenAI response and stream-chunk bodies built from ReturnSamples."""

from __future__ import annotations

import json
import time
import uuid


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def sse(data) -> str:
    """One server-sent event: `data: {json}\\n\\n`."""
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class Formatter:
    """Builds bodies for one response (fixed id, created time and model name)."""

    def __init__(self, kind: str, model: str, processor):
        self.kind = kind  # "chat" | "completion"
        self.model = model
        self.processor = processor
        self.id = new_id("chatcmpl" if kind == "chat" else "cmpl")
        self.created = int(time.time())

    def _token_text(self, token_id: int) -> str:
        return self.processor.decode([token_id])

    # ------------------------------------------------------------ logprobs
    def chat_logprobs(self, entries) -> dict | None:
        """OpenAI's choice.logprobs: `content` (per token) and `refusal` (always null: no refusals here)."""
        if entries is None:
            return None
        content = []
        for e in entries:
            text = self._token_text(e["token_id"])
            content.append({"token": text, "logprob": e["logprob"], "bytes": list(text.encode("utf-8")),
                            "top_logprobs": [{"token": self._token_text(t), "logprob": v,
                                              "bytes": list(self._token_text(t).encode("utf-8"))}
                                             for t, v in e["top_logprobs"]]})
        return {"content": content, "refusal": None}

    def completion_logprobs(self, entries, offset: int = 0) -> dict | None:
        if entries is None:
            return None
        tokens, offsets, position = [], [], offset
        for e in entries:
            text = self._token_text(e["token_id"])
            tokens.append(text)
            offsets.append(position)
            position += len(text)
        return {"tokens": tokens, "token_logprobs": [e["logprob"] for e in entries],
                "top_logprobs": [None if e["top_logprobs"] is None else {self._token_text(t): v for t, v in
                                                                         e["top_logprobs"]} for e in entries],
                "text_offset": offsets}

    # ------------------------------------------------------------ prompt logprobs (engine/encode.py scores)
    def prompt_entries(self, ids: list[int], scores, k: int) -> list[dict]:
        """A prompt's tokens as logprob entries (the first has none), for echo + logprobs."""
        out = [{"token_id": ids[0], "logprob": None, "top_logprobs": None}]
        for t in range(1, len(ids)):
            top = [(int(i), float(v)) for i, v in zip(scores.top_ids[t - 1][:k], scores.top_logprobs[t - 1][:k])]
            out.append({"token_id": ids[t], "logprob": float(scores.logprobs[t - 1]), "top_logprobs": top})
        return out

    def prompt_logprobs(self, ids: list[int], scores, k: int) -> list:
        """vLLM's prompt_logprobs: per prompt token {token id: {logprob, rank, decoded_token}} of the
        token itself and the k likeliest there; None for the first token."""
        out: list = [None]
        for t in range(1, len(ids)):
            entry = {str(ids[t]): {"logprob": float(scores.logprobs[t - 1]), "rank": int(scores.ranks[t - 1]),
                                   "decoded_token": self._token_text(ids[t])}}
            for rank, (i, v) in enumerate(zip(scores.top_ids[t - 1][:k], scores.top_logprobs[t - 1][:k]), 1):
                entry.setdefault(str(int(i)), {"logprob": float(v), "rank": rank,
                                               "decoded_token": self._token_text(int(i))})
            out.append(entry)
        return out

    # ------------------------------------------------------------ whole responses
    def response(self, choices: list[dict], prompt_tokens: int, completion_tokens: int) -> dict:
        obj = "chat.completion" if self.kind == "chat" else "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices,
                "usage": usage(prompt_tokens, completion_tokens)}

    def choice(self, index: int, text: str | None, finish_reason: str | None, logprobs,
               tool_calls: list[dict] | None = None, reasoning: str | None = None,
               prompt_logprobs: list | None = None) -> dict:
        if self.kind == "chat":
            message = {"role": "assistant", "content": text, "refusal": None}  # OpenAI always sends refusal
            if reasoning is not None:
                message["reasoning_content"] = reasoning
            if tool_calls:
                message["tool_calls"] = tool_calls
            return {"index": index, "message": message, "logprobs": self.chat_logprobs(logprobs),
                    "finish_reason": finish_reason}
        return {"index": index, "text": text, "logprobs": self.completion_logprobs(logprobs),
                "finish_reason": finish_reason, **({"prompt_logprobs": prompt_logprobs} if prompt_logprobs else {})}

    # ------------------------------------------------------------ stream chunks
    def chunk(self, index: int, text: str | None, finish_reason: str | None = None, logprobs=None,
              role: bool = False, text_offset: int = 0, tool_calls: list[dict] | None = None,
              reasoning: str | None = None, prompt_logprobs: list | None = None) -> dict:
        if self.kind == "chat":
            delta: dict = {}
            if role:
                delta["role"] = "assistant"
            if reasoning is not None:
                delta["reasoning_content"] = reasoning
            if text is not None:
                delta["content"] = text
            if tool_calls:
                delta["tool_calls"] = tool_calls
            choice = {"index": index, "delta": delta, "logprobs": self.chat_logprobs(logprobs),
                      "finish_reason": finish_reason}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": index, "text": text or "", "logprobs": self.completion_logprobs(logprobs, text_offset),
                      "finish_reason": finish_reason}
            if prompt_logprobs:
                choice["prompt_logprobs"] = prompt_logprobs
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": [choice]}

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict:
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": [],
                "usage": usage(prompt_tokens, completion_tokens)}
