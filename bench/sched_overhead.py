#!/usr/bin/env python3
"""Host time of one Scheduler.step (nanoqwen_rt/scheduler.py) per decoding sequence, with a KV store that computes
nothing: what the batched API costs in Python on top of the device step, at 1..64 rows.

    python bench/sched_overhead.py [--rows 1,8,32,64] [--vocab 151936] [--steps 200] [--profile 32]

Two stores: "device" draws every token itself (the CUDA SessionKv's plain requests: only tokens come back) and
"host" returns a float32 (vocab,) logits row per sequence, which the scheduler samples greedily on the host (the
CPU backend; CUDA requests with a LogitsPipeline). Each sequence's consumer is a counter (the scheduler's side
only: a server's handles decode text on their own threads). --profile N prints cProfile's top entries for N rows
of the "device" store.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nanoqwen_rt.backends.base import SequenceKv  # noqa: E402
from nanoqwen_rt.sampling import SamplingParams  # noqa: E402
from nanoqwen_rt.scheduler import Scheduler, _Seq  # noqa: E402


class _NullKv(SequenceKv):
    """Computes nothing: a prompt's logits / token and every decode row come from fixed arrays. Shares pages as the
    CUDA SessionKv does (its device pool), so the scheduler's prefix-cache publishing is in the figures."""

    shares_pages = True

    def __init__(self, vocab: int, draws: bool):
        self.samples_tokens = draws
        self.row = np.random.default_rng(0).standard_normal(vocab).astype(np.float32)   # (vocab,)
        self.rows = None

    def open(self, seq, capacity):
        pass

    def close(self, seq):
        pass

    def set_sampling(self, seq, params):
        pass

    def forward(self, seq, p0, ids):
        return self.row.copy()

    def forward_token(self, seq, p0, ids):
        return 7

    def forward_decode(self, seqs, p0s, tokens):
        n = len(seqs)
        if self.samples_tokens:
            return np.full(n, 7, dtype=np.int32), np.empty((0, self.row.shape[0]), dtype=np.float32)
        if self.rows is None or self.rows.shape[0] != n:
            self.rows = np.tile(self.row, (n, 1))                                      # (n, vocab)
        return np.full(n, -1, dtype=np.int32), self.rows


class _NullBackend:
    def __init__(self, vocab, draws, max_context):
        self.max_context = max_context
        self._kv = _NullKv(vocab, draws)

    def sequence_kv(self, n_pages):
        return self._kv


def step_cost(rows: int, vocab: int, steps: int, draws: bool, profile: bool = False) -> float:
    """Median host seconds of a step with `rows` decoding sequences (after their prompts)."""
    ctx = steps + 64
    be = _NullBackend(vocab, draws, ctx)
    sched = Scheduler(be, max_batch=rows, kv_pages=rows * (ctx // 16 + 2), lock=threading.Lock())
    got = [0] * rows
    for i in range(rows):
        def on_token(t, lp, c, i=i):
            got[i] += 1
        sched.add(_Seq(np.arange(1, 9, dtype=np.int32), SamplingParams(0.0), steps + 8, set(), None, on_token))
    while not all(got):                          # prompts (8 tokens each, PREFILL_CHUNK_TOKENS per step) and
        sched.step()                             # first tokens
    before = list(got)
    times = []
    prof = cProfile.Profile() if profile else None
    for _ in range(steps):
        t = time.perf_counter()
        if prof:
            prof.enable()
        sched.step()
        if prof:
            prof.disable()
        times.append(time.perf_counter() - t)
    if prof:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(18)
    assert all(g - b == steps for g, b in zip(got, before)), (got, before)
    return float(np.median(times))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,8,32,64")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--profile", type=int, default=0)
    a = ap.parse_args()
    if a.profile:
        step_cost(a.profile, a.vocab, a.steps, True, profile=True)
        return 0
    print(f"{'rows':>5} {'device: us/step':>16} {'us/row':>8} {'host: us/step':>14} {'us/row':>8}")
    for n in [int(x) for x in a.rows.split(",")]:
        d = step_cost(n, a.vocab, a.steps, True) * 1e6
        h = step_cost(n, a.vocab, max(a.steps // 4, 10), False) * 1e6
        print(f"{n:5d} {d:16.1f} {d / n:8.1f} {h:14.1f} {h / n:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
