#!/usr/bin/env python3
"""Per-kernel times of one decode step, through Nsight Compute (Firecracker machines only).

    ncu --clock-control none --graph-profiling node --metrics gpu__time_duration.sum --csv \
        python3 bench/profile_decode.py run FILE > ncu.csv
    python3 bench/profile_decode.py summarize ncu.csv

`run`: a 64-token prefill then 2 decode steps (graph replays). `summarize`: takes the kernels of the LAST
decode step (from its embed_token_kernel on), names each GEMV by its position in the layer (qkv, o, gate/up,
down, lm_head) and prints the time per kind summed over the layers.
"""
from __future__ import annotations

import csv
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(path: str) -> None:
    import numpy as np
    from nanoqwen_rt.backends.cuda import CudaBackend
    with CudaBackend(path, max_context=128) as be:
        ids = (np.arange(64, dtype=np.int32) * 7919) % 151643
        be.prefill(ids)
        be.decode(17)
        be.decode(23)


def kernel_times(csv_path: str) -> list[tuple[str, float]]:
    """(kernel name, µs) of every kernel in an ncu --csv report of gpu__time_duration.sum, in launch order."""
    rows = []
    with open(csv_path, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = r.get("Metric Unit", "ns")
        v = float(r["Metric Value"].replace(",", ""))
        us = v / 1e3 if unit == "nsecond" or unit == "ns" else (v if unit in ("usecond", "us") else v * 1e3)
        rows.append((r["Kernel Name"], us))
    return rows


def summarize(csv_path: str) -> None:
    rows = kernel_times(csv_path)
    starts = [i for i, (n, _) in enumerate(rows) if "embed_token_kernel" in n]
    if not starts:
        print("no decode step found")
        return
    step = rows[starts[-1]:]
    kinds = ["qkv", "attention", "o", "gate/up+swiglu", "down"]
    tot = defaultdict(float)
    cnt = defaultdict(int)
    i = 1
    tot["embed"] += step[0][1]
    cnt["embed"] += 1
    while i < len(step):
        name, us = step[i]
        if "gemv" in name and i + 1 < len(step) and "attn_decode_kernel" in step[i + 1][0]:
            for k, (n2, u2) in zip(kinds, step[i:i + 5]):
                tot[k] += u2
                cnt[k] += 1
            i += 5
            continue
        k = "lm_head" if "gemv" in name else name.split("(")[0].split("<")[0].split("::")[-1]
        tot[k] += us
        cnt[k] += 1
        i += 1
    total = sum(tot.values())
    print(f"decode step, sum of kernel times: {total:.1f} us ({len(step)} kernels)")
    for k in sorted(tot, key=lambda k: -tot[k]):
        print(f"  {k:16s} {tot[k]:8.1f} us  ({cnt[k]} launches, {tot[k] / cnt[k]:6.2f} us each)")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("run", "summarize"):
        raise SystemExit(__doc__)
    (run if sys.argv[1] == "run" else summarize)(sys.argv[2])
