"""The seed's two drivers, vDriver (dense engines) and oDriver (a paged engine): the Driver of
engine/driver.py behind the seed's constructor signatures, which sort the engines given into replicas
(interleaved serving) or prefill and decode sets (disaggregated serving)."""

from __future__ import annotations

import warnings

from ..engine.metrics import EngineMetrics
from ..engine.disaggregated import TRANSFER_BACKLOG
from ..engine.driver import Driver
from .base_classes import AbstractDriver


def _check_blocks(detokenizing_blocks) -> None:
    """The seed's detokenizing_blocks is the most decode results that may wait for its detokenize
    thread (EasyDeL: "max size for the detokenize backlog"). Here each engine's thread detokenizes a
    step's result itself, while the device runs the next step, so at most one result ever waits: the
    backlog the seed bounds does not exist, and no value changes anything (docs/seed_api.md)."""
    if not isinstance(detokenizing_blocks, int) or detokenizing_blocks < 1:
        raise ValueError(f"detokenizing_blocks must be a positive integer, got {detokenizing_blocks!r}")
    if detokenizing_blocks != 8:
        warnings.warn(f"detokenizing_blocks={detokenizing_blocks} has no effect: it bounds the seed's backlog of "
                      f"results waiting for detokenization, and vsurge's engine threads detokenize each step's "
                      f"result themselves, so at most one waits (docs/seed_api.md)", stacklevel=3)


class vDriver(Driver, AbstractDriver):  # noqa: N801 (the seed's name)
    """The seed's dense driver.

    * `prefill_engines` and `decode_engines` the same engines (or one of them None), or
      `interleaved_mode=True`: every engine is a replica (data parallel) that prefills its prompts
      inside its own steps (chunked prefill, beside its decode rows).
    * Different engines (typically on different device groups): disaggregated serving. Prompts
      are computed by the prefill engines only, each finished prefix (K/V, first token, sampling
      state) moves to the decode engine with the most free slots, and decode engines run decode
      steps only (engine/disaggregated.py). `transfer_backlog` bounds the prefixes waiting per
      prefill engine (the seed's 4)."""

    def __init__(self, prefill_engines=None, decode_engines=None, interleaved_mode: bool = False,
                 detokenizing_blocks: int = 8, max_queue: int | None = None, metrics: EngineMetrics | None = None,
                 transfer_backlog: int = TRANSFER_BACKLOG):
        engines, decode = _engine_sets(prefill_engines, decode_engines, interleaved_mode, "vDriver")
        _check_blocks(detokenizing_blocks)
        super().__init__(engines, max_queue, metrics, decode_engines=decode, transfer_backlog=transfer_backlog)
        self.detokenizing_blocks = detokenizing_blocks


class oDriver(Driver, AbstractDriver):  # noqa: N801 (the seed's name)
    """The seed's paged driver: one oEngine (or a list: one per data-parallel replica), or separate
    `prefill_engines` and `decode_engines` for disaggregated serving, as vDriver takes them."""

    def __init__(self, engine=None, detokenizing_blocks: int = 8, max_queue: int | None = None,
                 metrics: EngineMetrics | None = None, prefill_engines=None, decode_engines=None,
                 interleaved_mode: bool = False, transfer_backlog: int = TRANSFER_BACKLOG):
        _check_blocks(detokenizing_blocks)
        if engine is not None and (prefill_engines is not None or decode_engines is not None):
            raise ValueError("give oDriver either `engine` or `prefill_engines` / `decode_engines`, not both")
        if engine is not None:
            engines, decode = _as_list(engine), None
        else:
            engines, decode = _engine_sets(prefill_engines, decode_engines, interleaved_mode, "oDriver")
        super().__init__(engines, max_queue, metrics, decode_engines=decode, transfer_backlog=transfer_backlog)
        self.detokenizing_blocks = detokenizing_blocks

    @property
    def engine(self):
        return self.primary_engine


def _as_list(engines) -> list:
    if engines is None:
        return []
    return list(engines) if isinstance(engines, (list, tuple)) else [engines]


def _engine_sets(prefill_engines, decode_engines, interleaved_mode: bool, name: str):
    """(replicas, None) for interleaved serving, (prefill engines, decode engines) for disaggregated."""
    prefill, decode = _as_list(prefill_engines), _as_list(decode_engines)
    if not prefill and not decode:
        raise ValueError(f"{name} needs at least one engine")
    same = {id(e) for e in prefill} == {id(e) for e in decode}
    if interleaved_mode or not prefill or not decode or same:
        return list({id(e): e for e in decode + prefill}.values()), None
    shared = [e for e in prefill if any(e is d for d in decode)]
    if shared:
        raise ValueError(f"{name}: an engine cannot be both a prefill and a decode engine when they differ "
                         f"({len(shared)} engine(s) in both lists); give disjoint lists for disaggregated "
                         f"serving, or interleaved_mode=True to let every engine prefill and decode")
    return prefill, decode


__all__ = ["oDriver", "vDriver"]
