"""What the server hands a request that names a LoRA adapter as its `model`: the adapter's base vSurge,
generating with that adapter."""

from __future__ import annotations


class AdaptedSurge:
    """A vSurge seen through one of its adapters: everything is the base's but `submit`, which generates
    with the adapter, and `encode` (embeddings, prompt scores), which the adapters do not serve yet."""

    def __init__(self, surge, adapter_name: str):
        self.base = surge
        self.adapter_name = adapter_name

    def __getattr__(self, item):
        return getattr(self.base, item)

    def submit(self, prompt_ids, params, detokenize: bool = True, metadata: dict | None = None, adapter=None):
        return self.base.submit(prompt_ids, params, detokenize, metadata, adapter=self.adapter_name)

    async def encode(self, prompts, kind: str = "embed"):
        raise ValueError(f"{'embeddings' if kind == 'embed' else 'prompt logprobs'} are not served for LoRA adapters "
                         f"yet: ask the base model for them")
