"""One-off cross-check of the GPTQ reader against AutoGPTQ's own packing code (not a test: AutoGPTQ is not a
dependency, and installing it pulls CUDA-era pins). AutoGPTQ 0.7.1's QuantLinear in qlinear_cuda_old.py packs with
plain torch on the CPU; this script loads that one file from the wheel, packs random linears (symmetric and
asymmetric, g128), and checks that nanoqwen_quant.sources.gptq reads them exactly as AutoGPTQ's own torch dequant
does, and that the lossless layout-1 repack dequantizes to the same values.

    pip download auto-gptq==0.7.1 --no-deps -d /tmp/agptq
    (cd /tmp/agptq && unzip -o auto_gptq-0.7.1-*.whl 'auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py')
    PYTHONPATH=. python bench/gptq_autogptq_crosscheck.py /tmp/agptq/auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py

Exit 0 when every comparison holds (result in bench/NOTES.md).
"""
import importlib.util
import sys
import types

import numpy as np
import torch

from nanoqwen_quant.quantize import dequantize
from nanoqwen_quant.sources.gptq import gptq_words_to_layout1, unpack_along_cols, unpack_along_rows


def main(path: str) -> int:
    for m in ("auto_gptq", "auto_gptq.nn_modules", "auto_gptq.nn_modules.qlinear"):
        sys.modules.setdefault(m, types.ModuleType(m))
    spec = importlib.util.spec_from_file_location("qlinear_cuda_old", path)
    qlo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(qlo)
    rng = np.random.default_rng(0)
    n, k, g = 64, 256, 128
    ok = True
    for sym in (True, False):
        w = torch.from_numpy((rng.standard_normal((n, k)) * 0.05).astype(np.float32))
        lin = torch.nn.Linear(k, n, bias=False)
        lin.weight.data = w.clone()
        wg = w.reshape(n, k // g, g)
        if sym:
            s = 2 * wg.abs().amax(-1) / 15
            z = torch.full_like(s, 8.0)
        else:
            mn, mx = wg.amin(-1).clamp(max=0), wg.amax(-1).clamp(min=0)
            s = (mx - mn) / 15
            z = torch.round(-mn / s)
        s = s.half().float()
        ql = qlo.QuantLinear(4, g, k, n, False, use_cuda_fp16=False)
        ql.pack(lin, s, z.clone(), torch.arange(k, dtype=torch.int32) // g)
        # AutoGPTQ's torch dequant (QuantLinear.forward without the CUDA extension)
        wf = torch.tensor(list(range(0, 32, 4)), dtype=torch.int32).unsqueeze(0)
        zeros = (torch.bitwise_right_shift(ql.qzeros.unsqueeze(2).expand(-1, -1, 8), wf.unsqueeze(0)) & 15) + 1
        zeros = zeros.reshape(-1, 1, zeros.shape[1] * zeros.shape[2])
        codes = torch.bitwise_right_shift(ql.qweight.unsqueeze(1).expand(-1, 8, -1), wf.unsqueeze(-1)) & 15
        ref = (ql.scales.float().reshape(-1, 1, n) * (codes.reshape(-1, g, n) - zeros)).reshape(k, n).T.numpy()
        qweight, qzeros, scales = ql.qweight.numpy(), ql.qzeros.numpy(), ql.scales.numpy()
        gi = np.arange(k) // g
        q = unpack_along_rows(qweight, 4).astype(np.float32)
        zz = unpack_along_cols(qzeros, 4).astype(np.int16) + 1
        ours = (scales.astype(np.float32)[gi] * (q - zz[gi])).T
        same = np.array_equal(ours, ref)
        print(f"{'sym' if sym else 'asym'}: stored qzeros {np.unique(unpack_along_cols(qzeros, 4)).tolist()}, "
              f"reader == AutoGPTQ dequant: {same}")
        ok &= same
        if sym:
            rep = dequantize(gptq_words_to_layout1(qweight), np.ascontiguousarray(scales.T.astype(np.float16)), g)
            print(f"  lossless layout-1 repack == AutoGPTQ dequant: {np.array_equal(rep, ref)}")
            ok &= np.array_equal(rep, ref)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
