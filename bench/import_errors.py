"""Requantization error of the import paths that are not lossless (GPTQ act-order / asymmetric, AWQ, GGUF types):
the source's 4/8-bit weights are dequantized exactly and quantized again by our symmetric INT4 quantizer.

Weights: Gaussian and Student-t (nu = 4, heavier tails, closer to trained LLM weights), shape (N, K) = (1024, 4096),
and the embedded trained model's 28 linears (models/tiny-py; SNR over all of them together).
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


class Acc:
    """Σref², Σerr² over several tensors → one SNR / rel-RMSE for a whole model."""
    def __init__(self):
        self.s = self.e = 0.0

    def add(self, ref, x):
        ref = ref.astype(np.float64)
        d = ref - x.astype(np.float64)
        self.s += float((ref * ref).sum())
        self.e += float((d * d).sum())

    def snr(self):
        return (math.inf if self.e == 0 else 10 * math.log10(self.s / self.e)), math.sqrt(self.e / self.s)


def trained_linears(path="models/tiny-py"):
    """The embedded model's trained linear weights (all 28 of them), float32, when the checkout has it."""
    from pathlib import Path
    if not (Path(path) / "model.safetensors").exists():
        return []
    from safetensors.numpy import load_file
    sd = load_file(str(Path(path) / "model.safetensors"))
    return [v.astype(np.float32) for k, v in sorted(sd.items()) if k.endswith("_proj.weight")]


def main():
    rng = np.random.default_rng(0)
    weights = {"gaussian": [rng.standard_normal((N, K)).astype(np.float32) * 0.02],
               "student-t4": [(rng.standard_t(4, (N, K)) * 0.02).astype(np.float32)],
               "tiny-py (trained, 28 linears)": trained_linears()}
    print("| weights | source | source vs orig SNR | ours g | mode | ours vs source SNR / relRMSE "
          "| ours vs orig SNR | direct from orig SNR |")
    print("|---|---|---|---|---|---|---|---|")
    for wname, ws in weights.items():
        if not ws:
            continue
        per = [sources(w, rng) for w in ws]                      # per tensor: {source name: values}
        for sname in per[0]:
            src_acc = Acc()
            for w, sr in zip(ws, per):
                src_acc.add(w, sr[sname])
            for g in (128, 64):
                for mode in ("rtn", "mse"):
                    a_src, a_orig, a_dir = Acc(), Acc(), Acc()
                    for w, sr in zip(ws, per):
                        src = sr[sname]
                        q, s = quantize(src, g, mode)
                        ours = dequantize(q, s, g)
                        qd, sd = quantize(w, g, mode)
                        a_src.add(src, ours)
                        a_orig.add(w, ours)
                        a_dir.add(w, dequantize(qd, sd, g))
                    a, rel = a_src.snr()
                    print(f"| {wname} | {sname} | {src_acc.snr()[0]:.2f} | {g} | {mode} | {a:.2f} / {rel:.4f} "
                          f"| {a_orig.snr()[0]:.2f} | {a_dir.snr()[0]:.2f} |")


if __name__ == "__main__":
    main()
