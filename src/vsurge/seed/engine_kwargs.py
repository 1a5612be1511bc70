"""The one place where the seed's engine keyword arguments become an EngineConfig.

Called by: vEngine / oEngine (seed/engines.py) and vSurge.create_vdriver /
create_odriver (seed/vsurge_api.py). vsurge's own code (the CLI, the server,
`vSurge.from_config`) builds an EngineConfig directly.
"""

from __future__ import annotations

import warnings

from ..engine.engine_config import EngineConfig

# the seed's keywords that size an engine (from_seed_kwargs maps them)
SEED_ENGINE_KWARGS = ("max_concurrent_decodes", "max_concurrent_prefill", "prefill_lengths", "max_prefill_length",
                      "max_length", "seed")


def from_seed_kwargs(*, max_concurrent_decodes=None, max_concurrent_prefill=None, prefill_lengths=None,
                     max_prefill_length=None, max_length=None, seed=894, context: int | None = None,
                     **rest) -> EngineConfig:
    """The seed's engine keyword arguments (and any further EngineConfig fields in `rest`) -> EngineConfig.
    `context` caps max_length (the model's)."""
    if isinstance(prefill_lengths, int):
        prefill_lengths = [prefill_lengths]
    values = dict(max_slots=int(max_concurrent_decodes or 0) or None, max_length=max_length,
                  seed=seed, max_prompt_length=max_prefill_length or None, chunk_lengths=prefill_lengths or None,
                  max_prefill_rows=int(max_concurrent_prefill or 0) or None)
    values.update(rest)
    return EngineConfig.fitted(context, **{k: v for k, v in values.items() if v is not None})


def engine_config(model, config: EngineConfig | None = None, *, batch_size: int | None = None, manager=None,
                  stacklevel: int = 3, **kwargs) -> EngineConfig:
    """`config` when given, else the seed's keyword arguments (and any further EngineConfig fields,
    e.g. decode_steps or page_size) as an EngineConfig for `model` (max_length capped at its context).

    batch_size: the seed's, accepted and unused (a step's rows are max_concurrent_decodes slots).
    manager: an HBMPageManager the engine will use: its page size and page count win."""
    if batch_size is not None:
        warnings.warn("batch_size has no effect: the step's rows are max_concurrent_decodes slots",
                      stacklevel=stacklevel)
    if config is not None:
        return config
    if manager is not None:
        kwargs.update(page_size=manager.page_size, num_pages=manager.num_pages)
    return from_seed_kwargs(context=model.config.max_position_embeddings, **kwargs)
