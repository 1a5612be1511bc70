"""Shared piece of the LoRA engine tests (test_lora.py, and scale_checks.py in its own process): run
requests, each with its adapter, at once on a started vSurge and collect their tokens."""

from __future__ import annotations

import asyncio


def generate_with_adapters(surge, jobs) -> list[list[int]]:
    """jobs: [(prompt ids, SamplingParams, adapter name or None)] submitted together -> each one's token ids."""
    async def one(prompt, params, adapter):
        tokens = []
        async for samples in surge.submit(prompt, params, detokenize=False, adapter=adapter).updates():
            tokens += samples[0].token_ids
        return tokens

    async def all_jobs():
        return await asyncio.gather(*(one(*job) for job in jobs))

    return asyncio.run(all_jobs())
