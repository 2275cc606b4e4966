#!/usr/bin/env python3
"""Time libnanoqwen's INT4 GEMV per Qwen2.5 shape, f16-unpack variant (0) vs int8-activation dp4a variant (1).

    python3 bench/gpu_kernels_bench.py [--json OUT.json]

Each timing: nq_bench_gemv_int4 = `iters` back-to-back launches rotating over >512 MB of weight copies (so L2
never holds them), CUDA events, ms per launch. GB/s counts the weight + scale bytes read once per launch.
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


def shapes():
    for name, (h, i, nh, kv) in SIZES.items():
        d = h // nh
        yield f"{name} qkv", h + 2 * kv * d, h
        yield f"{name} o", h, h
        yield f"{name} gate", i, h
        yield f"{name} down", h, i


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--group", type=int, default=128)
    a = ap.parse_args()
    lib = load_library()
    rows = []
    for name, N, K in shapes():
        nbytes = N * K // 2 + N * (K // a.group) * 2
        r = {"shape": name, "N": N, "K": K, "bytes": nbytes}
        for v in (0, 1):
            ms = ctypes.c_float()
            rc = lib.nq_bench_gemv_int4(N, K, a.group, v, a.iters, ctypes.byref(ms))
            if rc != 0:
                raise SystemExit(f"{name} variant {v}: {lib.nq_last_error().decode()}")
            r[f"v{v}_us"] = ms.value * 1e3
            r[f"v{v}_GBps"] = nbytes / (ms.value * 1e-3) / 1e9
        rows.append(r)
        print(f"{name:11s} N={N:6d} K={K:6d}  f16: {r['v0_us']:8.2f} us {r['v0_GBps']:7.0f} GB/s   "
              f"dp4a: {r['v1_us']:8.2f} us {r['v1_GBps']:7.0f} GB/s", flush=True)
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
            json.dump({"gemv": rows, "gemm": gemm_rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
