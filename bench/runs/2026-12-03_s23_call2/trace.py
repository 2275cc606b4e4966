"""Session 23 calls 2-4 (experiment, branch wip/s23-frag-pf): where a 7B decode step's GEMV time goes, from the product
kernel's own %globaltimer records (gemv_frag_kernel, thread 0 of every block: entry, after the PDL wait, after x
staging, after the dot and the warp-sum barrier, end, and two epilogue points). Needs a library that exports
nq_frag_trace: commit 172f969 (call 4's), or a scratch copy of main instrumented by
bench/runs/2026-12-03_s25_prep/make_frag_trace.py (this folder's trace.patch no longer applies; never committed to
main). Usage: NANOQWEN_LIB=<that library> python3 trace.py FILE.nanoqwen [prompt_tokens]"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))   # bench/
from trace_inject import traced_decode  # noqa: E402

path = sys.argv[1]
prompt = int(sys.argv[2]) if len(sys.argv) > 2 else 512
n = traced_decode(path, prompt, "frag", 5, "/tmp/frag_trace.bin")   # prefill (no frag GEMVs) + 4 decode steps
dt = np.dtype([("t", "<u8", 7), ("kind", "<u4"), ("block", "<u4"), ("sm", "<u4"), ("pad", "<u4")])
r = np.fromfile("/tmp/frag_trace.bin", dtype=dt)
print(f"{n} records")
mode = r["kind"] >> 28
kc = (r["kind"] >> 14) & 0x3FFF
gx = r["kind"] & 0x3FFF
names = {}
launches = []   # (name, records)
for key in sorted(set(zip(mode.tolist(), kc.tolist(), gx.tolist()))):
    m, k, x = key
    sel = np.where((mode == m) & (kc == k) & (gx == x))[0]
    nm = {0: "store", 1: "add", 2: "swiglu"}.get(m, str(m)) + f" K={128 * k} tiles={x}"
    recs = r[sel]
    recs = recs[np.argsort(recs["t"][:, 0])]
    nb = int(recs["block"].max()) + 1   # blocks of a launch
    for i in range(0, len(recs) - nb + 1, nb):
        launches.append((nm, nb, recs[i:i + nb]))
launches.sort(key=lambda L: int(L[2]["t"][:, 1].min()))
print(f"{len(launches)} launches")
rows = {}
prev_end = None
for nm, nb, rec in launches:
    t = rec["t"].astype(np.int64)
    t0min, t1min, t1max = t[:, 0].min(), t[:, 1].min(), t[:, 1].max()
    d = {
        "blocks": nb,
        "enter spread": (t[:, 0].max() - t0min) / 1e3,
        "enter->wait (mean)": (t[:, 1] - t[:, 0]).mean() / 1e3,
        "wait spread": (t1max - t1min) / 1e3,
        "stage (mean)": (t[:, 2] - t[:, 1]).mean() / 1e3,
        "stage (max)": (t[:, 2] - t[:, 1]).max() / 1e3,
        "dot (mean)": (t[:, 3] - t[:, 2]).mean() / 1e3,
        "dot (max)": (t[:, 3] - t[:, 2]).max() / 1e3,
        "epilogue (mean)": (t[:, 4] - t[:, 3]).mean() / 1e3,
        # t5 / t6: call 4's builds: cluster ready / partials read; trace.patch on main: pushed / owner wait done
        "dot -> t5": ((t[:, 5] - t[:, 3]).mean() / 1e3) if t[:, 5].min() > 0 else np.nan,
        "t5 -> t6": ((t[:, 6] - t[:, 5]).mean() / 1e3) if t[:, 6].min() > 0 else np.nan,
        "t6 -> end": ((t[:, 4] - t[:, 6]).mean() / 1e3) if t[:, 6].min() > 0 else np.nan,
        "span wait->last end": (t[:, 4].max() - t1min) / 1e3,
        "first end - wait": (t[:, 4].min() - t1min) / 1e3,
        "prev last end -> wait": ((t1min - prev_end) / 1e3) if prev_end is not None else np.nan,
    }
    prev_end = t[:, 4].max()
    rows.setdefault(nm, []).append(d)
for nm, ds in rows.items():
    ds = ds[1:] if len(ds) > 4 else ds
    print(f"\n{nm}: {len(ds)} launches, {ds[0]['blocks']} blocks; µs, mean over launches")
    for k in ds[0]:
        if k == "blocks":
            continue
        v = np.array([d[k] for d in ds], dtype=float)
        print(f"  {k:24s} {np.nanmean(v):8.2f}  (min {np.nanmin(v):.2f}, max {np.nanmax(v):.2f})")
# one decode step's timeline: sum of spans and gaps
spans = [(nm, L) for nm, _, L in launches]
t_first = min(int(L["t"][:, 1].min()) for _, L in spans)
t_last = max(int(L["t"][:, 4].max()) for _, L in spans)
print(f"\ntraced window {(t_last - t_first) / 1e3:.1f} µs for {len(spans)} GEMV launches")
