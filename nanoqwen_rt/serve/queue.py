"""One generation at a time: a bounded FIFO of jobs and the worker thread that runs them on the engine.

The event loop never calls the engine. A request handler builds a `Job` (a callable that starts the engine's
generator, plus a `sink` that receives events), `submit`s it (a full queue raises `QueueFull` → 429), and reads
the events the worker pushes. The worker checks `job.cancelled` between tokens, so a client that goes away
stops its generation after at most one more token; a job cancelled while still waiting leaves the queue at once
and never touches the engine.

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


class GenerationWorker:
    """Runs queued jobs one after another on a daemon thread. `queue_size` counts waiting jobs only."""

    def __init__(self, queue_size: int, metrics: ServerMetrics):
        if queue_size < 1:
            raise ValueError(f"queue_size must be >= 1, got {queue_size}")
        self.queue_size = queue_size
        self.metrics = metrics
        self._waiting: collections.deque[Job] = collections.deque()
        self._cv = threading.Condition()
        self._stopping = False
        self.current: Job | None = None
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
            if self.current is not None:
                self.current.cancel()
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
        """Seconds until a queue slot is likely free: (waiting + running jobs) × the mean run time of the last
        RECENT_JOBS jobs, rounded up, within [RETRY_AFTER_MIN_S, RETRY_AFTER_MAX_S]."""
        with self._cv:
            ahead = len(self._waiting) + (self.current is not None)
            mean = sum(self._recent_s) / len(self._recent_s) if self._recent_s else 0.0
        return max(RETRY_AFTER_MIN_S, min(RETRY_AFTER_MAX_S, math.ceil(ahead * mean)))

    def submit(self, job: Job) -> None:
        with self._cv:
            if self._stopping:
                raise QueueFull("the server is shutting down")
            if len(self._waiting) >= self.queue_size:
                raise QueueFull(f"{len(self._waiting)} requests are already waiting")
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
                while not self._waiting and not self._stopping:
                    self._cv.wait()
                if self._stopping:
                    return
                job = self._waiting.popleft()
                self.metrics.queue_depth.set(len(self._waiting))
                self.current = job
            self.metrics.running.inc()
            t0 = time.perf_counter()
            try:
                self._run(job)
            finally:
                self.metrics.running.dec()
                with self._cv:
                    self.current = None
                    self._recent_s.append(time.perf_counter() - t0)

    def _run(self, job: Job) -> None:
        m = self.metrics
        if job.cancelled:
            m.cancelled.inc()
            job.sink(Finished(None, 0, cancelled=True))
            return
        n_tokens = 0
        finish = None
        last = None
        it = None
        try:
            it = job.start()
            m.prompt_tokens.inc(job.prompt_tokens)
            for piece in it:
                now = time.perf_counter()
                k = len(piece.token_ids)
                if k:
                    if last is None:
                        m.ttft.observe(now - job.arrival)
                    else:
                        # A piece may carry several tokens (a UTF-8 character split over tokens): spread the gap.
                        for _ in range(k):
                            m.token_latency.observe((now - last) / k)
                    last = now
                n_tokens += k
                m.completion_tokens.inc(k)
                finish = piece.finish_reason
                if piece.text or k:
                    job.sink(Piece(piece.text, k, getattr(piece, "index", 0), getattr(piece, "logprobs", None),
                                   finish))
                if job.cancelled:
                    break
        except Exception as e:               # the engine failed: report it to this request, keep serving
            job.sink(Failed(e))
            return
        finally:
            if it is not None and hasattr(it, "close"):
                it.close()                   # stops the engine's generator now (frees its sequence state)
        if job.cancelled and finish is None:
            m.cancelled.inc()
            job.sink(Finished(None, n_tokens, cancelled=True))
        else:
            job.sink(Finished(finish, n_tokens))
