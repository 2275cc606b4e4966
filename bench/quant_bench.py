#!/usr/bin/env python3
"""Quantizer benchmark: throughput of quantize (rtn, mse) / dequantize and the f16 cast, and SNR of rtn vs mse on
Gaussian weights and, when present, on the trained embedded model models/tiny-py/ (or --model DIR).

    python3 bench/quant_bench.py [--rows 18944 --cols 3584] [--threads 2] [--model DIR] [--skip-speed]

Prints a markdown table (paste into bench/RESULTS.md). Run it when the machine is otherwise idle.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nanoqwen_quant.cast import bf16_to_f32, to_f16_bits  # noqa: E402
from nanoqwen_quant.quantize import dequantize, quantize, set_threads, snr_db  # noqa: E402


CLOCK = time.perf_counter                  # wall clock; --cpu-time: process CPU time (single thread on a busy box)


def best_of(fn, reps=3):
    fn()                                    # warm-up (numba compile / page faults)
    best = float("inf")
    for _ in range(reps):
        t = CLOCK()
        fn()
        best = min(best, CLOCK() - t)
    return best


def speed(rows, cols, threads):
    set_threads(threads)
    rng = np.random.default_rng(0)
    w = (0.02 * rng.standard_normal((rows, cols), dtype=np.float32))
    n = w.size
    out = []
    for mode, g in [("rtn", 128), ("rtn", 64), ("mse", 128)]:
        sub = w if mode == "rtn" else w[: max(1, rows // 16)]     # mse is ~20x slower: time a slice
        t = best_of(lambda: quantize(sub, g, mode), reps=3 if mode == "rtn" else 1)
        out.append((f"quantize {mode} g{g}", sub.size / t / 1e9))
    q, s = quantize(w, 128, "rtn")
    out.append(("dequantize g128", n / best_of(lambda: dequantize(q, s, 128)) / 1e9))
    raw = (w.view(np.uint32) >> 16).astype(np.uint16)
    out.append(("bf16 → f32", n / best_of(lambda: bf16_to_f32(raw)) / 1e9))
    buf = np.empty(raw.shape, np.uint16)
    out.append(("bf16 → f16 (checked)", n / best_of(lambda: to_f16_bits(raw, out=buf)) / 1e9))
    return out


def snr_rows(weights: dict[str, np.ndarray], label: str):
    rows = []
    for g in (128, 64):
        res = {}
        for mode in ("rtn", "mse"):
            sig = err = 0.0
            for w in weights.values():
                if w.ndim != 2 or w.shape[1] % g:
                    continue
                d = dequantize(*quantize(w, g, mode), g).astype(np.float64)
                sig += float(np.sum(w.astype(np.float64) ** 2))
                err += float(np.sum((w - d) ** 2))
            res[mode] = 10 * np.log10(sig / err)
        rows.append((label, g, res["rtn"], res["mse"], res["mse"] - res["rtn"]))
    return rows


def load_linears(model_dir: Path) -> dict[str, np.ndarray]:
    from nanoqwen_quant.convert import is_int4_linear
    from nanoqwen_quant.load import load_checkpoint
    ck = load_checkpoint(model_dir)
    return {n: ck.read_f32(n) for n in ck.tensors if is_int4_linear(n)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=18944)
    ap.add_argument("--cols", type=int, default=3584)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--model", default=str(ROOT / "models" / "tiny-py"))
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--cpu-time", action="store_true", help="time with process CPU time (use with --threads 1 "
                    "when other jobs share the cores: it excludes time spent waiting for a core)")
    a = ap.parse_args()
    global CLOCK
    if a.cpu_time:
        CLOCK = time.process_time
    if not a.skip_speed:
        clock = "CPU time" if a.cpu_time else "wall"
        print(f"| kernel ({a.rows}x{a.cols} f32, {a.threads} threads, {clock}) | G weights/s |\n|---|---|")
        for name, gps in speed(a.rows, a.cols, a.threads):
            print(f"| {name} | {gps:.2f} |")
        print()
    rng = np.random.default_rng(1)
    gauss = {"g": rng.standard_normal((4096, 4096), dtype=np.float32)}
    rows = snr_rows(gauss, "Gaussian 4096x4096")
    md = Path(a.model)
    if (md / "config.json").exists():
        lin = load_linears(md)
        rows += snr_rows(lin, f"{md.name} linears ({len(lin)} tensors, {sum(w.size for w in lin.values())/1e6:.1f} M)")
    print("| weights | group | rtn SNR dB | mse SNR dB | mse − rtn dB |\n|---|---|---|---|---|")
    for label, g, r, m, d in rows:
        print(f"| {label} | {g} | {r:.2f} | {m:.2f} | {d:+.2f} |")


if __name__ == "__main__":
    main()
