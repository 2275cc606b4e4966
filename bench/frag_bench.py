#!/usr/bin/env python3
"""The INT4 fragment order (csrc/src/int4_frag.cuh) against the file order, per Qwen2.5-7B layer, in one process
(libnanoqwen_testing; Hopper with the sm_90a build):

* the decode GEMV per projection in the mode the decode step uses (nq_bench_gemv_int4_mode against
  nq_bench_gemv_int4_frag: the same random weights, x and rotation over > 512 MB of copies);
* the GEMMs of one layer at 1 / 5 / 16 / 32 / 64 / 128 / 512 tokens (nq_bench_gemm_int4_frag_layer: q/k/v, o, gate/up
  through gemm_swiglu, down, both orders on the same weights).

    python3 bench/frag_bench.py [--json OUT.json] [--tokens 1 5 16 32 64 128 512]
    python3 bench/frag_bench.py --plans [--tokens 16 32 64]: the few-token GEMM per 7B shape under every launch plan
        (1 / 2 / 4 m-tiles of 16 tokens x 1-16 splits: the label is rows x splits; nq_bench_gemm_int4_frag_plans),
        and the product's rule (frag_splits)
    python3 bench/frag_bench.py --gemv-plans [--shape 14B]: the decode GEMV per shape of one Qwen2.5 size (default 7B)
        under every launch plan (4 / 8 warps x 1-16 splits; nq_bench_gemv_int4_frag_plans) against the product's
        (frag_plan, through gemv())
    python3 bench/frag_bench.py --gemv-waves: the 7B gate/up and down GEMVs at row counts around the 7B shape (the
        same K, every plan): time a tile against blocks an SM, i.e. whether an SM's share of the blocks (5 or 4 of
        gate/up's 592 on 132 SMs) sets the kernel's time rather than its bytes
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


def _call(lib, what, rc):
    if rc != 0:
        raise SystemExit(f"frag_bench: {what}: {lib.nq_last_error().decode()}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json")
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--tokens", type=int, nargs="+",
                    help="token counts (default 1 5 16 32 64 128 512; with --plans 16 32 48 64)")
    ap.add_argument("--plans", action="store_true", help="time every launch plan of the few-token GEMM")
    ap.add_argument("--gemv-plans", action="store_true", help="time every launch plan of the decode GEMV")
    ap.add_argument("--gemv-waves", action="store_true", help="time gate/up and down at row counts around 7B's")
    ap.add_argument("--shape", default="7B", choices=sorted(QWEN25_SHAPES),
                    help="the Qwen2.5 size whose GEMV shapes --gemv-plans times (default 7B)")
    a = ap.parse_args()
    lib = load_testing_library()
    if not lib.nq_test_fragment_order_available():
        raise SystemExit("frag_bench: the fragment order is not used on this GPU / build")
    if a.plans:
        return plans(lib, a)
    if a.gemv_plans:
        return gemv_plans(lib, a)
    if a.gemv_waves:
        return gemv_waves(lib, a)
    rows = gemv_rows()
    out = {"gemv": {}, "gemm": {}}
    tot_file = tot_frag = 0.0
    for name, (N, K) in rows.items():
        ms, us = ctypes.c_float(), ctypes.c_float()
        _call(lib, f"gemv {name}", lib.nq_bench_gemv_int4_mode(N, K, a.group, MODES[name], a.iters, ctypes.byref(ms)))
        _call(lib, f"gemv frag {name}", lib.nq_bench_gemv_int4_frag(N, K, a.group, MODES[name], a.iters, ctypes.byref(us)))
        f, g = ms.value * 1e3, us.value
        tot_file += f
        tot_frag += g
        out["gemv"][name] = {"file_us": f, "frag_us": g}
        print(f"gemv 7B {name:5s} {N:6d} x {K:6d}: file order {f:7.2f} us, fragment order {g:7.2f} us ({g / f - 1:+.1%})")
    print(f"gemv 7B layer: file order {tot_file:.1f} us, fragment order {tot_frag:.1f} us ({tot_frag / tot_file - 1:+.1%})")
    for M in a.tokens or [1, 5, 16, 32, 64, 128, 512]:
        uf, ul = ctypes.c_float(), ctypes.c_float()
        _call(lib, f"gemm layer M={M}", lib.nq_bench_gemm_int4_frag_layer(M, a.group, 20, ctypes.byref(uf), ctypes.byref(ul)))
        out["gemm"][M] = {"file_us": ul.value, "frag_us": uf.value}
        print(f"gemm 7B layer M={M:4d}: file order {ul.value:8.1f} us, fragment order {uf.value:8.1f} us "
              f"({uf.value / ul.value - 1:+.1%})")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


def gemv_rows(shape: str = "7B") -> dict:
    """(N, K) of each decode GEMV of a Qwen2.5 layer of size `shape`, by the name MODES uses."""
    sh = QWEN25_SHAPES[shape]
    return {"qkv": (sh.qkv_rows, sh.hidden), "o": (sh.hidden, sh.n_heads * sh.head_dim),
            "gate": (sh.intermediate, sh.hidden), "down": (sh.hidden, sh.intermediate)}


def plans(lib, a) -> int:
    """Every (token rows a block, splits) plan per 7B shape and M, the best per shape, and the layer's sum of bests."""
    names = ["qkv", "o", "gate/up", "down"]
    out = {}
    for M in a.tokens or [16, 32, 48, 64]:
        best_sum = 0.0
        for shape, name in enumerate(names):
            us = (ctypes.c_float * 15)()
            _call(lib, f"plans {name} M={M}", lib.nq_bench_gemm_int4_frag_plans(shape, M, a.group, 50, us))
            grid = {f"{16 * mt}x{s}": round(us[5 * i + j], 2) for i, mt in enumerate((1, 2, 4))
                    for j, s in enumerate((1, 2, 4, 8, 16)) if us[5 * i + j] > 0}
            best = min(grid, key=grid.get)
            best_sum += grid[best]
            out[f"{name} M={M}"] = grid
            print(f"plans 7B {name:7s} M={M:2d}: best {best} {grid[best]:6.1f} us | " +
                  " ".join(f"{k} {v:.1f}" for k, v in grid.items()))
        print(f"plans 7B layer M={M:2d}: sum of the best plans {best_sum:.1f} us")
        uf, ul = ctypes.c_float(), ctypes.c_float()
        _call(lib, f"gemm layer M={M}",
              lib.nq_bench_gemm_int4_frag_layer(M, a.group, 20, ctypes.byref(uf), ctypes.byref(ul)))
        print(f"plans 7B layer M={M:2d}: the product's rule {uf.value:.1f} us")
        out[f"layer M={M}"] = {"best_sum": best_sum, "rule": uf.value}
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


def gemv_plan_grid(lib, what, N, K, mode, iters) -> dict:
    """µs of the decode GEMV (N x K, mode) under every launch plan the testing library times (4 / 8 warps x 1-16
    splits), keyed "w{warps}s{splits}"; plans it skips (the SwiGLU's 8-warp ones, splits > chunks) are left out."""
    us = (ctypes.c_float * 10)()
    _call(lib, what, lib.nq_bench_gemv_int4_frag_plans(N, K, mode, iters, us))
    return {f"w{w}s{1 << j}": round(us[5 * i + j], 2) for i, w in enumerate((4, 8)) for j in range(5)
            if us[5 * i + j] > 0}


def gemv_plans(lib, a) -> int:
    """Every (warps, splits) plan of the decode GEMV per shape of a.shape's layer, the best per shape and the product's
    plan."""
    rows = gemv_rows(a.shape)
    out, best_sum, prod_sum = {}, 0.0, 0.0
    for name, (N, K) in rows.items():
        grid = gemv_plan_grid(lib, f"gemv plans {name}", N, K, MODES[name], a.iters)
        prod = ctypes.c_float()
        _call(lib, f"gemv frag {name}",
              lib.nq_bench_gemv_int4_frag(N, K, a.group, MODES[name], a.iters, ctypes.byref(prod)))
        best = min(grid, key=grid.get)
        best_sum += grid[best]
        prod_sum += prod.value
        out[name] = {"plans": grid, "product": prod.value}
        print(f"gemv plans {a.shape} {name:5s}: product {prod.value:6.2f} us, best {best} {grid[best]:6.2f} | " +
              " ".join(f"{k} {v:.2f}" for k, v in grid.items()))
    print(f"gemv plans {a.shape} layer: product {prod_sum:.1f} us, sum of the best plans {best_sum:.1f} us")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


def gemv_waves(lib, a) -> int:
    """gate/up (SwiGLU, K = hidden) and down (K = intermediate) at tile counts around the 7B's (gate/up: 32 rows of
    intermediate a 64-row tile of gate and up; down: 64 output rows a tile), every plan: us, and us per tile. If an
    SM's block count set the time, us would step with ceil(blocks / SMs), not grow with the tiles."""
    sh = QWEN25_SHAPES["7B"]
    cases = [("gate", sh.hidden, 32, (528, 560, 592, 624, 660)), ("down", sh.intermediate, 64, (33, 44, 56, 66, 88))]
    out = {}
    for name, K, rows_a_tile, tile_counts in cases:
        for tiles in tile_counts:
            N = tiles * rows_a_tile
            grid = gemv_plan_grid(lib, f"gemv waves {name} {tiles}", N, K, MODES[name], a.iters)
            out[f"{name} {tiles}"] = grid
            print(f"gemv waves {name} tiles {tiles:4d} (N {N:6d}): " +
                  " ".join(f"{k} {v:.2f} ({v / tiles * 1e3:.1f} ns/tile)" for k, v in grid.items()))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
