"""Disaggregated serving on 6 CPU devices, run in a subprocess by test_disaggregated.py.

    XLA_FLAGS=--xla_force_host_platform_device_count=6 python tests/disaggregated_checks.py engines MODEL

Prefill engines tensor-parallel over devices 0-2, decode engines over 3-5, dense and
paged, against the colocated (interleaved) engine and the one-device Generator; a hybrid
model's (`hybrid MODEL`) over 0-1 and 2-3, against the one-device Generator.
Prints one JSON line `RESULT {...}` that the test asserts on.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402

import vsurge  # noqa: E402
from vsurge import EngineConfig, SamplingParams, vSurge  # noqa: E402
from dense_generator import greedy_generate  # noqa: E402

# small programs: 4 slots, 32-token prompt rows (two per step), 32-token pages, 128-token context
CONFIG = EngineConfig(max_slots=4, max_length=128, prefill_tokens=64, chunk_lengths=(32,), row_buckets=(4,),
                      page_size=32, num_pages=16, decode_steps=4)
MAX_TOKENS = 10


def prompts_of(processor) -> list[list[int]]:
    texts = ["Hello", "Hello there", "The capital of France", "1 2 3 4", "Once upon a time in a land far away",
             "A long prompt that takes several prefill steps: " + "the quick brown fox jumps over it " * 8]
    return [processor.encode(t) for t in texts]


def generate(surge, prompts) -> list[list[int]]:
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    return [r.token_ids for r in asyncio.run(surge.generate(prompts, params))]


def devices_of(arrays) -> list[int]:
    return sorted({d.id for a in jax.tree.leaves(arrays) for d in a.sharding.device_set})


def check_engines(path):
    model, processor = vsurge.load(path, dtype="float32", progress=False)
    prompts = prompts_of(processor)
    assert len(prompts[0]) == 1  # a one-token prompt: nothing to prefill, the decode engine computes it
    texts = [processor.decode(p) for p in prompts]
    result = {"reference": [greedy_generate(model, ids, MAX_TOKENS) for ids in prompts]}
    colocated = vSurge.create_odriver(model, processor, config=CONFIG, tensor_parallel_size=3)
    colocated.compile()
    colocated.start()
    result["colocated"] = generate(colocated, texts)
    colocated.stop(5)
    for kind in ("dense", "paged"):
        make = vSurge.create_vdriver if kind == "dense" else vSurge.create_odriver
        surge = make(model, processor, config=CONFIG, prefill_devices="0-2", decode_devices="3-5")
        surge.compile()
        surge.start()
        out = {"tokens": generate(surge, texts)}
        prefill_replica, decode_replica = surge.driver.replicas
        steps = surge.metrics.value("vsurge:engine_steps_total", role="prefill")
        # the long prompt again: its full pages are in the prefill engine's prefix cache
        out["again"] = generate(surge, [texts[-1]])[0]
        out["prefill_steps_again"] = surge.metrics.value("vsurge:engine_steps_total", role="prefill") - steps
        m = surge.metrics
        out.update(transfers=m.value("vsurge:kv_transfer_seconds_count"),
                   prefill_steps=m.value("vsurge:engine_steps_total", role="prefill"),
                   decode_steps=m.value("vsurge:engine_steps_total", role="decode"),
                   both_steps=m.value("vsurge:engine_steps_total", role="both"),
                   prefix_hits=m.value("vsurge:prefix_cache_hits_total"),
                   roles=[r.role for r in surge.driver.replicas],
                   programs={r.role: sorted({key[0] for key in r.engine._compiled}) for r in surge.driver.replicas})
        surge.stop(5)
        # where the engines' KV pages live (each thread leaves its last state when it stops), and
        # where a prefix exported on the prefill mesh lands after receive_prefix
        out["prefill_kv_devices"] = devices_of(prefill_replica.state.kv.k + prefill_replica.state.kv.v)
        out["decode_kv_devices"] = devices_of(decode_replica.state.kv.k + decode_replica.state.kv.v)
        out["decode_kv_specs"] = sorted({str(a.sharding.spec) for a in decode_replica.state.kv.k})
        prefix = moved_prefix(prefill_replica, decode_replica)
        out["prefix_devices"] = [devices_of(p.pages) for p in prefix]
        out["prefix_spec"] = str(decode_replica.engine.get_prefix_destination_sharding().spec)
        result[kind] = out
    print("RESULT " + json.dumps(result), flush=True)


def moved_prefix(prefill_replica, decode_replica):
    """A one-page prefix exported from the prefill engine's state, and the same after receive_prefix."""
    from vsurge.engine.request import ActiveRequest, ReturnChannel
    from vsurge.engine.sequence import Sequence

    engine, scheduler = prefill_replica.engine, prefill_replica.engine.new_scheduler()
    request = ActiveRequest([1, 2, 3], SamplingParams(max_tokens=2), 0, 2, [], ReturnChannel())
    seq = Sequence.of(request, engine.processor)
    scheduler.add(seq)
    scheduler.schedule()  # admitted: a slot and a page
    seq.num_computed = 2
    exported = engine.export_prefix(prefill_replica.state, seq)
    return exported, decode_replica.engine.receive_prefix(exported)


def check_hybrid(path):
    """A hybrid model (recurrent states beside KV pages): prefill over devices 0-1, decode over 2-3, both
    engines; each sequence's states travel with its pages."""
    model, processor = vsurge.load(path, dtype="float32", progress=False)
    prompts = prompts_of(processor)
    result = {"reference": [greedy_generate(model, ids, MAX_TOKENS) for ids in prompts]}
    texts = [processor.decode(p) for p in prompts]
    for kind in ("dense", "paged"):
        make = vSurge.create_vdriver if kind == "dense" else vSurge.create_odriver
        surge = make(model, processor, config=CONFIG, prefill_devices="0-1", decode_devices="2-3")
        surge.compile()
        surge.start()
        out = {"tokens": generate(surge, texts), "roles": [r.role for r in surge.driver.replicas],
               "programs": {r.role: sorted({"/".join(map(str, key[:2])) for key in r.engine._compiled
                                            if key[0].startswith("state_")}) for r in surge.driver.replicas},
               "transfers": surge.metrics.value("vsurge:kv_transfer_seconds_count")}
        decode_replica = surge.driver.replicas[1]
        surge.stop(5)
        out["decode_state_devices"] = devices_of(decode_replica.state.kv.states)
        result[kind] = out
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    checks = {"engines": check_engines, "hybrid": check_hybrid}
    checks[sys.argv[1]](*sys.argv[2:])
