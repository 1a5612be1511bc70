"""What XLA:CPU makes of the engine's programs with bfloat16 weights and float32 activations: no
program may compute a whole (V, D) table from a weight (it did, every decode call: a float32 copy
for the embedding lookup and the tied output head, ~30 ms per call on the default model; then a
uint16 copy of the embedding hoisted out of the decode loop, ~16 ms)."""

from __future__ import annotations

import re

import vsurge
from vsurge import vEngine
from tiny_models import VOCAB, write_tiny_model


def test_decode_never_converts_the_embedding_table(tmp_path, default_processor_dir):
    write_tiny_model("llama_tied_mha", tmp_path, default_processor_dir)
    model, processor = vsurge.load(tmp_path, dtype="bfloat16", progress=False)
    assert model.param_dtype.name == "bfloat16" and model.dtype.name == "float32"
    assert hasattr(model, "lm_head")  # the tied head got its (D, V) copy for the native bf16 dot
    engine = vEngine(model, processor, max_concurrent_decodes=4, max_length=64, prefill_lengths=[16])
    key = next(k for k in engine.buckets() if k[0] == "decode")
    hlo = engine._program(key).as_text()
    hidden = model.config.hidden_size
    table = re.compile(rf"= \w+\[({VOCAB},{hidden}|{hidden},{VOCAB})\]")  # an instruction yielding a table
    free = (" parameter(", " get-tuple-element(", " bitcast(")  # views of the weight, no work
    converted = [line for line in hlo.splitlines() if table.search(line) and not any(f in line for f in free)]
    assert not converted, converted[:3]


def test_compile_log_names_the_slowest_programs_and_their_phases(tmp_path, default_processor_dir, caplog):
    """A slow start-up says which program took the time and in which phase (the TPU's 25 programs took 110 s
    cold and 42 s from the cache with nothing saying where)."""
    import logging

    write_tiny_model("llama_tied_mha", tmp_path, default_processor_dir)
    model, processor = vsurge.load(tmp_path, dtype="float32", progress=False)
    engine = vEngine(model, processor, max_concurrent_decodes=4, max_length=64, prefill_lengths=[16])
    with caplog.at_level(logging.INFO, logger="vsurge.engine.core"):
        engine.compile(progress=False)
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("compiled "))
    count = len(engine.buckets())
    assert line.startswith(f"compiled {count} programs in ")
    assert re.search(r"slowest: \w+ \(.*\) [\d.]+ s( cached)? \((trace [\d.]+, )?.*xla [\d.]+", line), line
