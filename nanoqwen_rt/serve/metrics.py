"""The server's Prometheus metrics, with prometheus_client (the ecosystem's client: text and OpenMetrics
exposition, thread-safe updates, label escaping). Each ServerMetrics owns its own CollectorRegistry, so two apps in
one process (tests, or two servers) never share counters and nothing registers in the library's global registry.
"""
from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import choose_encoder

# Latency buckets in seconds. TTFT spans a CPU prefill of a long prompt (seconds) down to a GPU prefill (ms);
# per-token latency spans a CUDA-graph decode step (sub-ms) to the CPU reference backend (tens of ms).
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TOKEN_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
# Sequences per engine step: the powers of two the batched GPU step will be captured for, up to a large --max-batch.
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class ServerMetrics:
    """The server's metrics, one place. Names carry the `nanoqwen_` prefix and base units (seconds)."""

    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("nanoqwen_requests_total", "HTTP requests answered, by endpoint and status.",
                                ("endpoint", "status"), registry=r)
        self.prompt_tokens = Counter("nanoqwen_prompt_tokens_total", "Prompt tokens prefilled.", registry=r)
        self.completion_tokens = Counter("nanoqwen_completion_tokens_total", "Tokens generated.", registry=r)
        self.rejected = Counter("nanoqwen_queue_rejected_total", "Requests refused with 429 (queue full).",
                                registry=r)
        self.cancelled = Counter("nanoqwen_generations_cancelled_total",
                                 "Generations stopped because the client went away.", registry=r)
        self.ttft = Histogram("nanoqwen_time_to_first_token_seconds",
                              "From request arrival (queue wait included) to the first generated token.",
                              buckets=TTFT_BUCKETS, registry=r)
        self.token_latency = Histogram("nanoqwen_time_per_output_token_seconds",
                                       "Time between successive generated tokens.", buckets=TOKEN_BUCKETS,
                                       registry=r)
        self.queue_depth = Gauge("nanoqwen_queue_depth", "Requests waiting for the engine.", registry=r)
        self.running = Gauge("nanoqwen_requests_running", "Requests the worker runs now (at most --max-batch).",
                             registry=r)
        self.batch_size = Histogram("nanoqwen_batch_size", "Sequences in each engine step.", buckets=BATCH_BUCKETS,
                                    registry=r)
        self._batch_stats: Callable[[], object] | None = None
        r.register(_BatchCollector(lambda: self._batch_stats() if self._batch_stats is not None else None))

    def watch_batch(self, stats: Callable[[], object]) -> None:
        """Export the engine's batch state (Engine.batch_stats(): a BatchStats or None) at every scrape."""
        self._batch_stats = stats

    def count_request(self, endpoint: str, status: int) -> None:
        self.requests.labels(endpoint=endpoint, status=str(status)).inc()

    def render(self, accept: str = "") -> tuple[bytes, str]:
        """(body, content type) of the exposition format the client's Accept header asks for (text by default)."""
        encode, content_type = choose_encoder(accept)
        return encode(self.registry), content_type


class _BatchCollector:
    """The engine's batch, read at scrape time: sequences running and waiting, KV pages, prefix-cache hits, the
    recent token rate."""

    def __init__(self, stats: Callable[[], object]):
        self._stats = stats

    def collect(self):
        st = self._stats()
        get = (lambda k: float(getattr(st, k))) if st is not None else (lambda k: 0.0)
        for name, key, doc in (
                ("nanoqwen_sequences_running", "running", "Sequences in the engine's batch (admitted, with pages)."),
                ("nanoqwen_sequences_waiting", "waiting", "Sequences submitted to the engine, waiting for a batch "
                                                          "slot or KV pages."),
                ("nanoqwen_kv_pages", "kv_pages", "KV pages in the pool."),
                ("nanoqwen_kv_pages_used", "kv_pages_used", "KV pages referenced by running sequences."),
                ("nanoqwen_kv_pages_free", "kv_pages_free", "KV pages holding nothing."),
                ("nanoqwen_kv_pages_cached", "kv_pages_cached", "Unreferenced KV pages kept for the prefix cache "
                                                                "(evicted LRU first when pages run out)."),
                ("nanoqwen_tokens_per_second", "tokens_per_s", "Tokens sampled per second of engine steps over the "
                                                               "recent steps, all sequences together.")):
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], get(key))
            yield g
        for name, key, doc in (
                ("nanoqwen_prefix_cache_hit_tokens", "prefix_hit_tokens", "Prompt tokens whose KV rows came from "
                                                                          "the prefix cache (not computed)."),
                ("nanoqwen_prefix_cache_hit_pages", "prefix_hit_pages", "KV pages found in the prefix cache."),
                ("nanoqwen_engine_steps", "steps", "Engine steps run.")):
            c = CounterMetricFamily(name, doc)
            c.add_metric([], get(key))
            yield c
