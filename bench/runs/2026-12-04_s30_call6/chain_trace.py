"""Session 30 call 6 (experiment, never main): one 7B decode layer's q/k/v -> attention -> o -> gate/up hand-overs,
from the product kernels' own %globaltimer records (thread 0 of every block), at a short and a long prompt. Needs a
library built from a scratch copy of main with both traces written in (make_attn_trace.py here for attention.cu,
bench/runs/2026-12-03_s25_prep/make_frag_trace.py for the decode GEMVs; optionally
bench/runs/2026-12-04_s30_prep/make_merge_trace.py for the inside of the global merge, or from 3de48ba on for the
merge kernel's blocks: their records have t[4] = 0). Every time is in µs after
q/k/v's last block ended (Q): what attention and o do before and after it, mean over layers and decode steps.
Usage: NANOQWEN_LIB=<that library> python3 chain_trace.py FILE.nanoqwen PROMPT_TOKENS"""
import os
import sys

import numpy as np

_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(_here, "..", ".."), os.path.join(_here, "..", "..", "..")]   # bench/, the repository
from trace_inject import traced_decode_tags  # noqa: E402

path, prompt = sys.argv[1], int(sys.argv[2])
counts = traced_decode_tags(path, prompt, {"attn": "/tmp/attn_trace.bin", "frag": "/tmp/frag_trace.bin",
                                           "amerge": "/tmp/amerge_trace.bin"}, 6, optional=("amerge",))
n_attn, n_frag, n_merge = counts["attn"], counts["frag"], counts.get("amerge", 0)   # prefill + 5 decode steps

fd = np.dtype([("t", "<u8", 7), ("kind", "<u4"), ("block", "<u4"), ("sm", "<u4"), ("pad", "<u4")])
ad = np.dtype([("t", "<u8", 7), ("h", "<u4"), ("split", "<u4"), ("sm", "<u4"), ("flags", "<u4")])
fr = np.fromfile("/tmp/frag_trace.bin", dtype=fd)
ar = np.fromfile("/tmp/attn_trace.bin", dtype=ad)
ar = ar[(ar["flags"] >> 18) >= prompt]   # decode steps only (a prefill chunk's attention has fewer keys)
md = np.dtype([("t", "<u8", 7), ("h", "<u4"), ("n_used", "<u4"), ("sm", "<u4"), ("tok", "<u4")])
mt = np.fromfile("/tmp/amerge_trace.bin", dtype=md)["t"][:, :5].astype(np.int64) if n_merge else np.zeros((0, 5), np.int64)
merge_kernel = len(mt) > 0 and not mt[:, 4].any()   # attn_merge_kernel's 4 points (3de48ba on), not the last block's 5

launches = []   # (name, t[:, 7] int64 with columns entry, wait, ..., end at `end_col`)
mode, kc, gx = fr["kind"] >> 28, (fr["kind"] >> 14) & 0x3FFF, fr["kind"] & 0x3FFF
for key in sorted(set(zip(mode.tolist(), kc.tolist(), gx.tolist()))):
    m, k, x = key
    recs = fr[(mode == m) & (kc == k) & (gx == x)]
    recs = recs[np.argsort(recs["t"][:, 0])]
    nb = int(recs["block"].max()) + 1
    nm = {0: "qkv", 1: "o" if k * 128 < 8192 else "down", 2: "gate/up"}.get(m, str(m))
    for i in range(0, len(recs) - nb + 1, nb):
        launches.append((nm, recs["t"][i:i + nb].astype(np.int64)))
at = ar[np.argsort(ar["t"][:, 0])]["t"].astype(np.int64)
cut = np.where(np.diff(at[:, 0]) > 5000)[0] + 1   # launches: entries more than 5 µs apart
for grp in np.split(np.arange(len(at)), cut):
    launches.append(("attn", at[grp]))
launches.sort(key=lambda L: int(L[1][:, 0].min()))
print(f"prompt {prompt}: {n_attn} attention records, {n_frag} GEMV records, {n_merge} merge records, "
      f"{len(launches)} launches")

rows = {}


def add(k, v):
    rows.setdefault(k, []).append(v / 1e3)


for i in range(1, len(launches) - 2):
    if launches[i][0] != "attn" or launches[i - 1][0] != "qkv" or launches[i + 1][0] != "o":
        continue
    q, a, o = launches[i - 1][1], launches[i][1], launches[i + 1][1]
    gu = launches[i + 2][1] if launches[i + 2][0] == "gate/up" else None
    Q = q[:, 4].max()
    A = a[:, 6].max()
    add("qkv: wait resolved (min)", q[:, 1].min() - Q)
    add("qkv: first block ended", q[:, 4].min() - Q)
    add("attn: blocks", len(a) * 1e3)
    add("attn: first entry", a[:, 0].min() - Q)
    add("attn: mean entry", a[:, 0].mean() - Q)
    add("attn: last entry", a[:, 0].max() - Q)
    add("attn: wait resolved (min)", a[:, 2].min() - Q)
    add("attn: wait resolved (max)", a[:, 2].max() - Q)
    add("attn: q staged (mean)", a[:, 3].mean() - Q)
    add("attn: tiles done (mean)", a[:, 4].mean() - Q)
    add("attn: tiles done (max)", a[:, 4].max() - Q)
    add("attn: warps' O in smem (max)", a[:, 5].max() - Q)
    add("attn: first block ended", a[:, 6].min() - Q)
    add("attn: last block ended (A)", A - Q)
    # the global merge's last blocks of this launch (one a KV head): entered, atomic done, (m, l) in, weights, end;
    # or the merge kernel's blocks (one a query head): entered, wait resolved, partials folded, end
    sel = (mt[:, 0] >= a[:, 0].min()) & (mt[:, 0] <= A + 1000)
    if sel.any() and merge_kernel:
        m = mt[sel]
        add("merge kernel: blocks", len(m) * 1e3)
        add("merge kernel: last entry", m[:, 0].max() - Q)
        add("merge kernel: wait resolved (min)", m[:, 1].min() - Q)
        add("merge kernel: wait resolved (max)", m[:, 1].max() - Q)
        add("merge kernel: partials folded (max)", m[:, 2].max() - Q)
        add("merge kernel: last block ended (M)", m[:, 3].max() - Q)
    elif sel.any():
        m = mt[sel]
        for col, what in enumerate(["entered", "atomic + barrier done", "(m, l) loaded", "weights done",
                                    "thread 0's outputs written"]):
            add(f"merge (last blocks): {what} (max)", m[:, col].max() - Q)
    add("o: blocks", len(o) * 1e3)
    add("o: blocks entered before A", (o[:, 0] < A).sum() * 1e3)
    add("o: first entry", o[:, 0].min() - Q)
    add("o: last entry", o[:, 0].max() - Q)
    add("o: wait resolved (min)", o[:, 1].min() - Q)
    add("o: wait resolved (max)", o[:, 1].max() - Q)
    add("o: x staged (mean)", o[:, 2].mean() - Q)
    add("o: dot done (mean)", o[:, 3].mean() - Q)
    add("o: dot done (max)", o[:, 3].max() - Q)
    add("o: last block ended", o[:, 4].max() - Q)
    if gu is not None:
        add("gate/up: wait resolved (min)", gu[:, 1].min() - Q)
print(f"µs after q/k/v's last block ended; mean over {len(rows.get('attn: blocks', []))} layers x steps "
      "(min, max); 'blocks' rows are counts")
for k, v in rows.items():
    v = np.array(v)
    print(f"  {k:50s} {v.mean():8.2f}  ({v.min():.2f}, {v.max():.2f})")
