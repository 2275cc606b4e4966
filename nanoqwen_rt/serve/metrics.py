"""The server's Prometheus metrics, with prometheus_client (the ecosystem's client: text and OpenMetrics
exposition, thread-safe updates, label escaping). Each ServerMetrics owns its own CollectorRegistry, so two apps in
one process (tests, or two servers) never share counters and nothing registers in the library's global registry.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder

# Latency buckets in seconds. TTFT spans a CPU prefill of a long prompt (seconds) down to a GPU prefill (ms);
# per-token latency spans a CUDA-graph decode step (sub-ms) to the CPU reference backend (tens of ms).
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TOKEN_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


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
        self.running = Gauge("nanoqwen_requests_running", "Requests generating now (0 or 1).", registry=r)

    def count_request(self, endpoint: str, status: int) -> None:
        self.requests.labels(endpoint=endpoint, status=str(status)).inc()

    def render(self, accept: str = "") -> tuple[bytes, str]:
        """(body, content type) of the exposition format the client's Accept header asks for (text by default)."""
        encode, content_type = choose_encoder(accept)
        return encode(self.registry), content_type
