"""Prometheus text exposition (format 0.0.4) for the server, written by hand: three metric kinds, ~100 lines,
no extra dependency. All updates take one lock, because the generation worker thread and the event loop both
write; `render()` reads a consistent snapshot under the same lock.
"""
from __future__ import annotations

import math
import threading

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Latency buckets in seconds. TTFT spans a CPU prefill of a long prompt (seconds) down to a GPU prefill (ms);
# per-token latency spans a CUDA-graph decode step (sub-ms) to the CPU reference backend (tens of ms).
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TOKEN_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


def _fmt(v: float) -> str:
    if v == math.inf:
        return "+Inf"
    if float(v).is_integer():
        return str(int(v))
    return repr(float(v))


def _labels(names: tuple[str, ...], values: tuple[str, ...], extra: str = "") -> str:
    parts = [f'{n}="{_escape(v)}"' for n, v in zip(names, values)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _escape(v: str) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _Metric:
    kind = ""

    def __init__(self, registry: "Registry", name: str, help: str, labelnames: tuple[str, ...] = ()):
        self.name, self.help, self.labelnames = name, help, tuple(labelnames)
        self._lock = registry.lock
        registry.metrics.append(self)

    def _key(self, labels: dict | None) -> tuple[str, ...]:
        labels = labels or {}
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name}: labels {sorted(labels)} != {sorted(self.labelnames)}")
        return tuple(str(labels[n]) for n in self.labelnames)

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]


class Counter(_Metric):
    kind = "counter"

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self._values: dict[tuple[str, ...], float] = {}

    def inc(self, amount: float = 1.0, **labels) -> None:
        if amount < 0:
            raise ValueError("counters only go up")
        k = self._key(labels)
        with self._lock:
            self._values[k] = self._values.get(k, 0.0) + amount

    def lines(self) -> list[str]:
        out = self.header()
        values = self._values or ({(): 0.0} if not self.labelnames else {})
        for k, v in sorted(values.items()):
            out.append(f"{self.name}{_labels(self.labelnames, k)} {_fmt(v)}")
        return out


class Gauge(_Metric):
    kind = "gauge"

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self._value = 0.0

    def set(self, v: float) -> None:
        with self._lock:
            self._value = float(v)

    def inc(self, amount: float = 1.0) -> None:
        with self._lock:
            self._value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.inc(-amount)

    def lines(self) -> list[str]:
        return self.header() + [f"{self.name} {_fmt(self._value)}"]


class Histogram(_Metric):
    """Cumulative buckets (`le` upper bounds, +Inf last), `_sum` and `_count`, as Prometheus expects."""
    kind = "histogram"

    def __init__(self, registry, name, help, buckets):
        super().__init__(registry, name, help)
        self.bounds = tuple(sorted(buckets)) + (math.inf,)
        self._counts = [0] * len(self.bounds)    # per-bucket (non-cumulative) counts, (len(bounds),)
        self._sum = 0.0

    def observe(self, v: float) -> None:
        with self._lock:
            for i, b in enumerate(self.bounds):
                if v <= b:
                    self._counts[i] += 1
                    break
            self._sum += v

    def lines(self) -> list[str]:
        out = self.header()
        cum = 0
        for b, c in zip(self.bounds, self._counts):
            cum += c
            out.append(f'{self.name}_bucket{{le="{_fmt(b)}"}} {cum}')
        out.append(f"{self.name}_sum {_fmt(self._sum)}")
        out.append(f"{self.name}_count {cum}")
        return out


class Registry:
    def __init__(self):
        self.lock = threading.Lock()
        self.metrics: list[_Metric] = []

    def render(self) -> str:
        with self.lock:
            lines = [line for m in self.metrics for line in m.lines()]
        return "\n".join(lines) + "\n"


class ServerMetrics:
    """The server's metrics, one place. Names carry the `nanoqwen_` prefix and base units (seconds)."""

    def __init__(self):
        r = self.registry = Registry()
        self.requests = Counter(r, "nanoqwen_requests_total", "HTTP requests answered, by endpoint and status.",
                                ("endpoint", "status"))
        self.prompt_tokens = Counter(r, "nanoqwen_prompt_tokens_total", "Prompt tokens prefilled.")
        self.completion_tokens = Counter(r, "nanoqwen_completion_tokens_total", "Tokens generated.")
        self.rejected = Counter(r, "nanoqwen_queue_rejected_total", "Requests refused with 429 (queue full).")
        self.cancelled = Counter(r, "nanoqwen_generations_cancelled_total",
                                 "Generations stopped because the client went away.")
        self.ttft = Histogram(r, "nanoqwen_time_to_first_token_seconds",
                              "From request arrival (queue wait included) to the first generated token.",
                              TTFT_BUCKETS)
        self.token_latency = Histogram(r, "nanoqwen_time_per_output_token_seconds",
                                       "Time between successive generated tokens.", TOKEN_BUCKETS)
        self.queue_depth = Gauge(r, "nanoqwen_queue_depth", "Requests waiting for the engine.")
        self.running = Gauge(r, "nanoqwen_requests_running", "Requests generating now (0 or 1).")

    def render(self) -> str:
        return self.registry.render()
