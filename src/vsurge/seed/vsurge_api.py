"""The seed's `vSurge`: vsurge's own API (`vsurge.vsurge.Surge`) with the seed's methods, the constructors
`create_vdriver` / `create_odriver` and the helpers for callers that buffer and merge streamed samples
themselves.

Called by: code written against the seed's `vSurge` (EasyDeL). The constructors map the seed's
keywords onto an EngineConfig (seed/engine_kwargs.py) and build the seed's engines and drivers
through `vSurge.from_config`, which vsurge's own code (CLI, server) calls with an EngineConfig.
The seed buffered samples ending in a partial UTF-8 byte token before detokenizing; vsurge's
own streams never need that: `ReturnSample.text` only ever holds whole characters
(tokenizer/detokenize.py holds incomplete bytes back).
"""

from __future__ import annotations

import re

from ..vsurge import Surge

_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>$")


# vSurge.from_config's deployment keywords; every other keyword of create_vdriver / create_odriver
# beyond the seed's is an EngineConfig field (e.g. decode_steps, speculative_tokens)
_DEPLOYMENT = ("vsurge_name", "max_queue", "interleaved_mode", "tensor_parallel_size", "data_parallel_size", "mesh",
               "prefill_devices", "decode_devices", "prefill_tensor_parallel_size", "transfer_backlog")


def _split(kwargs: dict) -> tuple[dict, dict]:
    """(vSurge.from_config's keywords, EngineConfig fields)."""
    return ({k: v for k, v in kwargs.items() if k in _DEPLOYMENT},
            {k: v for k, v in kwargs.items() if k not in _DEPLOYMENT})


class vSurgeSeedAPI:  # noqa: N801
    processor: object

    @classmethod
    def create_vdriver(cls, model, processor, max_concurrent_decodes: int | None = None,
                       prefill_lengths: list[int] | None = None, max_prefill_length: int | None = None,
                       max_length: int | None = None, seed: int = 894, vsurge_name: str | None = None,
                       detokenizing_blocks: int = 8, config=None, **kwargs):
        """The seed's constructor: dense vEngines (a fixed run of KV pages per slot) driven by a vDriver.

        The seed's keyword arguments map onto an EngineConfig (`config` replaces them). Further
        keywords: vSurge.from_config's (tensor_parallel_size, data_parallel_size, mesh,
        prefill_devices, decode_devices, prefill_tensor_parallel_size, interleaved_mode, max_queue,
        transfer_backlog), else EngineConfig fields (max_concurrent_prefill, decode_steps, ...)."""
        from .drivers import vDriver
        from .engine_kwargs import engine_config
        from .engines import vEngine

        deployment, fields = _split(kwargs)
        config = engine_config(model, config, max_concurrent_decodes=max_concurrent_decodes,
                               prefill_lengths=prefill_lengths, max_prefill_length=max_prefill_length,
                               max_length=max_length, seed=seed, **fields)

        def make_driver(engines, decode):
            return vDriver(prefill_engines=engines, decode_engines=decode, detokenizing_blocks=detokenizing_blocks,
                           max_queue=deployment.get("max_queue"),
                           transfer_backlog=deployment.get("transfer_backlog", 4))

        return cls.from_config(model, processor, config, paged=False, vsurge_name=vsurge_name,
                               make_engine=lambda m, c: vEngine(m, processor, config=c), make_driver=make_driver,
                               **deployment)

    @classmethod
    def create_odriver(cls, model, processor, storage=None, manager=None, page_size: int = 128,
                       hbm_utilization: float = 0.6, max_concurrent_prefill: int | None = None,
                       max_concurrent_decodes: int | None = None, prefill_lengths: list[int] | None = None,
                       max_prefill_length: int | None = None, max_length: int | None = None, seed: int = 894,
                       vsurge_name: str | None = None, detokenizing_blocks: int = 8, config=None, **kwargs):
        """The seed's constructor: paged oEngines (pages on demand, prefix caching, preemption) driven
        by an oDriver. The page pool is `num_pages`, else `hbm_utilization` of the memory free after
        the weights; `storage` and `manager` serve one engine only. Further keywords: as for
        create_vdriver (the prefix cache of disaggregated serving lives on the prefill engines)."""
        from .drivers import oDriver
        from .engine_kwargs import engine_config
        from .engines import oEngine

        deployment, fields = _split(kwargs)
        config = engine_config(model, config, manager=manager, max_concurrent_decodes=max_concurrent_decodes,
                               max_concurrent_prefill=max_concurrent_prefill, prefill_lengths=prefill_lengths,
                               max_prefill_length=max_prefill_length, max_length=max_length, seed=seed,
                               page_size=page_size, hbm_utilization=hbm_utilization, **fields)
        built = []

        def make_engine(m, c):
            if (storage is not None or manager is not None) and built:
                raise ValueError("storage and manager serve one engine; with data_parallel_size > 1 or separate "
                                 "prefill and decode engines each engine builds its own page pool")
            built.append(oEngine(m, processor, storage=storage, manager=manager, config=c))
            return built[-1]

        def make_driver(engines, decode):
            return oDriver(prefill_engines=engines, decode_engines=decode, detokenizing_blocks=detokenizing_blocks,
                           max_queue=deployment.get("max_queue"),
                           transfer_backlog=deployment.get("transfer_backlog", 4))

        return cls.from_config(model, processor, config, paged=True, vsurge_name=vsurge_name,
                               make_engine=make_engine, make_driver=make_driver, **deployment)

    def should_buffer_response(self, response: list) -> bool:
        """True when a sample ends with a token that is only part of a UTF-8 character."""
        for sample in response:
            if not sample.token_ids:
                continue
            last = sample.token_ids[-1]
            piece = self.processor.decode([last], skip_special_tokens=False)
            tokens = getattr(self.processor, "convert_ids_to_tokens", None)
            name = tokens(last) if tokens else piece
            if "\ufffd" in piece or (isinstance(name, str) and _BYTE_TOKEN.search(name)):
                return True
        return False

    def process_client_side_tokenization_response(self, response: list) -> list:
        """Client-side tokenization: the samples go out as they are (token ids only)."""
        return response

    def process_server_side_tokenization_response(self, response: list, buffered_response_list: list) -> list:
        """Join each sample with its buffered predecessors -> per sample
        (text, all token ids, latest tokens_per_second, latest num_generated_tokens)."""
        out = []
        for i, sample in enumerate(response):
            parts = [buffered[i] for buffered in buffered_response_list if i < len(buffered)] + [sample]
            out.append(("".join(p.text for p in parts), [t for p in parts for t in p.token_ids],
                        sample.tokens_per_second, sample.num_generated_tokens))
        return out


class vSurge(Surge, vSurgeSeedAPI):  # noqa: N801 (the seed's name)
    """What `from vsurge import vSurge` gives: every method of vsurge's own API (Surge: from_config, generate,
    complete, chat, ...) and the seed's (create_vdriver, create_odriver and the response helpers)."""
