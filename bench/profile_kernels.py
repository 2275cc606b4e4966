#!/usr/bin/env python3
"""GPU time per kernel of one prompt prefill, one batched decode step or single-stream decode steps, traced with CUPTI through torch.profiler
(no replay per kernel as under Nsight Compute, so a whole 28-layer prefill takes seconds; kernels run as they do in
production, graph replays included).

    python3 bench/profile_kernels.py FILE prefill [--tokens 512] [--after 2000]   (--after: that many tokens first,
        not traced: e.g. a prefix-cache hit's few new tokens after the cached ones)
    python3 bench/profile_kernels.py FILE batch [--n 32]
    python3 bench/profile_kernels.py FILE decode [--tokens 512 --steps 16]   (per step: totals / steps)
    python3 bench/profile_kernels.py FILE engine [--n 32 --tokens 512 --steps 16]   (per step: the batched Engine's
        steady, pipelined decode steps as `nanoqwen bench --concurrency` runs them: n streams after --tokens-token
        prompts, so attention reads their keys; the gaps include the scheduler's host time the device waited for)

Prints, per kernel name (template arguments dropped), launches, total and mean µs, and the share of the summed GPU
time; then the summed GPU time against the wall time of the same call (the difference is launch gaps and host work).
torch is a benchmark-only dependency here (the product does not import it).
"""
from __future__ import annotations

import argparse
import ctypes
import os
import re
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def short(name: str) -> str:
    name = name.replace("(anonymous namespace)::", "")
    while re.search(r"<[^<>]*>", name):          # template arguments, innermost first
        name = re.sub(r"<[^<>]*>", "", name)
    name = name.split("(")[0]                     # the parameter list
    return name.split("::")[-1].split()[-1] if name.strip() else "?"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("mode", choices=["prefill", "batch", "decode", "engine"])
    ap.add_argument("--tokens", type=int, default=512, help="prefill: prompt tokens; decode: the prompt before")
    ap.add_argument("--steps", type=int, default=16, help="decode: steps traced (the table is per step)")
    ap.add_argument("--n", type=int, default=32, help="batch, engine: sequences in the step")
    ap.add_argument("--after", type=int, default=0, help="prefill: tokens prefilled first, not traced")
    a = ap.parse_args()
    import numpy as np
    import torch
    from torch.profiler import ProfilerActivity, profile
    from nanoqwen_rt.backends.cuda import CudaBackend
    from nanoqwen_rt.backends.cuda.abi import check

    if a.mode == "engine":
        return profile_engine_steps(a)
    ctx = max(a.tokens, 64) + 16 + (a.steps + 8 if a.mode == "decode" else 0) + a.after
    be = CudaBackend(a.file, max_context=ctx)
    V = be.config.vocab_rows
    rng = np.random.default_rng(0)
    torch.cuda.init()
    if a.mode == "prefill":
        ids = rng.integers(0, V, size=a.tokens).astype(np.int32)
        before = rng.integers(0, V, size=a.after).astype(np.int32)

        def start():                              # an empty sequence, or the untraced prefix
            be.reset()
            if a.after:
                be.prefill(before)
        for _ in range(2):                        # warm-up: one-time kernel attributes, allocator
            start()
            be.prefill(ids)
        start()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            be.prefill(ids)
            wall = time.perf_counter() - t0
    elif a.mode == "decode":                      # the decode graph of Engine.generate's steps (logits to the host)
        be.reset()
        be.prefill(rng.integers(0, V, size=a.tokens).astype(np.int32))
        toks = rng.integers(0, V, size=a.steps + 4).astype(np.int32)
        for t in toks[:4]:                        # warm-up
            be.decode(int(t))
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            for t in toks[4:]:
                be.decode(int(t))
            wall = time.perf_counter() - t0
    else:
        sessions = [be.new_session(ctx) for _ in range(a.n)]
        for s in sessions:
            p = np.ascontiguousarray(rng.integers(0, V, size=64), dtype=np.int32)
            check(be._lib, "nq_prefill", s, p.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), p.shape[0],
                  what="prefill")
        toks = rng.integers(0, V, size=a.n).astype(np.int32)
        for _ in range(3):                        # binds, runs ungraphed, captures
            toks, _ = be.decode_batch(sessions, toks)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            toks, _ = be.decode_batch(sessions, toks)
            wall = time.perf_counter() - t0
    report(prof, a, wall)
    be.close()
    return 0


def report(prof, a, wall: float) -> None:
    import torch
    per = defaultdict(lambda: [0, 0.0])
    spans = []                                     # (start, end, name) of every device activity, µs
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            k = per[short(ev.name)]
            k[0] += 1
            k[1] += ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
            spans.append((ev.time_range.start, ev.time_range.end, short(ev.name)))
    if a.mode in ("decode", "engine"):           # per step
        per = defaultdict(lambda: [0, 0.0], {k: [v[0] / a.steps, v[1] / a.steps] for k, v in per.items()})
        wall /= a.steps
    total = sum(v[1] for v in per.values())
    what = {"prefill": f"tokens {a.tokens}" + (f" after {a.after}" if a.after else ""), "batch": f"n {a.n}",
            "decode": f"per step, mean of {a.steps} after a {a.tokens}-token prompt",
            "engine": f"n {a.n}, per step, mean of {a.steps} pipelined Engine steps after {a.tokens}-token prompts"}[a.mode]
    print(f"{a.mode} ({what}), {a.file}")
    print(f"{'kernel':44s} {'launches':>8s} {'total us':>10s} {'mean us':>9s} {'share':>6s}")
    for name, (cnt, us) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        print(f"{name[:44]:44s} {cnt:8g} {us:10.1f} {us / cnt:9.2f} {100 * us / max(total, 1e-9):5.1f}%")
    print(f"GPU time summed {total / 1e3:.3f} ms; wall {wall * 1e3:.3f} ms")
    # idle time between consecutive device activities (launch gaps, host work the device waits for), by the
    # kernel that follows the gap
    spans.sort()
    gaps = defaultdict(lambda: [0, 0.0])
    end = spans[0][1] if spans else 0.0
    for st, en, name in spans[1:]:
        if st > end:
            g = gaps[name]
            g[0] += 1
            g[1] += st - end
        end = max(end, en)
    if spans:
        idle = sum(g[1] for g in gaps.values())
        print(f"first to last activity {(end - spans[0][0]) / 1e3:.3f} ms{' (all steps)' if a.mode in ('decode', 'engine') else ''}, "
              f"of it idle {idle / 1e3:.3f} ms; idle before:")
        for name, (cnt, us) in sorted(gaps.items(), key=lambda kv: -kv[1][1])[:8]:
            print(f"  {name[:44]:44s} {cnt:6d} gaps {us:9.1f} us  mean {us / cnt:6.2f}")


def profile_engine_steps(a) -> int:
    """The engine mode: n streams through Engine.submit, every one decoding, then a.steps steady steps traced."""
    import numpy as np
    import torch
    from torch.profiler import ProfilerActivity, profile
    from nanoqwen_rt.engine import Engine
    from nanoqwen_rt.kv_pool import pages_for

    new_tokens = a.steps + 4 * a.n + 16           # room for the prefill ramp, warm-up and traced steps: no stream ends
    max_context = a.tokens + new_tokens + 1
    eng = Engine(a.file, device="cuda", max_context=max_context, verify_checksums=False, max_batch=a.n,
                 kv_pages=a.n * pages_for(max_context))
    try:
        rng = np.random.default_rng(0)
        V = min(eng.config.vocab_rows, 151643)
        handles = [eng.submit(rng.integers(0, V, size=a.tokens).astype(np.int32).tolist(), max_new_tokens=new_tokens,
                              temperature=0.0, stop_token_ids=[]) for _ in range(a.n)]
        started = [False] * a.n
        for _ in range(100 * a.n + 1000):         # prefill everything; the first tokens come out
            eng.step()
            started = [s or bool(h.poll()) for s, h in zip(started, handles)]
            if all(started):
                break
        else:
            raise RuntimeError("the streams did not all start")
        for _ in range(4):                        # the batch size's graph: warm run, capture, replay
            eng.step()
            for h in handles:
                h.poll()
        torch.cuda.init()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            for _ in range(a.steps):
                if eng.step() != a.n:
                    raise RuntimeError(f"a traced step did not sample {a.n} tokens: not a steady decode step")
                for h in handles:
                    h.poll()
            wall = time.perf_counter() - t0       # all steps (report divides)
    finally:
        eng.close()
    report(prof, a, wall)
    return 0


if __name__ == "__main__":
    sys.exit(main())
