#!/usr/bin/env python3
"""Time libnanoqwen's INT4 GEMV per Qwen2.5 shape and per kernel variant, in the mode each projection uses.

    python3 bench/gpu_kernels_bench.py [--json OUT.json]

Variants (kernels.h GemvArgs::variant): v2 = split-K kernel with the cross-row pipeline, 2 blocks/SM (variant 0,
the default), v2b3 = the same at 3 blocks/SM (variant 3), v1 = the first kernel (variant 2), dp4a = int8
activations on the v1 kernel (variant 1), v2q8 = int8 activations + dp4a on the v2 kernel (variant 4). Modes as in the decode step: qkv = f32 input + RMSNorm prologue + store, o / down = f16 input +
residual add, gate = SwiGLU over the gate and up matrices (2 x N x K read). Each timing: nq_bench_gemv_int4_mode =
`iters` back-to-back launches rotating over >512 MB of weight copies (so L2 never holds them), CUDA events, us per
launch. GB/s counts the weight + scale bytes read once per launch.
Then the prefill GEMM at M = 512 on the 7B shapes, every INT4 GEMM kernel (GEMM_VARIANTS) on the same data, after
the mma.sync ceiling of the GPU (nq_bench_mma_peak); lines start with "gemm" (bench/gpu_check.sh collects them).
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


VARIANTS = {"v2": 0, "v2b3": 3, "v1": 2, "dp4a": 1, "v2q8": 4}
MODES = {"qkv": 0, "o": 1, "gate": 2, "down": 1}   # 0 store (+RMSNorm), 1 residual add (f16 x), 2 SwiGLU


def shapes():
    for name, (h, i, nh, kv) in SIZES.items():
        d = h // nh
        yield f"{name} qkv", "qkv", h + 2 * kv * d, h
        yield f"{name} o", "o", h, h
        yield f"{name} gate", "gate", i, h
        yield f"{name} down", "down", h, i


# INT4 prefill GEMM kernels (gemm.cu gemm_multi_variant): mma = mma.sync m16n8k16, 3 stages, 2 blocks/SM, serial
# split-K where the grid leaves SMs idle (0, the default); nosplit = the same without split-K (3); mma4 = 4 stages,
# 1 block/SM, no split (2); wmma = the first kernel (1)
GEMM_VARIANTS = {"mma": 0, "nosplit": 3, "mma4": 2, "wmma": 1}


def gemm_bench(lib, group: int, M: int = 512) -> list[dict]:
    """us and TFLOP/s per 7B projection at M tokens for each GEMM variant (nq_bench_gemm_int4_variants: 20
    back-to-back launches rotating over >256 MB of weight copies, CUDA events). 'gate+up' is the prefill's one
    launch over both matrices (2 segments); the per-layer sum uses it."""
    f = lib.nq_bench_gemm_int4_variants
    f.restype = ctypes.c_int
    f.argtypes = [ctypes.c_int32] * 7 + [ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_float)]
    pk = lib.nq_bench_mma_peak
    pk.restype = ctypes.c_int
    pk.argtypes = [ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(ctypes.c_float)]
    for blocks in (132, 264, 528):
        tf = ctypes.c_float()
        if pk(blocks, 20000, ctypes.byref(tf)) != 0:
            raise SystemExit(f"mma peak: {lib.nq_last_error().decode()}")
        print(f"gemm mma.sync m16n8k16 f16->f32 ceiling, {blocks} blocks x 8 warps x 8 chains: {tf.value:.0f} TFLOP/s",
              flush=True)
    h, i, nh, kv = SIZES["7B"]
    names = list(GEMM_VARIANTS)
    ids = (ctypes.c_int32 * len(names))(*GEMM_VARIANTS.values())
    rows = []
    for name, N, K, nseg in [("7B q", h, h, 1), ("7B k/v", kv * (h // nh), h, 1), ("7B o", h, h, 1),
                             ("7B gate/up", i, h, 1), ("7B gate+up", i, h, 2), ("7B down", h, i, 1)]:
        us = (ctypes.c_float * len(names))()
        if f(M, N, K, group, nseg, 20, len(names), ids, us) != 0:
            raise SystemExit(f"gemm {name}: {lib.nq_last_error().decode()}")
        r = {"shape": name, "M": M, "N": N, "K": K, "segments": nseg}
        for n, t in zip(names, us):
            r[f"{n}_us"] = t
            r[f"{n}_TFLOPs"] = 2 * M * N * K * nseg / (t * 1e-6) / 1e12
        rows.append(r)
        print(f"gemm M={M} {name:10s} N={N:6d} K={K:6d} x{nseg}: " +
              "  ".join(f"{n} {r[n + '_us']:7.1f} us {r[n + '_TFLOPs']:5.0f} TF/s" for n in names), flush=True)
    per = {n: sum(r[f"{n}_us"] * (2 if r["shape"] == "7B k/v" else 1) for r in rows if r["shape"] != "7B gate/up")
           for n in names}
    print("gemm per 7B layer (q, k, v, o, gate+up, down) at M=%d, us: " % M +
          ", ".join(f"{n} {v:.0f} (x 28 = {v * 28 / 1e3:.1f} ms)" for n, v in per.items()), flush=True)
    return rows


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
    # prefill GEMM (tensor cores) at M = 512 tokens on the 7B shapes, every INT4 GEMM kernel on the same data
    gemm_rows = gemm_bench(lib, a.group)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"gemv": rows, "gemm": gemm_rows, "variants": VARIANTS, "gemm_variants": GEMM_VARIANTS}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
