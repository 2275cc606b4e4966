#!/usr/bin/env python3
"""Time libnanoqwen's attention kernel alone, decode and prefill, per Qwen2.5 head layout and context length.

    python3 bench/attn_bench.py [--json OUT.json]

Each row: nq_bench_attention (libnanoqwen_testing) = `iters` launches captured in one CUDA graph (as the decode step is), K/V random f16
rotated over enough layers' caches to exceed L2 (HBM reads, as in a real step), best of 3 replays; us per launch.
Split parameters as a session derives them (csrc/src/session.cu) for each keys_per_split timed: decode
n_split = min(128, budget / n_kv, ceil(max_ctx / kps)) (8 up to --short-keys keys: the short-context graph) with the session's budget of one block an SM (other budgets
with --split-budget; a launch of more blocks than SMs runs attention.cu's 4-warp build); prefill (M = 512): the
prefill kernel (n_split 1, no splits).
A few prompt tokens after many keys (--few-tokens, 7B heads, at --batch-contexts keys): the prefill kernel
("prefill", n_split 1) against the decode kernel with the keys split ("split", n_split = nsplit_decode / M, as
session_prefill runs chunks of up to kSplitPrefillMaxTokens tokens): where the crossover lies.
GB/s counts the K and V bytes of one KV head group read once per launch (decode only).
--batch-rows R ...: also the batched decode step's attention (nq_bench_attention_batch: R sequences, one token each
at position n_pos - 1 of its own pages), 7B heads, at each --batch-splits count: the measurement behind batch.cu's
batch_attention_splits (about kBatchAttentionBlocksPerSm x SMs blocks a step, capped by 256 blocks a row).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "tests")]

from nanoqwen_format.shapes import QWEN25_SHAPES  # noqa: E402
from nq_testing_lib import driver_sm_count, load_testing_library, short_context_keys  # noqa: E402

LAYOUTS = {name: (QWEN25_SHAPES[name].n_heads, QWEN25_SHAPES[name].n_kv_heads, QWEN25_SHAPES[name].head_dim)
           for name in ("7B", "0.5B", "32B")}  # n_heads, n_kv, head_dim


def decode_split_count(budget: int, n_pos: int, max_ctx: int, kps: int, short_keys: int) -> int:
    """session.cu's decode split count: min(128, budget / n_kv, ceil(max_ctx / kps)); a step of at most short_keys
    keys (the short-context graph, --short-keys) runs 8 splits (the power of two <= that below)"""
    n = max(1, min(128, budget, (max_ctx + kps - 1) // kps))
    if short_keys and n_pos <= short_keys:
        p = 1
        while 2 * p <= min(8, n):
            p *= 2
        return p
    return n


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--iters", type=int, default=56)
    ap.add_argument("--decode-kps", type=int, nargs="+", default=[32, 64, 128], help="keys per split to time (decode)")
    ap.add_argument("--split-budget", type=int, nargs="+", default=None,
                    help="decode: blocks per launch the split count is capped by (default and the session: the SM count)")
    ap.add_argument("--short-keys", type=int, default=None,
                    help="decode: contexts of at most this many keys time the session's short-context graph's launch "
                         "(8 splits, in clusters where the library has them; default: the session's bound for the "
                         "layout's head size, kAttnMaxCluster x attn_cluster_keys_per_block(D)); 0: never")
    ap.add_argument("--contexts", type=int, nargs="+", default=[65, 577, 2048, 8192], help="decode key counts")
    ap.add_argument("--batch-rows", type=int, nargs="*", default=[], help="batched decode: sequences per step")
    ap.add_argument("--batch-splits", type=int, nargs="+", default=[1, 2, 4, 8, 16, 64],
                    help="batched decode: splits per (token, KV head) to time")
    ap.add_argument("--batch-contexts", type=int, nargs="+", default=[577, 2048], help="batched decode key counts")
    ap.add_argument("--few-tokens", type=int, nargs="*", default=[], help="prompt chunks of M tokens: both kernels")
    a = ap.parse_args()
    lib = load_testing_library()
    if a.split_budget is None:
        sms = driver_sm_count()
        if sms is None:
            raise SystemExit("attn_bench: the SM count could not be read (libcuda); pass --split-budget")
        a.split_budget = [sms]
    rows = []
    nh, nkv, d = LAYOUTS["7B"]
    for n_rows in a.batch_rows:
        for n_pos in a.batch_contexts:
            for nsplit in a.batch_splits:
                us = ctypes.c_float(0.0)
                rc = lib.nq_bench_attention_batch(nh, nkv, d, n_pos, n_rows, 32, nsplit, a.iters, ctypes.byref(us))
                if rc != 0:
                    raise SystemExit(f"batched attention {n_rows} rows {n_pos}: {lib.nq_last_error().decode()}")
                gbs = (n_rows * 2 * n_pos * nkv * d * 2) / (us.value * 1e-6) / 1e9
                rows.append({"layout": "7B", "mode": "batch", "n_pos": n_pos, "M": n_rows, "kps": 32,
                             "n_split": nsplit, "budget": 0, "us": us.value, "GBps": gbs})
                print(f"attn 7B    batch   n_pos={n_pos:5d} rows={n_rows:3d} n_split={nsplit:3d}: {us.value:8.2f} us"
                      f"  {gbs:7.0f} GB/s", flush=True)
    for m in a.few_tokens:
        for n_pos in a.batch_contexts:
            nsplit_decode = max(1, min(128, 256 // nkv, (n_pos + 128 + 31) // 32))
            for kind, nsplit in (("prefill", 1), ("split", max(1, nsplit_decode // m))):
                us = ctypes.c_float(0.0)
                rc = lib.nq_bench_attention(nh, nkv, d, n_pos, m, 32, nsplit, a.iters, ctypes.byref(us))
                if rc != 0:
                    raise SystemExit(f"attention {kind} M={m} {n_pos}: {lib.nq_last_error().decode()}")
                rows.append({"layout": "7B", "mode": "few-" + kind, "n_pos": n_pos, "M": m, "kps": 32,
                             "n_split": nsplit, "budget": 0, "us": us.value, "GBps": float("nan")})
                print(f"attn 7B    few {kind:7s} n_pos={n_pos:5d} M={m:3d} n_split={nsplit:3d}: {us.value:8.2f} us",
                      flush=True)
    for name, (nh, nkv, d) in LAYOUTS.items():
        cases = [("decode", n, 1, kps, b) for n in a.contexts for kps in a.decode_kps for b in a.split_budget] + \
                [("prefill", 512, 512, 32, 0)]
        for mode, n_pos, m, kps, budget in cases:
            max_ctx = n_pos + 128
            short_keys = short_context_keys(d) if a.short_keys is None else a.short_keys
            nsplit = decode_split_count(budget // nkv, n_pos, max_ctx, kps, short_keys) if mode == "decode" else 1
            us = ctypes.c_float(0.0)
            rc = lib.nq_bench_attention(nh, nkv, d, n_pos, m, kps, nsplit, a.iters, ctypes.byref(us))
            if rc != 0:
                raise SystemExit(f"attention {name} {mode} {n_pos}: {lib.nq_last_error().decode()}")
            gbs = (2 * n_pos * nkv * d * 2) / (us.value * 1e-6) / 1e9 if mode == "decode" else float("nan")
            rows.append({"layout": name, "mode": mode, "n_pos": n_pos, "M": m, "kps": kps, "n_split": nsplit, "budget": budget,
                         "us": us.value, "GBps": gbs})
            print(f"attn {name:5s} {mode:7s} n_pos={n_pos:5d} M={m:3d} kps={kps:3d} n_split={nsplit:3d}: {us.value:8.2f} us"
                  + (f"  {gbs:7.0f} GB/s" if mode == "decode" else ""), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
