#!/usr/bin/env python3
"""Aggregate decode throughput of nq_decode_batch (many sequences, one forward pass per step) on the CUDA backend.

    python3 bench/batch_bench.py FILE [--batch 1,8,32,64] [--prompt 512] [--steps 32] [--json out.json]

For each batch size n: n sessions on one model, each prefilled with its own random --prompt tokens, then --steps
batched steps (every session feeds the token it sampled, greedy). Reports the step time, the aggregate tokens/s
(n / step time) and the same against batch 1's single-stream graph decode (nq_decode of the decode-only graph, the
`nanoqwen bench` path) measured in the same process. "pipelined": the same steps through nq_decode_batch_launch /
_wait, each launched before the previous one is waited and fed its draws on the device (the Engine's pipelined
path without its Python), so the host's part of a step overlaps the device's.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> int:
    import numpy as np
    from nanoqwen_rt.backends.cuda import CudaBackend
    from nanoqwen_rt.backends.cuda.abi import check

    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--batch", default="1,8,32,64")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    ctx = a.prompt + 2 * a.steps + 8
    be = CudaBackend(a.file, max_context=ctx)
    V = be.config.vocab_rows
    rng = np.random.default_rng(0)

    def prefill(sess, ids):
        ids = np.ascontiguousarray(ids, dtype=np.int32)
        check(be._lib, "nq_prefill", sess, ids.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), ids.shape[0],
              what="prefill")

    # batch 1 through the single-stream decode-only graph (one host round trip per token, as decode_batch)
    be.reset()
    prefill(be.session, rng.integers(0, V, size=a.prompt))
    tok = 0
    be._decode(tok)
    t0 = time.perf_counter()
    for _ in range(a.steps):
        logits = be._decode(tok)
        tok = int(np.argmax(logits))
    single_ms = (time.perf_counter() - t0) / a.steps * 1e3
    print(f"single stream (graph decode + logits to host)  {single_ms:8.3f} ms/token  {1e3 / single_ms:8.1f} tok/s")
    rows = []
    for n in [int(x) for x in a.batch.split(",")]:
        sessions = [be.new_session(ctx) for _ in range(n)]
        try:
            for s in sessions:
                prefill(s, rng.integers(0, V, size=a.prompt))
            toks = rng.integers(0, V, size=n).astype(np.int32)
            for _ in range(2):   # warm-up: binds the sessions, creates the batch; step 1 runs as is, step 2 is captured
                toks, _ = be.decode_batch(sessions, toks)
            t0 = time.perf_counter()
            for _ in range(a.steps):
                toks, _ = be.decode_batch(sessions, toks)
            step_ms = (time.perf_counter() - t0) / a.steps * 1e3
            chain = np.arange(n, dtype=np.int32)
            be.decode_batch_launch(sessions, toks)
            t0 = time.perf_counter()
            for _ in range(a.steps):
                be.decode_batch_launch(sessions, toks, chain)
                toks = be.decode_batch_wait(n)
            pipe_ms = (time.perf_counter() - t0) / a.steps * 1e3
            be.decode_batch_wait(n)
        finally:
            for s in sessions:
                be.free_session(s)
        r = {"batch": n, "step_ms": step_ms, "tokens_per_s": n / step_ms * 1e3,
             "per_stream_ms": step_ms, "vs_single_stream": (n / step_ms) / (1 / single_ms),
             "pipelined_step_ms": pipe_ms, "pipelined_tokens_per_s": n / pipe_ms * 1e3}
        rows.append(r)
        print(f"batch {n:4d}: step {step_ms:8.3f} ms  aggregate {r['tokens_per_s']:9.1f} tok/s  "
              f"({r['vs_single_stream']:5.2f}x the single stream);  pipelined step {pipe_ms:8.3f} ms  "
              f"{r['pipelined_tokens_per_s']:9.1f} tok/s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"file": a.file, "prompt": a.prompt, "steps": a.steps, "single_stream_ms": single_ms,
                       "rows": rows}, f, indent=1)
    be.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
