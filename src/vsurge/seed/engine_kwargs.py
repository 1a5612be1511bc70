"""The one place where the seed's engine keyword arguments become an EngineConfig.

Called by: vEngine / oEngine (seed/engines.py) and vSurge.create_vdriver /
create_odriver (seed/vsurge_api.py). vsurge's own code (the CLI, the server,
`vSurge.from_config`) builds an EngineConfig directly.
"""

from __future__ import annotations

import warnings

from ..engine.engine_config import EngineConfig

# the seed's keywords that size an engine (EngineConfig.from_seed_kwargs maps them)
SEED_ENGINE_KWARGS = ("max_concurrent_decodes", "max_concurrent_prefill", "prefill_lengths", "max_prefill_length",
                      "max_length", "seed")


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
    return EngineConfig.from_seed_kwargs(context=model.config.max_position_embeddings, **kwargs)
