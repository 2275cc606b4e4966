"""Layout-2 (asymmetric int4g, spec 9.5) twins of a converted .nanoqwen file for the GPU tests: the same scales, codes
moved onto fresh random zero points, and the same model with every int4g tensor replaced by its f16 dequantisation
(w' = f16(s * (u - z)): what the GPU GEMMs multiply), which the CPU backend and the CUDA backend both run as dense f16.

The twins keep the source's conditioning. A zero point drawn independently of the codes (the first version) adds
s * (8 - z) to every weight of a group: those per-group offsets made q.k scores large enough that the CPU oracle
itself moved its logits by up to 15 % between an f16 and an f32 KV cache (0.06 % on the source models), so no GPU
tolerance could tell a kernel's rounding from a bug. Here each group keeps centred weights s * c, where c = u - 8
(or, for half the groups, round((u - 8) / 2), a narrower range that leaves room for zero points far from 8), and its
zero point z is drawn from the values that keep u = c + z within 0..15: a misread zero point still moves the group's
weights by whole scales."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from nanoqwen_format import DType, NanoqwenWriter, TensorSpec, open_file
from nanoqwen_format.constants import LAYOUT_INT4_ROWMAJOR_K8_ASYM
from nanoqwen_format.int4_layout import dequantize_int4_asym_reference, pack_int4_reference, unpack_int4_reference


def layout_2_twins(src: Path, out2: Path, out16: Path, seed: int) -> tuple[Path, Path]:
    """Write out2 (every int4g tensor of src as layout 2 on random zero points, never all 8) and out16 (the same
    weights dequantised to f16); every other tensor and every blob copied. Returns (out2, out16)."""
    rng = np.random.default_rng(seed)
    with open_file(src) as f:
        kinds = list(f.blob_kinds)
        specs2, specs16, int4 = [], [], {}
        for t in f.tensors.values():
            if t.dtype == DType.INT4G:
                q, s = f.int4(t.name)
                q, z = _recentre_on_random_zeros(q, t.shape[1] // s.shape[1], rng)
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


def _recentre_on_random_zeros(qweight: np.ndarray, g: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Layout-1 qweight (N, K/8) uint32 (codes q, w = s(q - 8)) of group g -> (its layout-2 qweight of codes u,
    zero points z (N, K/g) uint8) with u - z = c, c = q - 8 or, for half the groups, round((q - 8) / 2); z uniform
    over the zeros that keep u within 0..15."""
    q = unpack_int4_reference(qweight)
    N, K = q.shape
    c = q.astype(np.int16).reshape(N, K // g, g) - 8
    half = rng.random((N, K // g)) < 0.5
    c = np.where(half[..., None], np.round(c / 2).astype(np.int16), c)
    lo, hi = np.maximum(0, -c.min(axis=-1)), np.minimum(15, 15 - c.max(axis=-1))     # z in [lo, hi]: 0 <= c + z <= 15
    z = lo + np.floor(rng.random(lo.shape) * (hi - lo + 1)).astype(np.int16)
    if (z == 8).all():                                                                 # never all 8
        i = np.unravel_index(np.argmax(hi - lo), z.shape)
        z[i] = hi[i] if hi[i] != 8 else lo[i]
    assert (z != 8).any(), "no group leaves room for a zero point other than 8"
    u = (c + z[..., None]).reshape(N, K)
    return pack_int4_reference(u.astype(np.uint8)), z.astype(np.uint8)
