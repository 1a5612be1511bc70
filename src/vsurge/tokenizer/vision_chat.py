"""A vision-language model's chat prompt text: messages whose content is a string, or a list of
{"type": "text", "text"} and {"type": "image"} parts (more keys are ignored), rendered with its
template and the tokenizer's image placeholder. multimodal/chat.py adds the images themselves."""

from __future__ import annotations

from .chat_template import ChatTemplateError


def image_parts(messages: list[dict]) -> list[dict]:
    return [part for m in messages if isinstance(m.get("content"), list)
            for part in m["content"] if isinstance(part, dict) and part.get("type") == "image"]


def _inline(messages: list[dict], placeholder: str) -> list[dict]:
    """Contents as strings with the placeholder where each image was (templates that print content)."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(placeholder if p.get("type") == "image" else p.get("text", "") for p in content)
        out.append({**m, "content": content})
    return out


def _texts(content) -> list[str]:
    if isinstance(content, str):
        return [content] if content else []
    return [p["text"] for p in content or () if isinstance(p, dict) and p.get("type") == "text" and p.get("text")]


def render_text(processor, messages: list[dict], tools=None, variables: dict | None = None) -> str:
    """The template with contents as parts (a vision template writes its placeholder per image part, and
    reads text from parts only: SmolVLM's prints nothing of a string), else (its output lacks the images
    or the texts) with the placeholders inlined in the text. With no images too: a vision-language
    model's every chat prompt is rendered here."""
    placeholder = processor.images.placeholder
    kwargs = dict(variables or {})
    if tools is not None:
        kwargs["tools"] = tools
    texts = [t for m in messages for t in _texts(m.get("content"))]
    try:
        text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                             content_parts=True, **kwargs)
        if text.count(placeholder) == len(image_parts(messages)) and all(t in text for t in texts):
            return text
    except ChatTemplateError:
        pass
    return processor.apply_chat_template(_inline(messages, placeholder), tokenize=False, add_generation_prompt=True,
                                         **kwargs)
