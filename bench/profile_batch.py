#!/usr/bin/env python3
"""Per-kernel GPU times of one batched decode step (nq_decode_batch), through Nsight Compute.

    ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv \
        python3 bench/profile_batch.py run FILE N > ncu.csv
    python3 bench/profile_batch.py summarize ncu.csv

`run`: N sessions, each prefilled with 64 random tokens, then 2 batched steps, profiled (cuProfilerStart/Stop around
the steps, so the prefills stay out of the profile). `summarize`: the kernels of the LAST
step (from its embed_rows_kernel on), time summed per kernel name (template arguments dropped), and the step's total
GPU time, which against the step's wall time (bench/batch_bench.py) shows the host's share.
"""
from __future__ import annotations

import ctypes
import os
import re
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(path: str, n: int) -> None:
    import numpy as np
    from nanoqwen_rt.backends.cuda import CudaBackend
    from nanoqwen_rt.backends.cuda.abi import check
    with CudaBackend(path, max_context=128) as be:
        V = be.config.vocab_rows
        rng = np.random.default_rng(0)
        sessions = [be.new_session(128) for _ in range(n)]
        for s in sessions:
            ids = np.ascontiguousarray(rng.integers(0, V, size=64), dtype=np.int32)
            check(be._lib, "nq_prefill", s, ids.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), ids.shape[0],
                  what="prefill")
        toks = rng.integers(0, V, size=n).astype(np.int32)
        toks, _ = be.decode_batch(sessions, toks)      # binds the sessions, creates the batch
        cu = ctypes.CDLL("libcuda.so.1")
        cu.cuProfilerStart()
        for _ in range(2):
            toks, _ = be.decode_batch(sessions, toks)
        cu.cuProfilerStop()
        for s in sessions:
            be.free_session(s)


def summarize(csv_path: str) -> None:
    from profile_decode import kernel_times      # bench/ (this script's folder)
    rows = kernel_times(csv_path)
    starts = [i for i, (name, _) in enumerate(rows) if "embed_rows_kernel" in name]
    if not starts:
        print("no batched step found")
        return
    step = rows[starts[-1]:]
    tot, cnt = defaultdict(float), defaultdict(int)
    for name, us in step:
        key = re.sub(r"<.*", "", name.split("(")[0]).strip()
        m = re.search(r"gemm_int4_wgmma<(\d+)", name)
        if m:
            key += f"<TN={m.group(1)}>"
        tot[key] += us
        cnt[key] += 1
    total = sum(tot.values())
    print(f"batched step: {len(step)} kernels, {total:.1f} us of GPU time")
    for k in sorted(tot, key=lambda k: -tot[k]):
        print(f"  {k:48s} {cnt[k]:5d} launches {tot[k]:9.1f} us ({tot[k] / total * 100:5.1f} %)")


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "run":
        run(sys.argv[2], int(sys.argv[3]))
    elif len(sys.argv) == 3 and sys.argv[1] == "summarize":
        summarize(sys.argv[2])
    else:
        print(__doc__)
        sys.exit(2)
