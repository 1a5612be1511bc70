"""The pieces of scaling that need no second device: layouts, axis rules, messages, replica metrics."""

from __future__ import annotations

import numpy as np
import pytest

from vsurge.config import ModelConfig
from vsurge.scale.multihost import decode, encode
from vsurge.engine.metrics import EngineMetrics
from vsurge.models.parts.fused import fuse_qkv_rows, replicate_kv_groups, split_gate_up, unfuse_qkv
from vsurge.server.stats import model_stats
from vsurge.hardware.sharding import partition_spec, tensor_parallel_config

CONFIG = ModelConfig("llama", vocab_size=64, hidden_size=8, intermediate_size=12, num_layers=1, num_heads=4,
                     num_kv_heads=2, head_dim=2)


def test_fused_qkv_groups_round_trip_and_kv_replication():
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(8, 3)), rng.normal(size=(4, 3)), rng.normal(size=(4, 3))  # HF rows (out, in)
    fused = fuse_qkv_rows(q, k, v, CONFIG).T  # (in, cols): [q0 q1 k0 v0 | q2 q3 k1 v1]
    back = unfuse_qkv(fused, CONFIG)
    for got, want in zip(back, (q, k, v)):
        np.testing.assert_array_equal(got.T, want)
    # 2 KV heads -> 4: each group of 2 query heads splits into 2 groups of 1, each with a copy of its KV head
    wide = replicate_kv_groups(fused, CONFIG, 2)
    q4, k4, v4 = unfuse_qkv(wide, CONFIG.replace(num_kv_heads=4))
    np.testing.assert_array_equal(q4, fused[:, np.r_[0:4, 8:12]])  # query heads keep their order
    np.testing.assert_array_equal(k4.T, np.repeat(k.reshape(2, 2, 3), 2, axis=0).reshape(8, 3))
    np.testing.assert_array_equal(v4.T, np.repeat(v.reshape(2, 2, 3), 2, axis=0).reshape(8, 3))
    # the loader's shard reader builds the same columns straight from the HF rows
    np.testing.assert_array_equal(fuse_qkv_rows(q, k, v, CONFIG, kv_replicas=2).T, wide)


def test_gate_up_interleaving_splits_back():
    gate_up = np.arange(12).reshape(1, 12)  # gate f at 2f, up f at 2f + 1
    gate, up = split_gate_up(gate_up)
    assert gate.tolist() == [[0, 2, 4, 6, 8, 10]] and up.tolist() == [[1, 3, 5, 7, 9, 11]]


def test_tensor_parallel_config_replicates_kv_heads_or_says_why_not():
    assert tensor_parallel_config(CONFIG, 2).num_kv_heads == 2
    assert tensor_parallel_config(CONFIG, 4).num_kv_heads == 4
    default = CONFIG.replace(num_heads=9, num_kv_heads=3, intermediate_size=18)
    assert tensor_parallel_config(default, 3).num_kv_heads == 3
    assert tensor_parallel_config(default, 9).num_kv_heads == 9
    with pytest.raises(ValueError, match="must divide the model's 9 attention heads"):
        tensor_parallel_config(default, 2)
    with pytest.raises(ValueError, match="intermediate size 12"):
        tensor_parallel_config(CONFIG.replace(num_heads=8, num_kv_heads=8), 8)


def test_partition_spec_drops_axes_the_mesh_lacks_or_that_do_not_divide():
    class FakeMesh:
        shape = {"data": 2, "model": 4}

    assert partition_spec(("embed", "kv_heads"), FakeMesh()) == partition_spec((None, "kv_heads"))
    assert tuple(partition_spec(("vocab", "embed"), FakeMesh(), shape=(49154, 8))) == (None, None)  # 4 ∤ 49154
    assert tuple(partition_spec(("vocab", "embed"), FakeMesh(), shape=(49152, 8))) == ("model", None)
    assert tuple(partition_spec(("heads", "kv_heads"), FakeMesh())) == ("model", None)  # a mesh axis once

    class ModelOnly:
        shape = {"model": 2}

    assert tuple(partition_spec(("batch", "kv_heads"), ModelOnly())) == (None, "model")


def test_step_messages_round_trip_and_repeated_values_travel_as_one():
    tables = np.arange(12, dtype=np.int32).reshape(3, 4)
    bitmask = np.full((32, 1536), -1, np.int32)  # the all-allowed mask: 196 KB as an array
    leaves = [tables, bitmask, np.int32(7), np.asarray(True), np.zeros(3, np.float32), np.uint32(2**32 - 1)]
    data = encode(("decode", 32, 4), leaves)
    assert len(data) < 1000
    key, back = decode(data)
    assert key == ("decode", 32, 4)
    for got, want in zip(back, leaves):
        want = np.asarray(want)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_replica_metrics_carry_their_label_and_add_up_in_stats():
    metrics = EngineMetrics("m")
    one, two = metrics.for_replica(0), metrics.for_replica(1)
    assert one is metrics and metrics.for_replica(1) is two
    one.request_finished("stop", 10, 4, 1.0)
    two.request_finished("stop", 20, 6, 1.0)
    two.request_finished("length", 5, 8, 1.0)
    assert metrics.value("vsurge:generation_tokens_total") == 18
    assert metrics.value("vsurge:generation_tokens_total", replica=1) == 14
    assert 'replica="1"' in metrics.exposition().decode()

    class Surge:
        ready, max_length = True, 128

        def __init__(self, m):
            self.metrics = m

    stats = model_stats("m", Surge(metrics), [Surge(m) for m in metrics.replica_metrics()])
    assert [r.id for r in stats.replicas] == [0, 1]
    assert [r.finished_total for r in stats.replicas] == [1, 2] and stats.finished_total == 3
    assert stats.generation_tokens == 18 and stats.finished == {"length": 1, "stop": 2}


def test_one_follower_loop_replays_every_program_kind_and_hands_the_rest_to_handlers():
    """scale/multihost.follow_engine (the one follower loop, remote.py's too): each call rebuilds its host
    inputs from the program table (engine/program_kinds.py) and runs the engine's own program."""
    from vsurge.engine.program_kinds import PROGRAMS
    from vsurge.scale.multihost import STOP, follow_engine

    calls = []

    class Batches:
        def slot_arrays_spec(self):
            return (np.zeros(2), np.zeros(3))

        def decode_spec(self, rows, window, dynamic):
            return {"tokens": np.zeros(rows), "pages": np.zeros(window)}

    class Config:
        def dynamic_window(self, window):
            return False

    class Engine:
        graphstate, graphother, batches, config = "gs", "go", Batches(), Config()
        _compiled = {("init",): lambda: calls.append("init") or "s0",
                     ("set_slot",): lambda state, a, b: calls.append(("set_slot", state, a.shape, b.shape)) or "s1",
                     ("decode", 2, 4): lambda gs, go, state, batch: (calls.append(
                         ("decode", gs, go, state, sorted(batch))) or "s2", "out")}

    messages = iter([(("init",), []), (("set_slot",), [np.ones(2), np.ones(3)]),
                     (("decode", 2, 4), [np.ones(4), np.ones(2)]), (("note",), [7]), (STOP, [])])

    class Channel:
        def receive(self):
            return next(messages)

    follow_engine(Engine(), Channel(), {"note": lambda state, key, leaves: calls.append(("note", state)) or state})
    assert calls == ["init", ("set_slot", "s0", (2,), (3,)), ("decode", "gs", "go", "s1", ["pages", "tokens"]),
                     ("note", "s2")]
    assert {"init", "set_slot", "decode", "mixed", "export", "import", "copy", "embed", "score"} <= set(PROGRAMS)
    assert [k for k, kind in PROGRAMS.items() if kind.replayed] == ["init", "set_slot", "decode", "mixed"]
