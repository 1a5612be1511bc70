"""The one request validator: a prompt and its SamplingParams against an engine's limits.

vSurge, vInference and the HTTP server all call `prepare_requests`, so every
entry point refuses the same inputs with the same messages (vLLM's wording,
which OpenAI clients already handle).
"""

from __future__ import annotations

from ..structured.errors import ParamError
from .engine_config import EOS_WIDTH
from .request import ActiveRequest, ReturnChannel


def check_lengths(prompt_tokens: int, max_tokens: int, *, max_length: int, max_prompt_length: int) -> None:
    if prompt_tokens == 0:
        raise ValueError("the prompt is empty")
    if prompt_tokens > max_prompt_length:
        raise ValueError(f"the prompt has {prompt_tokens} tokens, more than the {max_prompt_length} "
                         f"this engine accepts")
    if prompt_tokens + max_tokens > max_length:
        raise ValueError(
            f"This model's maximum context length is {max_length} tokens. However, you requested "
            f"{max_tokens} output tokens and your prompt contains {prompt_tokens} input tokens, "
            f"for a total of {prompt_tokens + max_tokens} tokens.")


def check_prompt(engine, prompt_ids) -> list[int]:
    """A prompt that a whole-prompt pass (embeddings, prompt logprobs) can take: tokens, length, vocabulary."""
    prompt_ids = list(prompt_ids)
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt_ids):
        raise TypeError("the prompt must be a list of token ids (int)")
    if not prompt_ids:
        raise ValueError("the prompt is empty")
    if len(prompt_ids) > engine.max_prompt_length:
        raise ValueError(f"the prompt has {len(prompt_ids)} tokens, more than the {engine.max_prompt_length} "
                         f"this engine accepts")
    bad = [t for t in prompt_ids if not 0 <= t < engine.vocab_size]
    if bad:
        raise ValueError(f"token id {bad[0]} is out of range for the vocabulary of size {engine.vocab_size}")
    return prompt_ids


def fit_vocabulary(params, vocab: int):
    """`params` against the model's vocabulary: token ids it names must be in it (ParamError naming the
    field), and a top_k that reaches the vocabulary is "off" (the same tokens, without the filter's sort)."""
    for name, ids in (("logit_bias", params.logit_bias or {}), ("stop_token_ids", params.stop_token_ids or ())):
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ParamError(f"{name} token id {bad} is out of range for the vocabulary of size {vocab}", name)
    return params.replace(top_k=0) if params.top_k >= vocab else params


def prepare_requests(engine, prompt_ids, params, channel: ReturnChannel, detokenize: bool = True,
                     max_tokens_cap: int | None = None, adapter=None) -> list[ActiveRequest]:
    """Validate one prompt and expand it into `params.n` ActiveRequests sharing `channel`.

    prompt_ids: token ids, or a MultimodalPrompt (multimodal/media.py: ids and images). max_tokens_cap:
    the most new tokens allowed (default: what the context leaves). adapter: a LoRA adapter registered
    with the engine (lora/slots.py), or None."""
    media, cache_ids = tuple(getattr(prompt_ids, "media", ())), None
    rope, rope_delta = getattr(prompt_ids, "rope", None), int(getattr(prompt_ids, "rope_delta", 0))
    if media:
        if not getattr(engine, "accepts_images", False):
            raise ParamError("image inputs are not supported by this model", "messages")
        if adapter is not None:
            raise ParamError("LoRA adapters do not take images yet", "model")
        cache_ids = prompt_ids.cache_ids()
        step = getattr(getattr(engine, "config", None), "prefill_tokens", None)
        big = [item.num_tokens for item in media if step and item.num_tokens > step]
        if big and engine.media.whole_images:  # (each image is computed in one step)
            raise ParamError(f"an image of {big[0]} tokens is more than the {step} prompt tokens one step computes "
                             "(raise --prefill-tokens)", "messages")
    prompt_ids = list(getattr(prompt_ids, "ids", prompt_ids))
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt_ids):
        raise TypeError("the prompt must be a list of token ids (int)")
    room = engine.max_length - len(prompt_ids)
    max_tokens = params.max_tokens if params.max_tokens is not None else min(room, max_tokens_cap or room)
    if max_tokens_cap is not None and max_tokens > max_tokens_cap:
        raise ValueError(f"max_tokens ({max_tokens}) exceeds this engine's limit of {max_tokens_cap} new tokens")
    check_lengths(len(prompt_ids), max_tokens, max_length=engine.max_length,
                  max_prompt_length=engine.max_prompt_length)
    vocab = engine.vocab_size
    bad = [t for t in prompt_ids if not 0 <= t < vocab]
    if bad:
        raise ValueError(f"token id {bad[0]} is out of range for the vocabulary of size {vocab}")
    params = fit_vocabulary(params, vocab)
    policy = getattr(getattr(engine, "config", None), "scheduling_policy", "fcfs")
    if params.priority != 0 and policy != "priority":
        raise ParamError(f"priority {params.priority} needs priority scheduling (`vsurge serve --scheduling-policy "
                         f"priority`; this engine schedules {policy})", "priority")
    eos = params.eos_ids(engine.eos_token_ids)
    if len(eos) > EOS_WIDTH:
        raise ValueError(f"at most {EOS_WIDTH} stop token ids (eos included) are supported, got {len(eos)}")
    base = params.seed if params.seed is not None else engine.new_seed()
    if adapter is not None and getattr(engine, "adapters", None) is None:
        raise ValueError("this engine serves no LoRA adapters (start it with --max-loras or --lora)")
    return [ActiveRequest(prompt_ids, params, base + i, max_tokens, eos, channel, index=i, detokenize=detokenize,
                          adapter=adapter, media=media, cache_ids=cache_ids, rope_positions=rope,
                          rope_delta=rope_delta) for i in range(params.n)]
