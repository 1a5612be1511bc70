"""/v1/stats' builder on a real EngineMetrics registry (no server): percentiles from buckets, replicas add up."""

from __future__ import annotations

import math

import pytest

from vsurge.engine.metrics import EngineMetrics
from vsurge.server.stats import ModelStats, EngineSnapshot, bucket_quantile, histogram_stats, model_stats


class FakeSurge:
    """What model_stats reads from a vSurge: its metrics, readiness and context length."""

    def __init__(self, metrics, ready=True, max_length=512):
        self.metrics, self.ready, self.max_length = metrics, ready, max_length


def busy_metrics(name="m") -> EngineMetrics:
    m = EngineMetrics(name)
    for seconds in (0.02, 0.03, 0.2, 0.4, 3.0):
        m.first_token(seconds)
    m.inter_token(0.07, count=10)
    m.request_finished("stop", 30, 8, 1.0)
    m.request_finished("length", 40, 16, 2.0)
    m.request_failed()
    m.set_running(3)
    m.set_waiting(2)
    m.set_kv_usage(0.25)
    m.preempted(2)
    m.prefix_cache(100, 40)
    m.speculated(12, 5)
    m.kv_tiers({"snapshots_saved": 4, "snapshots_to_host": 1}, 0)
    return m


def test_bucket_quantile_interpolates_like_prometheus():
    buckets = [(0.1, 0.0), (0.5, 10.0), (1.0, 20.0), (math.inf, 20.0)]
    assert bucket_quantile(0.5, buckets) == pytest.approx(0.5)       # rank 10: the top of the second bucket
    assert bucket_quantile(0.25, buckets) == pytest.approx(0.3)      # rank 5: half-way through (0.1, 0.5]
    assert bucket_quantile(0.75, buckets) == pytest.approx(0.75)
    assert bucket_quantile(0.5, [(0.1, 0.0), (math.inf, 4.0)]) == 0.1  # only +Inf: the highest finite bound
    assert bucket_quantile(0.5, [(0.1, 0.0), (math.inf, 0.0)]) is None
    assert bucket_quantile(0.5, []) is None
    assert bucket_quantile(0.5, [(0.1, 2.0), (math.inf, 2.0)]) == pytest.approx(0.05)  # first bucket starts at 0


def test_model_stats_reads_every_series():
    m = busy_metrics()
    stats = model_stats("m", FakeSurge(m), [FakeSurge(m)])
    assert isinstance(stats, ModelStats)
    assert (stats.name, stats.ready, stats.max_model_len) == ("m", True, 512)
    assert (stats.running, stats.waiting, stats.kv_cache_usage) == (3, 2, 0.25)
    assert (stats.prompt_tokens, stats.generation_tokens) == (70, 24)
    assert stats.finished == {"length": 1, "stop": 1} and stats.finished_total == 2 and stats.failures == 1
    assert (stats.preemptions, stats.prefix_cache_queries, stats.prefix_cache_hits) == (2, 100, 40)
    assert stats.prefix_cache_hit_rate == pytest.approx(0.4)
    assert (stats.spec_draft_tokens, stats.spec_accepted_tokens) == (12, 5)
    assert stats.state_snapshots == {"saved": 4, "to_host": 1}
    assert stats.streamed_tokens == 5 + 10  # first tokens + inter-token gaps: every token produced so far
    ttft = stats.ttft
    assert ttft.count == 5 and ttft.sum == pytest.approx(3.65) and ttft.mean == pytest.approx(0.73)
    assert len(ttft.bucket_counts) == len(ttft.bucket_bounds) + 1 and ttft.bucket_counts[-1] == 5
    assert 0.1 < ttft.p50 <= 0.25 and ttft.p50 <= ttft.p90 <= ttft.p99 <= 5.0  # 3rd of 5 lies in (0.1, 0.25]
    assert stats.itl.p50 == pytest.approx(0.075) and stats.e2e.count == 2
    assert stats.queue_time.count == 0 and stats.queue_time.p50 is None
    assert stats.step_wait_time.count == 0 and stats.prefill_time.count == 0


def test_the_first_token_trace_splits_the_time_to_first_token():
    """arrival 1.0 -> admitted 1.25 -> the first step computing the prompt begins 1.5 -> first token 2.0:
    queue 0.25, step wait 0.25, prefill 0.5; a prompt admitted after its step began (not traced) waits 0."""
    m = EngineMetrics("m")
    m.first_token_trace(1.0, 1.25, 1.5, 2.0)
    m.first_token_trace(1.0, 1.5, 1.25, 2.0)
    stats = model_stats("m", FakeSurge(m), [FakeSurge(m)])
    assert stats.queue_time.sum == pytest.approx(0.75) and stats.queue_time.count == 2
    assert stats.step_wait_time.sum == pytest.approx(0.25)
    assert stats.prefill_time.sum == pytest.approx(0.5 + 0.5)
    text = m.exposition().decode()
    assert 'vsurge:request_step_wait_time_seconds_count{model_name="m",replica="0"} 2.0' in text
    assert 'vsurge:request_prefill_time_seconds_sum{model_name="m",replica="0"} 1.0' in text
    assert [r.id for r in stats.replicas] == [0]
    assert stats.replicas[0].role == "both"
    assert stats.replicas[0].model_dump(exclude={"id", "role"}) == stats.model_dump(
        exclude={"name", "ready", "programs_compiling", "max_model_len", "weight_bytes", "kv_cache_bytes",
                 "kv_cache_pages", "state_cache_bytes", "replicas"})
    assert (stats.weight_bytes, stats.kv_cache_bytes, stats.kv_cache_pages, stats.state_cache_bytes) == (0, 0, 0, 0)


def test_an_idle_engine_reports_zeros_and_nulls():
    stats = model_stats("idle", FakeSurge(EngineMetrics("idle"), ready=False), [FakeSurge(EngineMetrics("idle"))])
    assert not stats.ready and stats.running == 0 and stats.finished == {} and stats.streamed_tokens == 0
    assert stats.kv_cache_usage is None and stats.prefix_cache_hit_rate is None  # never reported: null, not 0
    assert stats.ttft.count == 0 and stats.ttft.p99 is None and stats.ttft.bucket_counts == []


def test_replicas_add_up():
    one, two = busy_metrics("m"), busy_metrics("m")
    two.set_kv_usage(0.75)
    two.request_finished("abort", 5, 1, 0.5)
    total = EngineSnapshot.read(one).add(EngineSnapshot.read(two)).fields()
    assert total["running"] == 6 and total["prompt_tokens"] == 145 and total["spec_draft_tokens"] == 24
    assert total["state_snapshots"] == {"saved": 8, "to_host": 2}
    assert total["finished"] == {"abort": 1, "length": 2, "stop": 2}
    assert total["kv_cache_usage"] == pytest.approx(0.5)  # mean over replicas
    assert total["ttft"].count == 10 and total["ttft"].bucket_counts == [2 * c for c in
                                                                        EngineSnapshot.read(one).fields()["ttft"].bucket_counts]


def test_histogram_stats_from_no_buckets():
    empty = histogram_stats([], 0.0)
    assert empty.count == 0 and empty.mean is None and empty.bucket_bounds == []


def test_a_disaggregated_model_reports_roles_steps_and_hand_overs():
    metrics = EngineMetrics("m")
    prefill, decode = metrics.for_replica(0, "prefill"), metrics.for_replica(1, "decode")
    for _ in range(3):
        prefill.engine_step()
    for _ in range(7):
        decode.engine_step()
    for seconds in (0.002, 0.004):
        decode.kv_transfer(seconds)
    metrics.set_transfer_queue_depth(2)

    class Replica:
        def __init__(self, m):
            self.metrics = m

    stats = model_stats("m", FakeSurge(metrics), [Replica(m) for m in metrics.replica_metrics()])
    assert [(r.id, r.role) for r in stats.replicas] == [(0, "prefill"), (1, "decode")]
    assert stats.steps == {"decode": 7, "prefill": 3}
    assert stats.replicas[0].steps == {"prefill": 3} and stats.replicas[1].steps == {"decode": 7}
    assert stats.kv_transfer.count == 2 and stats.kv_transfer.sum == pytest.approx(0.006)
    assert stats.replicas[1].kv_transfer.count == 2 and stats.replicas[0].kv_transfer.count == 0
    assert stats.kv_transfer_queue_depth == 2
    assert metrics.value("vsurge:engine_steps_total") == 10
