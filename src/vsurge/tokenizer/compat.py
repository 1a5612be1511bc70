"""Helpers that work on our Processor and on an HF tokenizer alike (users may pass either)."""

from __future__ import annotations

from .chat_template import normalize_messages
from .vision_chat import render_text


def chat_prompt_ids(processor, messages, tools: list[dict] | None = None, **variables) -> list[int]:
    """Token ids of `messages` rendered with the chat template, ready for generation.

    tools: OpenAI tool objects offered to the model (None: none); variables: more template
    variables (e.g. enable_thinking)."""
    return render_chat_prompt(processor, messages, tools, **variables)[1]


def render_chat_prompt(processor, messages, tools: list[dict] | None = None, **variables) -> tuple[str, list[int]]:
    """(text, token ids) of `messages` rendered with the chat template, ready for generation."""
    if getattr(processor, "images", None) is not None:  # a vision-language model's template reads parts
        text = render_text(processor, messages, tools, variables)
        return text, list(processor.encode(text, add_special_tokens=False))
    if tools is not None:
        variables["tools"] = tools
    text = processor.apply_chat_template(normalize_messages(messages), tokenize=False, add_generation_prompt=True,
                                         **variables)
    return text, list(processor.encode(text, add_special_tokens=False))


def text_prompt_ids(processor, text: str) -> list[int]:
    if not isinstance(text, str):
        raise TypeError(f"prompt must be a str, got {type(text).__name__}")
    return list(processor.encode(text))


def eos_token_ids(processor) -> list[int]:
    ids = getattr(processor, "eos_token_ids", None)
    if ids:
        return list(ids)
    eos = getattr(processor, "eos_token_id", None)
    return [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))


def pad_token_id(processor) -> int:
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(processor, name, None)
        if isinstance(value, int):
            return value
    return 0
