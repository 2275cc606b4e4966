"""Session 25 call 4 (experiment): where a decode step's attention time goes, from attn_decode_kernel's own
%globaltimer records (attn_trace.patch, made by make_trace.py, since replaced by
bench/runs/2026-12-04_s30_call6/make_attn_trace.py; never main). Usage:
NANOQWEN_LIB=.v/trace/libnanoqwen.so python3 trace_attn.py FILE.nanoqwen PROMPT_TOKENS"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))   # bench/
from trace_inject import traced_decode  # noqa: E402

path = sys.argv[1]
prompt = int(sys.argv[2]) if len(sys.argv) > 2 else 512
n = traced_decode(path, prompt, "attn", 9, "/tmp/attn_trace.bin")   # prefill + 8 decode steps
dt = np.dtype([("t", "<u8", 7), ("h", "<u4"), ("split", "<u4"), ("sm", "<u4"), ("flags", "<u4")])
r = np.fromfile("/tmp/attn_trace.bin", dtype=dt)
r = r[np.argsort(r["t"][:, 2])]
t = r["t"].astype(np.int64)
cut = np.where(np.diff(t[:, 2]) > 5000)[0] + 1   # launches: wait times more than 5 us apart
groups = np.split(np.arange(len(r)), cut)
nb = np.bincount([len(x) for x in groups]).argmax()
groups = [x for x in groups if len(x) == nb]
f0 = int(r["flags"][groups[0][0]])
print(f"{n} records, {len(groups)} launches of {nb} blocks (n_used {f0 & 255}, dsmem {(f0 >> 8) & 1}, "
      f"cluster {(f0 >> 9) & 31}, warps {(f0 >> 14) & 15}, keys ~{f0 >> 18}), prompt {prompt}")
rows = {k: [] for k in ["enter spread", "entry -> prologue done", "prologue -> wait resolved",
                        "wait -> q staged", "q staged -> tiles done (mean)", "q staged -> tiles done (max)",
                        "tiles -> block merge done", "merge -> end (mean)", "merge -> end (max)",
                        "wait -> last end (span)", "blocks' last tile done -> last end"]}
for x in groups:
    tt = t[x]
    rows["enter spread"].append(tt[:, 0].max() - tt[:, 0].min())
    rows["entry -> prologue done"].append((tt[:, 1] - tt[:, 0]).mean())
    rows["prologue -> wait resolved"].append((tt[:, 2] - tt[:, 1]).mean())
    rows["wait -> q staged"].append((tt[:, 3] - tt[:, 2]).mean())
    rows["q staged -> tiles done (mean)"].append((tt[:, 4] - tt[:, 3]).mean())
    rows["q staged -> tiles done (max)"].append((tt[:, 4] - tt[:, 3]).max())
    rows["tiles -> block merge done"].append((tt[:, 5] - tt[:, 4]).mean())
    rows["merge -> end (mean)"].append((tt[:, 6] - tt[:, 5]).mean())
    rows["merge -> end (max)"].append((tt[:, 6] - tt[:, 5]).max())
    rows["wait -> last end (span)"].append(tt[:, 6].max() - tt[:, 2].min())
    rows["blocks' last tile done -> last end"].append(tt[:, 6].max() - tt[:, 4].max())
print("µs, mean over launches (min, max)")
for k, v in rows.items():
    v = np.array(v) / 1e3
    print(f"  {k:38s} {v.mean():6.2f}  ({v.min():.2f}, {v.max():.2f})")
