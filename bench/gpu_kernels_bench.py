#!/usr/bin/env python3
"""Time libnanoqwen's INT4 GEMV per Qwen2.5 shape in the mode each projection uses, the prefill GEMM, and the
device's read bandwidth (the ceiling the GEMV's GB/s is read against), through libnanoqwen_testing.

    python3 bench/gpu_kernels_bench.py [--json OUT.json] [--layout 1|2] [--gemm-m 512]

Modes as in the decode step: qkv = f32 input + RMSNorm prologue + store, o / down = f16 input + residual add,
gate = SwiGLU over the gate and up matrices (2 x N x K read). Each timing: nq_bench_gemv_int4_mode = `iters`
back-to-back launches rotating over >512 MB of weight copies (so L2 never holds them), CUDA events, us per launch.
GB/s counts the weight + scale (+ zero-point, layout 2) bytes read once per launch. Then the prefill GEMM at M = 512
(--gemm-m) on the 7B shapes, after the mma.sync ceiling of the GPU (nq_bench_mma_peak); lines start with "gemm"
(bench/gpu_check.sh collects them). --layout 2 times the int4g layout-2 builds (zero points) on the same shapes.
The kernels that lost to these are timed by their own programs in csrc/dev/.
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
from nq_testing_lib import load_testing_library  # noqa: E402

MODES = {"qkv": 0, "o": 1, "gate": 2, "down": 1}   # 0 store (+RMSNorm), 1 residual add (f16 x), 2 SwiGLU


def shapes():
    for name, sh in QWEN25_SHAPES.items():
        yield f"{name} qkv", "qkv", sh.qkv_rows, sh.hidden
        yield f"{name} o", "o", sh.hidden, sh.n_heads * sh.head_dim
        yield f"{name} gate", "gate", sh.intermediate, sh.hidden
        yield f"{name} down", "down", sh.hidden, sh.intermediate


def _call(lib, what, rc):
    if rc != 0:
        raise SystemExit(f"{what}: {lib.nq_last_error().decode()}")


def read_bandwidth(lib) -> float:
    """GB/s of the fastest read-only stream (nq_bench_read_bandwidth over 1 GiB, best of 10)."""
    gbs = ctypes.c_float()
    _call(lib, "read bandwidth", lib.nq_bench_read_bandwidth(1 << 30, 10, ctypes.byref(gbs)))
    print(f"read bandwidth (16-byte nc loads, 1 GiB rotated): {gbs.value:.0f} GB/s", flush=True)
    return gbs.value


def gemm_bench(lib, group: int, M: int = 512, layout: int = 1) -> list[dict]:
    """us and TFLOP/s per 7B projection at M tokens (nq_bench_gemm_int4_multi: 20 back-to-back launches rotating over
    >256 MB of weight copies, CUDA events). 'gate+up' is the prefill's one launch over both matrices (2 segments);
    the per-layer sum uses it."""
    for blocks in (132, 264, 528):
        tf = ctypes.c_float()
        _call(lib, "mma peak", lib.nq_bench_mma_peak(blocks, 20000, ctypes.byref(tf)))
        print(f"gemm mma.sync m16n8k16 f16->f32 ceiling, {blocks} blocks x 8 warps x 8 chains: {tf.value:.0f} TFLOP/s",
              flush=True)
    sh = QWEN25_SHAPES["7B"]
    h, kvd = sh.hidden, sh.n_kv_heads * sh.head_dim
    rows = []
    for name, N, K, nseg in [("7B q", h, h, 1), ("7B k/v", kvd, h, 1), ("7B o", h, h, 1),
                             ("7B gate/up", sh.intermediate, h, 1), ("7B gate+up", sh.intermediate, h, 2),
                             ("7B down", h, sh.intermediate, 1)]:
        us = ctypes.c_float()
        _call(lib, f"gemm {name}", lib.nq_bench_gemm_int4_layout(M, N, K, group, nseg, layout, 20, ctypes.byref(us)))
        r = {"shape": name, "M": M, "N": N, "K": K, "segments": nseg, "us": us.value,
             "TFLOPs": 2 * M * N * K * nseg / (us.value * 1e-6) / 1e12}
        rows.append(r)
        print(f"gemm M={M} {name:10s} N={N:6d} K={K:6d} x{nseg}: {r['us']:7.1f} us {r['TFLOPs']:5.0f} TF/s", flush=True)
    per = sum(r["us"] * (2 if r["shape"] == "7B k/v" else 1) for r in rows if r["shape"] != "7B gate/up")
    print(f"gemm per 7B layer (q, k, v, o, gate+up, down) at M={M}: {per:.0f} us (x {sh.n_layers} = "
          f"{per * sh.n_layers / 1e3:.1f} ms)", flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--layout", type=int, default=1, choices=[1, 2], help="int4g layout (2: zero points)")
    ap.add_argument("--gemm-m", type=int, default=512, help="tokens of the GEMM timings")
    a = ap.parse_args()
    lib = load_testing_library()
    peak = read_bandwidth(lib)
    rows = []
    print(f"{'shape':11s} {'N':>6s} {'K':>6s}  {'us':>8s} {'GB/s':>6s} {'of read bw':>10s}")
    for name, kind, N, K in shapes():
        mats = 2 if kind == "gate" else 1
        nbytes = mats * (N * K // 2 + N * (K // a.group) * (2 if a.layout == 1 else 3))
        ms = ctypes.c_float()
        _call(lib, name, lib.nq_bench_gemv_int4_layout(N, K, a.group, MODES[kind], a.layout, a.iters, ctypes.byref(ms)))
        us = ms.value * 1e3
        r = {"shape": name, "mode": kind, "N": N, "K": K, "bytes": nbytes, "us": us, "GBps": nbytes / (us * 1e-6) / 1e9}
        rows.append(r)
        print(f"{name:11s} {N:6d} {K:6d}  {us:8.2f} {r['GBps']:6.0f} {r['GBps'] / peak:9.0%}", flush=True)
    layer = sum(r["us"] for r in rows if r["shape"].startswith("7B "))
    print(f"7B layer GEMVs (qkv + o + gate/up + down): {layer:.1f} us; x {QWEN25_SHAPES['7B'].n_layers} layers: "
          f"{layer * QWEN25_SHAPES['7B'].n_layers / 1e3:.3f} ms")
    gemm_rows = gemm_bench(lib, a.group, a.gemm_m, a.layout)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"read_GBps": peak, "layout": a.layout, "gemv": rows, "gemm": gemm_rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
