"""Reads the records session 23's trace.py dumps (/tmp/frag_trace.bin; a library built with make_frag_trace.py,
whose `pad` is the block's chunk count) and prints, per GEMV kind, the dot's time (t3 - t2) against the number of
the launch's blocks on the block's SM and against its chunk count: does an SM's share or a block's work set it?
Usage: python3 frag_trace_sm.py [/tmp/frag_trace.bin]"""
import sys

import numpy as np

dt = np.dtype([("t", "<u8", 7), ("kind", "<u4"), ("block", "<u4"), ("sm", "<u4"), ("chunks", "<u4")])
r = np.fromfile(sys.argv[1] if len(sys.argv) > 1 else "/tmp/frag_trace.bin", dtype=dt)
r = r[np.argsort(r["t"][:, 1])]
t = r["t"].astype(np.int64)
launch = np.concatenate([[0], np.cumsum(np.diff(t[:, 1]) > 3000)])   # PDL waits more than 3 us apart: a new launch
names = {0: "store", 1: "add", 2: "swiglu"}
for kind in sorted(set(r["kind"].tolist())):
    sel = r["kind"] == kind
    dot = (t[sel, 3] - t[sel, 2]) / 1e3
    # blocks of the same launch on the same SM
    key = launch[sel] * 1024 + r["sm"][sel]
    _, inv, cnt = np.unique(key, return_inverse=True, return_counts=True)
    per_sm = cnt[inv]
    print(f"{names.get(kind >> 28, kind >> 28)} K={128 * ((kind >> 14) & 0x3FFF)} tiles={kind & 0x3FFF}: "
          f"{sel.sum()} blocks, dot µs mean {dot.mean():.2f}")
    for n in sorted(set(per_sm.tolist())):
        m = per_sm == n
        print(f"  {n} blocks on the SM: {m.sum():6d} blocks, dot mean {dot[m].mean():.2f} µs, p90 {np.percentile(dot[m], 90):.2f}")
    for c in sorted(set(r["chunks"][sel].tolist())):
        m = r["chunks"][sel] == c
        print(f"  {c:3d} chunks a block: {m.sum():6d} blocks, dot mean {dot[m].mean():.2f} µs")
