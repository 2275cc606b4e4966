"""Continuous batching in the server: a bounded FIFO of jobs and the worker thread that runs up to `max_batch` of
them at once on the engine's batch.

The event loop never calls the engine. A request handler builds a `Job` (a callable that starts the engine's
iterator, plus a `sink` that receives events), `submit`s it (a full queue raises `QueueFull` → 429), and reads
the events the worker pushes. The worker goes round its running jobs: each round takes one item from each job's
iterator (the engine adapter's: a chunk, or None when the engine's step produced nothing for that job); the first
job with nothing ready makes the engine step, which advances every sequence of the batch by one token (and the
prompts being computed by one chunk). Waiting jobs join between rounds, that is at step boundaries, while fewer
than `max_batch` run. A job whose client went away (`job.cancelled`) leaves at the next round: its iterator is
closed, which cancels its sequence and frees its KV pages at once; a job cancelled while still waiting leaves the
queue at once and never touches the engine. A request that fits the batch but not the free KV pages waits inside
the engine (admitted when pages free up), so a full pool queues; a full FIFO answers 429.

Events sent to `job.sink`, in order: zero or more `Piece`, then exactly one `Finished` or `Failed`.
"""
from __future__ import annotations

import collections
import math
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator

from .metrics import ServerMetrics


# Jobs whose run time the Retry-After estimate averages: enough to smooth one odd request, recent enough to follow
# a change of load (short vs long answers).
RECENT_JOBS = 16
# Retry-After bounds, seconds: never 0 (a client would retry at once), never more than a minute (an estimate
# from a few slow jobs should not park clients for long).
RETRY_AFTER_MIN_S = 1
RETRY_AFTER_MAX_S = 60


class QueueFull(Exception):
    """The wait queue holds `queue_size` jobs already."""


@dataclass
class Piece:
    text: str            # new text since the previous piece
    n_tokens: int        # tokens this piece accounts for
    index: int = 0       # which choice (n > 1 generates several, one after another)
    logprobs: list | None = None        # TokenLogprob per emitted token, when asked for
    finish_reason: str | None = None    # set on the last piece of a choice


@dataclass
class Finished:
    finish_reason: str | None   # "stop" | "length" | None when cancelled
    completion_tokens: int
    cancelled: bool = False


@dataclass
class Failed:
    error: BaseException


class Job:
    """One request's generation. `start()` returns the engine's piece iterator (called on the worker thread)."""

    def __init__(self, start: Callable[[], Iterator], sink: Callable[[object], None], prompt_tokens: int):
        self.start = start
        self.sink = sink
        self.prompt_tokens = prompt_tokens
        self.arrival = time.perf_counter()
        self._cancel = threading.Event()

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()


class _Active:
    """A running job: its iterator and what the metrics need."""

    def __init__(self, job: Job, t0: float):
        self.job = job
        self.t0 = t0
        self.it = None
        self.n_tokens = 0
        self.finish = None
        self.last: float | None = None


class GenerationWorker:
    """Runs up to `max_batch` queued jobs at once on a daemon thread (module docstring). `queue_size` counts
    waiting jobs only."""

    def __init__(self, queue_size: int, metrics: ServerMetrics, max_batch: int = 1):
        if queue_size < 1:
            raise ValueError(f"queue_size must be >= 1, got {queue_size}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.queue_size = queue_size
        self.max_batch = max_batch
        self.metrics = metrics
        self._waiting: collections.deque[Job] = collections.deque()
        self._cv = threading.Condition()
        self._stopping = False
        self.running: list[_Active] = []
        self._recent_s: collections.deque[float] = collections.deque(maxlen=RECENT_JOBS)   # run times, seconds
        self._thread = threading.Thread(target=self._loop, name="nanoqwen-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Cancel every job (running and waiting) and let the thread exit."""
        with self._cv:
            self._stopping = True
            for job in self._waiting:
                job.cancel()
            for a in self.running:
                a.job.cancel()
            self._cv.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        """True while the worker thread runs (it may still be inside an engine call after stop() timed out)."""
        return self._thread.is_alive()

    @property
    def depth(self) -> int:
        with self._cv:
            return len(self._waiting)

    def retry_after_s(self) -> int:
        """Seconds until a queue slot is likely free: (waiting + running jobs) / max_batch × the mean run time of
        the last RECENT_JOBS jobs, rounded up, within [RETRY_AFTER_MIN_S, RETRY_AFTER_MAX_S]."""
        with self._cv:
            ahead = len(self._waiting) + len(self.running)
            mean = sum(self._recent_s) / len(self._recent_s) if self._recent_s else 0.0
        return max(RETRY_AFTER_MIN_S, min(RETRY_AFTER_MAX_S, math.ceil(ahead / self.max_batch * mean)))

    def submit(self, job: Job) -> None:
        with self._cv:
            if self._stopping:
                raise QueueFull("the server is shutting down")
            # jobs that free batch slots will take at the next step boundary are not waiting for a slot: only those
            # beyond them count against the FIFO (a burst of max_batch requests on an idle server all run)
            free = max(0, self.max_batch - len(self.running))
            if len(self._waiting) >= self.queue_size + free:
                raise QueueFull(f"{len(self._waiting) - free} requests are already waiting")
            self._waiting.append(job)
            self.metrics.queue_depth.set(len(self._waiting))
            self._cv.notify()

    def withdraw(self, job: Job) -> None:
        """Cancel `job`; if it is still waiting, remove it from the queue now (its slot frees at once)."""
        job.cancel()
        with self._cv:
            try:
                self._waiting.remove(job)
            except ValueError:
                return                       # running or finished: the worker sees the flag between tokens
            self.metrics.queue_depth.set(len(self._waiting))
        self.metrics.cancelled.inc()
        job.sink(Finished(None, 0, cancelled=True))

    # ------------------------------------------------------------ worker thread

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._waiting and not self.running and not self._stopping:
                    self._cv.wait()
                if self._stopping:
                    running, self.running = self.running, []
                else:
                    running = None
                    while self._waiting and len(self.running) < self.max_batch:     # join at a step boundary
                        job = self._waiting.popleft()
                        self.running.append(_Active(job, time.perf_counter()))
                        self.metrics.running.inc()
                    self.metrics.queue_depth.set(len(self._waiting))
            if running is not None:                  # shutting down: end what runs, then leave
                for a in running:
                    self._end(a)
                return
            for a in list(self.running):
                if not self._advance(a):
                    self._end(a)
                    with self._cv:
                        self.running.remove(a)

    def _advance(self, a: _Active) -> bool:
        """One item of a running job's iterator (starting it first). False when the job is over."""
        m, job = self.metrics, a.job
        if job.cancelled:
            return False
        try:
            if a.it is None:
                a.it = job.start()
                m.prompt_tokens.inc(job.prompt_tokens)
            try:
                piece = next(a.it)
            except StopIteration:
                return False
        except Exception as e:               # the engine failed: report it to this request, keep serving
            job.sink(Failed(e))
            a.finish = _FAILED
            return False
        if piece is None:                    # the engine's step gave this job nothing yet
            return True
        now = time.perf_counter()
        k = len(piece.token_ids)
        if k:
            if a.last is None:
                m.ttft.observe(now - job.arrival)
            else:
                # A piece may carry several tokens (a UTF-8 character split over tokens): spread the gap.
                for _ in range(k):
                    m.token_latency.observe((now - a.last) / k)
            a.last = now
        a.n_tokens += k
        m.completion_tokens.inc(k)
        a.finish = piece.finish_reason
        if piece.text or k:
            job.sink(Piece(piece.text, k, getattr(piece, "index", 0), getattr(piece, "logprobs", None),
                           a.finish))
        return True

    def _end(self, a: _Active) -> None:
        """Close the job's iterator (its sequence leaves the engine's batch and frees its pages now) and send its
        last event."""
        m, job = self.metrics, a.job
        try:
            if a.it is not None and hasattr(a.it, "close"):
                a.it.close()
        finally:
            m.running.dec()
            with self._cv:
                self._recent_s.append(time.perf_counter() - a.t0)
        if a.finish is _FAILED:
            return
        if job.cancelled and a.finish is None:
            m.cancelled.inc()
            job.sink(Finished(None, a.n_tokens, cancelled=True))
        else:
            job.sink(Finished(a.finish, a.n_tokens))


_FAILED = object()        # _Active.finish of a job whose Failed event was sent
