"""Layout-2 (asymmetric int4g, spec 9.5) twins of a converted .nanoqwen file for the GPU tests: the same qweight and
scales with fresh random zero points 0..15, and the same model with every int4g tensor replaced by its f16
dequantisation (w' = f16(s * (u - z)): what the GPU GEMMs multiply), which the CPU backend and the CUDA backend both
run as dense f16. The converter's own layout-2 path is helper asymcpu's work; these tests need only the format."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from nanoqwen_format import DType, NanoqwenWriter, TensorSpec, open_file
from nanoqwen_format.constants import LAYOUT_INT4_ROWMAJOR_K8_ASYM
from nanoqwen_format.int4_layout import dequantize_int4_asym_reference


def layout_2_twins(src: Path, out2: Path, out16: Path, seed: int) -> tuple[Path, Path]:
    """Write out2 (every int4g tensor of src as layout 2 with random zero points, never all 8) and out16 (the same
    weights dequantised to f16); every other tensor and every blob copied. Returns (out2, out16)."""
    rng = np.random.default_rng(seed)
    with open_file(src) as f:
        kinds = list(f.blob_kinds)
        specs2, specs16, int4 = [], [], {}
        for t in f.tensors.values():
            if t.dtype == DType.INT4G:
                q, s = f.int4(t.name)
                z = rng.integers(0, 16, size=s.shape, dtype=np.uint8)
                z.flat[0] = 3                                        # never all 8
                int4[t.name] = (q, s, z)
                specs2.append(TensorSpec(t.name, t.dtype, t.shape, t.group_size, LAYOUT_INT4_ROWMAJOR_K8_ASYM))
                specs16.append(TensorSpec(t.name, DType.F16, t.shape))
            else:
                spec = TensorSpec(t.name, t.dtype, t.shape, t.group_size, t.layout_id)
                specs2.append(spec)
                specs16.append(spec)
        for path, specs, asym in ((out2, specs2, True), (out16, specs16, False)):
            with NanoqwenWriter(path, f.config, specs, kinds) as w:
                for spec in specs:
                    if spec.name in int4:
                        q, s, z = int4[spec.name]
                        if asym:
                            w.write_int4(spec.name, q, s, z)
                        else:
                            g = spec.shape[1] // s.shape[1]
                            w.write_tensor(spec.name, dequantize_int4_asym_reference(q, s, z, g).astype(np.float16))
                    else:
                        w.write_tensor(spec.name, f.array(spec.name))
                for kind in kinds:
                    w.write_blob(kind, f.blob(kind))
    return out2, out16
