"""Prometheus metrics, named like vLLM's under a `vsurge:` prefix.

Each model owns a CollectorRegistry (several models in one process must not
collide); the server exposes them all. Every series carries `model_name` and
`replica` labels: a model served by several data-parallel replicas records each
replica under its own label value (`for_replica`), and the model's totals are
their sum (`value`, /v1/stats, or `sum by (model_name)` in PromQL).

Disaggregated serving (engine/disaggregated.py) adds what its hand-over does:
`vsurge:kv_transfer_seconds` (one observation per prefix moved, under the
decode replica that received it), `vsurge:kv_transfer_queue_depth` (prefixes
between a prefill engine and their decode engine's step) and, for every
engine, `vsurge:engine_steps_total` with the engine's `role` (prefill, decode,
or both when it interleaves them).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_COMPILE_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
_TRANSFER_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class EngineMetrics:
    """Counters and histograms of one model; this object records under replica `replica`."""

    def __init__(self, model_name: str, registry: CollectorRegistry | None = None, replica: int = 0,
                 role: str = "both"):
        self.registry = registry or CollectorRegistry()
        self.model_name = model_name
        self.replica = replica
        self.role = role  # what this replica's engine computes: "both", "prefill" or "decode"
        self._views = {replica: self}  # replica index -> the object recording under it (shared)
        labels = ["model_name", "replica"]
        r = self.registry
        self._requests = Counter("vsurge:request_success", "Finished requests by finish reason",
                                 labels + ["finished_reason"], registry=r)
        self._failures = Counter("vsurge:request_failure", "Requests that failed with an error", labels, registry=r)
        self._prompt_tokens = Counter("vsurge:prompt_tokens", "Prompt tokens processed", labels, registry=r)
        self._generation_tokens = Counter("vsurge:generation_tokens", "Tokens generated", labels, registry=r)
        self._ttft = Histogram("vsurge:time_to_first_token_seconds", "Time to first token", labels,
                               buckets=_LATENCY_BUCKETS, registry=r)
        self._itl = Histogram("vsurge:inter_token_latency_seconds", "Time between tokens", labels,
                              buckets=_LATENCY_BUCKETS, registry=r)
        self._e2e = Histogram("vsurge:e2e_request_latency_seconds", "Request latency", labels,
                              buckets=_LATENCY_BUCKETS, registry=r)
        self._queue = Histogram("vsurge:request_queue_time_seconds", "Time waiting for a slot", labels,
                                buckets=_LATENCY_BUCKETS, registry=r)
        self._step_wait = Histogram("vsurge:request_step_wait_time_seconds",
                                    "Time from admission until the first step computing the prompt began (the "
                                    "step in flight finishing)", labels, buckets=_LATENCY_BUCKETS, registry=r)
        self._prefill = Histogram("vsurge:request_prefill_time_seconds",
                                  "Time from the first step computing the prompt to its first token",
                                  labels, buckets=_LATENCY_BUCKETS, registry=r)
        self._stage = Histogram("vsurge:stage_latency_seconds", "Device time per stage", labels + ["stage"],
                                buckets=_LATENCY_BUCKETS, registry=r)
        self._compile = Histogram("vsurge:compile_seconds", "Compilation time", labels,
                                  buckets=_COMPILE_BUCKETS, registry=r)
        self._running = Gauge("vsurge:num_requests_running", "Requests being generated", labels, registry=r)
        self._waiting = Gauge("vsurge:num_requests_waiting", "Requests waiting for a slot", labels, registry=r)
        self._kv_usage = Gauge("vsurge:kv_cache_usage_perc", "Fraction of KV cache in use", labels, registry=r)
        self._preemptions = Counter("vsurge:num_preemptions", "Preempted requests", labels, registry=r)
        self._prefix_queries = Counter("vsurge:prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
                                       labels, registry=r)
        self._prefix_hits = Counter("vsurge:prefix_cache_hits", "Prompt tokens found in the prefix cache",
                                    labels, registry=r)
        self._images_encoded = Counter("vsurge:images_encoded", "Images run through the vision tower", labels,
                                       registry=r)
        self._image_cache_hits = Counter("vsurge:image_cache_hits",
                                         "Images whose embeddings were found in the encoder cache", labels, registry=r)
        self._steps = Counter("vsurge:engine_steps", "Engine steps (device calls) by the engine's role",
                              labels + ["role"], registry=r)
        self._transfer = Histogram("vsurge:kv_transfer_seconds",
                                   "Time to move one prefix's KV pages to a decode engine's devices", labels,
                                   buckets=_TRANSFER_BUCKETS, registry=r)
        self._transfer_depth = Gauge("vsurge:kv_transfer_queue_depth",
                                     "Prefixes waiting between prefill and decode engines", labels, registry=r)
        self._tier_hits = Counter("vsurge:kv_tier_hits", "Prompt tokens found in each tier of the prefix cache",
                                  labels + ["tier"], registry=r)
        self._tier_pages = Counter("vsurge:kv_tier_pages", "KV pages copied between the prefix cache's tiers",
                                   labels + ["direction"], registry=r)
        self._tier_bytes = Counter("vsurge:kv_tier_bytes", "KV bytes copied between the prefix cache's tiers",
                                   labels + ["direction"], registry=r)
        self._swaps = Counter("vsurge:kv_swaps", "Pages of preempted sequences swapped out to the host tier, "
                              "and found there (or on disk) when they resumed", labels + ["direction"], registry=r)
        self._snapshots = Counter("vsurge:state_snapshots", "Hybrid models' recurrent-state snapshots (prefix cache) "
                                  "by event: saved, restored, to_host, from_tiers", labels + ["event"], registry=r)
        self._draft_tokens = Counter("vsurge:spec_decode_num_draft_tokens", "Speculative draft tokens verified",
                                     labels, registry=r)
        self._accepted_tokens = Counter("vsurge:spec_decode_num_accepted_tokens", "Of those, drafts accepted",
                                        labels, registry=r)

    def rename(self, model_name: str) -> None:
        """Label every later series with `model_name` (the served name), dropping series recorded
        under the old one (a server renames its models before they serve)."""
        if model_name == self.model_name:
            return
        for metric in vars(self).values():
            if isinstance(metric, MetricWrapperBase):
                metric.clear()
        for view in [self, *self._views.values()]:
            view.model_name = model_name

    def for_replica(self, index: int, role: str | None = None) -> "EngineMetrics":
        """The same series recorded under replica `index` (created on first use); `role`: what the
        replica's engine computes (its step counts carry it)."""
        if index not in self._views:
            view = object.__new__(EngineMetrics)
            view.__dict__.update(self.__dict__)
            view.replica = index
            self._views[index] = view
        if role is not None:
            self._views[index].role = role
        return self._views[index]

    def replica_metrics(self) -> list["EngineMetrics"]:
        """One object per replica that records here, by index."""
        return [self._views[i] for i in sorted(self._views)]

    @property
    def labels(self) -> dict[str, str]:
        """The label values this object records under."""
        return {"model_name": self.model_name, "replica": str(self.replica)}

    def _l(self, metric, **extra):
        return metric.labels(**self.labels, **extra)

    # -- recording
    def request_finished(self, finish_reason: str, prompt_tokens: int, generated_tokens: int, e2e: float):
        self._l(self._requests, finished_reason=finish_reason).inc()
        self._l(self._prompt_tokens).inc(prompt_tokens)
        self._l(self._generation_tokens).inc(generated_tokens)
        self._l(self._e2e).observe(e2e)

    def request_failed(self):
        self._l(self._failures).inc()

    def first_token(self, seconds: float):
        self._l(self._ttft).observe(seconds)

    def inter_token(self, seconds: float, count: int = 1):
        for _ in range(count):
            self._l(self._itl).observe(seconds)

    def first_token_trace(self, arrived: float, admitted: float, prefill_started: float, first_token: float):
        """One request's way to its first token, split: queue (arrival -> a slot), step wait (-> the
        first step computing its prompt begins), prefill (-> its first token is read)."""
        self._l(self._queue).observe(admitted - arrived)
        self._l(self._step_wait).observe(max(0.0, prefill_started - admitted))
        self._l(self._prefill).observe(first_token - max(prefill_started, admitted))

    def stage(self, name: str, seconds: float):
        self._l(self._stage, stage=name).observe(seconds)

    def compiled(self, seconds: float):
        self._l(self._compile).observe(seconds)

    def set_running(self, n: int):
        self._l(self._running).set(n)

    def set_waiting(self, n: int):
        self._l(self._waiting).set(n)

    def set_kv_usage(self, fraction: float):
        self._l(self._kv_usage).set(fraction)

    def preempted(self, n: int = 1):
        self._l(self._preemptions).inc(n)

    def prefix_cache(self, queried: int, hit: int):
        self._l(self._prefix_queries).inc(queried)
        self._l(self._prefix_hits).inc(hit)

    def images(self, encoded: int, hits: int):
        self._l(self._images_encoded).inc(encoded)
        self._l(self._image_cache_hits).inc(hits)

    def engine_step(self):
        self._l(self._steps, role=self.role).inc()

    def kv_transfer(self, seconds: float):
        self._l(self._transfer).observe(seconds)

    def kv_tiers(self, counts: dict[str, int], page_bytes: int):
        """Deltas of the page pool's tier counters (HBMPageManager.tier_counts, plus swap_ins)."""
        for name, n in counts.items():
            if name.startswith("hits_"):
                self._l(self._tier_hits, tier=name[5:]).inc(n)
            elif name.startswith("pages_"):
                self._l(self._tier_pages, direction=name[6:]).inc(n)
                self._l(self._tier_bytes, direction=name[6:]).inc(n * page_bytes)
            elif name in ("swap_outs", "swap_ins"):
                self._l(self._swaps, direction=name[5:-1]).inc(n)
            elif name.startswith("snapshots_"):
                self._l(self._snapshots, event=name[10:]).inc(n)

    def speculated(self, drafted: int, accepted: int):
        self._l(self._draft_tokens).inc(drafted)
        self._l(self._accepted_tokens).inc(accepted)

    def set_transfer_queue_depth(self, n: int):
        self._l(self._transfer_depth).set(n)

    # -- reading
    def value(self, name: str, **labels) -> float:
        """Current value of a series summed over replicas, e.g. value("vsurge:generation_tokens_total");
        value(name, replica="1") reads one replica."""
        wanted = {"model_name": self.model_name, **{k: str(v) for k, v in labels.items()}}
        return sum(sample.value for family in self.registry.collect() for sample in family.samples
                   if sample.name == name and all(sample.labels.get(k) == v for k, v in wanted.items()))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
