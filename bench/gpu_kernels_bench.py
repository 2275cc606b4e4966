#!/usr/bin/env python3
"""Time libnanoqwen's INT4 GEMV per Qwen2.5 shape and per kernel variant, in the mode each projection uses.

    python3 bench/gpu_kernels_bench.py [--json OUT.json]

Variants (kernels.h GemvArgs::variant): v2 = split-K kernel with the cross-row pipeline, 2 blocks/SM (variant 0,
the default), v2b3 = the same at 3 blocks/SM (variant 3), v1 = the first kernel (variant 2), dp4a = int8
activations (variant 1). Modes as in the decode step: qkv = f32 input + RMSNorm prologue + store, o / down = f16 input +
residual add, gate = SwiGLU over the gate and up matrices (2 x N x K read). Each timing: nq_bench_gemv_int4_mode =
`iters` back-to-back launches rotating over >512 MB of weight copies (so L2 never holds them), CUDA events, us per
launch. GB/s counts the weight + scale bytes read once per launch.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nanoqwen_rt.cuda_backend import load_library  # noqa: E402

SIZES = {"0.5B": (896, 4864, 14, 2), "1.5B": (1536, 8960, 12, 2), "3B": (2048, 11008, 16, 2),
         "7B": (3584, 18944, 28, 4), "14B": (5120, 13824, 40, 8), "32B": (5120, 27648, 40, 8)}


VARIANTS = {"v2": 0, "v2b3": 3, "v1": 2, "dp4a": 1}
MODES = {"qkv": 0, "o": 1, "gate": 2, "down": 1}   # 0 store (+RMSNorm), 1 residual add (f16 x), 2 SwiGLU


def shapes():
    for name, (h, i, nh, kv) in SIZES.items():
        d = h // nh
        yield f"{name} qkv", "qkv", h + 2 * kv * d, h
        yield f"{name} o", "o", h, h
        yield f"{name} gate", "gate", i, h
        yield f"{name} down", "down", h, i


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--group", type=int, default=128)
    a = ap.parse_args()
    lib = load_library()
    rows = []
    names = list(VARIANTS)
    ids = (ctypes.c_int32 * len(names))(*VARIANTS.values())
    print(f"{'shape':11s} {'N':>6s} {'K':>6s}  " + "  ".join(f"{n:>16s}" for n in names) + "   (us, GB/s)")
    for name, kind, N, K in shapes():
        mats = 2 if kind == "gate" else 1
        nbytes = mats * (N * K // 2 + N * (K // a.group) * 2)
        r = {"shape": name, "mode": kind, "N": N, "K": K, "bytes": nbytes}
        ms = (ctypes.c_float * len(names))()
        rc = lib.nq_bench_gemv_int4_mode(N, K, a.group, MODES[kind], a.iters, len(names), ids, ms)
        if rc != 0:
            raise SystemExit(f"{name}: {lib.nq_last_error().decode()}")
        for n, t in zip(names, ms):
            r[f"{n}_us"] = t * 1e3
            r[f"{n}_GBps"] = nbytes / (t * 1e-3) / 1e9
        rows.append(r)
        print(f"{name:11s} {N:6d} {K:6d}  " + "  ".join(f"{r[n + '_us']:7.2f} {r[n + '_GBps']:6.0f}" +
                                                       " " * 2 for n in names), flush=True)
    layer = {n: sum(r[f"{n}_us"] for r in rows if r["shape"].startswith("7B ")) for n in names}
    print("7B layer GEMVs (qkv + o + gate/up + down), us: " + ", ".join(f"{n} {v:.1f}" for n, v in layer.items()) +
          f"; x 28 layers, v2 vs v1: {layer['v2'] * 28 / 1e3:.3f} vs {layer['v1'] * 28 / 1e3:.3f} ms")
    # prefill GEMM (tensor cores) at M = 512 tokens on the 7B shapes
    h, i, nh, kv = SIZES["7B"]
    gemm_rows = []
    for name, N, K in [("7B q", h, h), ("7B k/v", kv * (h // nh), h), ("7B o", h, h), ("7B gate/up", i, h),
                       ("7B down", h, i)]:
        ms = ctypes.c_float()
        rc = lib.nq_bench_gemm_int4(512, N, K, a.group, 20, ctypes.byref(ms))
        if rc != 0:
            raise SystemExit(f"gemm {name}: {lib.nq_last_error().decode()}")
        tf = 2 * 512 * N * K / (ms.value * 1e-3) / 1e12
        gemm_rows.append({"shape": name, "M": 512, "N": N, "K": K, "us": ms.value * 1e3, "TFLOPs": tf})
        print(f"gemm M=512 {name:10s} N={N:6d} K={K:6d}: {ms.value * 1e3:8.1f} us {tf:6.1f} TFLOP/s", flush=True)
    layer = sum(r["us"] * (2 if r["shape"] in ("7B k/v", "7B gate/up") else 1) for r in gemm_rows)
    print(f"gemm per 7B layer (q,k,v,o,gate,up,down) at M=512: {layer:.0f} us; x 28 layers = {layer * 28 / 1e3:.1f} ms")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"gemv": rows, "gemm": gemm_rows, "variants": VARIANTS}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
