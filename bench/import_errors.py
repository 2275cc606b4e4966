"""Requantization error of the import paths that are not lossless (GPTQ act-order / asymmetric, AWQ, GGUF types):
the source's 4/8-bit weights are dequantized exactly and quantized again by our symmetric INT4 quantizer.

Weights: Gaussian and Student-t (nu = 4, heavier tails, closer to trained LLM weights), shape (N, K) = (1024, 4096).
For every source: SNR (dB) and rel-RMSE of our layout-1 result against (a) the source's dequantized weights (what
nanoqwen-verify --source reports) and (b) the original float weights, next to (c) the source's own error vs the
original. Usage: PYTHONPATH=.:tests python bench/import_errors.py  (prints a markdown table).
"""
from __future__ import annotations

import math
import sys

import numpy as np

sys.path.insert(0, "tests")
from quant_sources import rtn_params, dequant  # noqa: E402  (GPTQ/AWQ rules, tests' independent packer)

from nanoqwen_quant.quantize import dequantize, quantize  # noqa: E402

N, K = 1024, 4096


def snr(ref, x):
    ref = ref.astype(np.float64)
    e = ref - x.astype(np.float64)
    s, n = float((ref * ref).sum()), float((e * e).sum())
    return (math.inf if n == 0 else 10 * math.log10(s / n)), math.sqrt(n / s)


def sources(w, rng):
    k = w.shape[1]
    out = {}
    gi = np.arange(k) // 128
    out["gptq sym g128 (Qwen Int4: lossless)"] = dequant(*rtn_params(w, 128, True, gi), gi)
    perm = gi[rng.permutation(k)]
    out["gptq sym g128 desc_act"] = dequant(*rtn_params(w, 128, True, perm), perm)
    out["gptq/awq asym g128"] = dequant(*rtn_params(w, 128, False, gi), gi)
    try:
        import gguf
        for t in ("Q8_0", "Q5_0", "Q4_1", "Q4_0"):
            qt = getattr(gguf.GGMLQuantizationType, t)
            out[f"gguf {t}"] = gguf.quants.dequantize(gguf.quants.quantize(w, qt), qt).reshape(w.shape)
    except ImportError:
        pass
    return out


def main():
    rng = np.random.default_rng(0)
    weights = {"gaussian": rng.standard_normal((N, K)).astype(np.float32) * 0.02,
               "student-t4": (rng.standard_t(4, (N, K)) * 0.02).astype(np.float32)}
    print("| weights | source | source vs orig SNR | ours g | mode | ours vs source SNR / relRMSE "
          "| ours vs orig SNR | direct RTN from orig SNR |")
    print("|---|---|---|---|---|---|---|---|")
    for wname, w in weights.items():
        for sname, src in sources(w, rng).items():
            s_orig = snr(w, src)[0]
            for g in (128, 64):
                for mode in ("rtn", "mse"):
                    q, s = quantize(src, g, mode)
                    ours = dequantize(q, s, g)
                    qd, sd = quantize(w, g, mode)
                    a, rel = snr(src, ours)
                    print(f"| {wname} | {sname} | {s_orig:.2f} | {g} | {mode} | {a:.2f} / {rel:.4f} "
                          f"| {snr(w, ours)[0]:.2f} | {snr(w, dequantize(qd, sd, g))[0]:.2f} |")


if __name__ == "__main__":
    main()
