"""Chat messages holding images -> the prompt text (the template with its image placeholders,
tokenizer/vision_chat.py) and the MultimodalPrompt; the images' bytes come in the parts' order."""

from __future__ import annotations

from ..tokenizer.vision_chat import image_parts, render_text
from .media import MultimodalPrompt


def chat_prompt(processor, messages: list[dict], images: list[bytes], params: list[str] | None = None,
                tools=None, variables: dict | None = None) -> tuple[str, MultimodalPrompt]:
    """(prompt text, MultimodalPrompt) of messages with image parts; `images` their bytes in order (each
    part's "detail", if any, chooses its resolution). ImageError (a bad image), ChatTemplateError (the
    template refused the messages)."""
    text = render_text(processor, messages, tools, variables)
    details = [part.get("detail") for part in image_parts(messages)]
    return text, processor.images.prompt(text, images, params, details=details)
