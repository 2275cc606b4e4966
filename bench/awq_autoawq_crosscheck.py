"""One-off cross-check of the AWQ reader against AutoAWQ's own code (not a test: AutoAWQ is archived and not a
dependency). AutoAWQ 0.2.9's WQLinear_GEMM.from_linear packs in plain torch and awq.utils.packing_utils.dequantize_gemm
unpacks in plain torch; this script loads those two files from the sdist, packs random linears (g128, zero points),
and checks nanoqwen_quant.sources.awq reads the same codes and zeros, and that our float32 dequantization rounded
to f16 equals AutoAWQ's f16 dequantization (which computes (q - z) * s in f16: one rounding of the exact product).

    pip download autoawq==0.2.9 --no-deps -d /tmp/aawq && tar xzf /tmp/aawq/autoawq-0.2.9.tar.gz -C /tmp/aawq
    PYTHONPATH=. python bench/awq_autoawq_crosscheck.py /tmp/aawq/autoawq-0.2.9

Exit 0 when every comparison holds (result in bench/NOTES.md).
"""
import importlib.util
import sys
import types
from pathlib import Path

import numpy as np
import torch

from nanoqwen_quant.sources.awq import unpack_awq


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def main(root: str) -> int:
    root = Path(root)
    for m in ("awq", "awq.utils", "awq.modules", "awq.modules.linear"):
        sys.modules.setdefault(m, types.ModuleType(m))
    sys.modules["awq.utils.module"] = types.SimpleNamespace(try_import=lambda name: (None, "stub"))
    sys.modules["awq.utils.utils"] = types.SimpleNamespace(get_best_device=lambda: "cpu")
    pu = _load("awq.utils.packing_utils", root / "awq/utils/packing_utils.py")
    gemm = _load("awq.modules.linear.gemm", root / "awq/modules/linear/gemm.py")
    rng = np.random.default_rng(0)
    n, k, g = 64, 256, 128
    w = torch.from_numpy((rng.standard_normal((n, k)) * 0.05).astype(np.float32))
    lin = torch.nn.Linear(k, n, bias=False)
    lin.weight.data = w.clone()
    wg = w.reshape(n, k // g, g)
    mn, mx = wg.amin(-1), wg.amax(-1)
    s = ((mx - mn) / 15).half().float()                               # (N, G)
    z = torch.clamp(torch.round(-mn / s), 0, 15)
    # from_linear wants scales/zeros as (G, N) (it indexes them by idx // group_size)
    ql = gemm.WQLinear_GEMM.from_linear(lin, 4, g, scales=s.t().contiguous(), zeros=z.t().contiguous())
    qweight, qzeros, scales = ql.qweight.numpy(), ql.qzeros.numpy(), ql.scales.numpy()
    ref_q, ref_z = pu.reverse_awq_order(*pu.unpack_awq(ql.qweight, ql.qzeros, 4), 4)
    ok_codes = np.array_equal(unpack_awq(qweight), (ref_q & 15).numpy())
    ok_zeros = np.array_equal(unpack_awq(qzeros), (ref_z & 15).numpy())
    theirs = pu.dequantize_gemm(ql.qweight, ql.qzeros, ql.scales, 4, g).numpy()      # (K, N) f16
    gi = np.arange(k) // g
    ours = scales.astype(np.float32)[gi] * (unpack_awq(qweight).astype(np.float32)
                                            - unpack_awq(qzeros).astype(np.float32)[gi])
    ok_values = np.array_equal(ours.astype(np.float16), theirs)
    print(f"codes equal: {ok_codes}, zeros equal: {ok_zeros}, f16(our dequant) == AutoAWQ dequantize_gemm: "
          f"{ok_values} (max |ours - theirs| {np.abs(ours - theirs.astype(np.float32)).max():.3g})")
    return 0 if ok_codes and ok_zeros and ok_values else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
