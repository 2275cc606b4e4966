"""AWQ checkpoints (`quantization_config.quant_method == "awq"`, AutoAWQ's GEMM packing, `version: "gemm"`).

Per quantized linear of logical shape (N, K), group size g along K, G = K / g:

* `qweight` int32 (K, N/8): packed along N. Word c of row k holds n = 8c + AWQ_ORDER[i] at bits 4i, with
  AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7) (the order AutoAWQ's GEMM kernel unpacks fastest).
* `qzeros`  int32 (G, N/8): the zero points, packed the same way.
* `scales`  f16 (G, N).
* w[n, k] = scales[k // g, n] * (q[k, n] - zero[k // g, n]).

AWQ is asymmetric (a zero point per group, 0..15): int4g layout 2 (spec §9.5) holds it exactly, w = s * (u - z)
with u = q, the same f16 scales and zero points, so the codes are only repacked (along K instead of N) and the
zeros transposed. A tensor whose zeros are all 8 is layout 1 in disguise and is repacked into layout 1. A group
size the int4 layouts do not take, or scales that are not f16 values >= 0, leave no exact form: the weights are
dequantized exactly and requantized by our quantizer into layout 1, and the converter reports why and the error
(so does nanoqwen-convert --int4-layout 1, for a runtime that runs layout 1 only).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nanoqwen_format.constants import (INT4_GROUP_SIZES, INT4_ZERO_CODE, LAYOUT_INT4_ROWMAJOR_K8,
                                       LAYOUT_INT4_ROWMAJOR_K8_ASYM)

from ..hf import ConvertError, SourceTensor
from ..quantize import K_MULTIPLE
from . import ImportedTensor, read_tensor, scales_f32
from .gptq import exact_scales_f16, layout1_from_codes

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)          # nibble i of a word holds column 8c + AWQ_ORDER[i]
AWQ_VERSIONS = ("gemm",)


def dequantize_reference(qweight: np.ndarray, qzeros: np.ndarray, scales: np.ndarray, g: int) -> np.ndarray:
    """float32 (N, K) = s[k // g, n] * (q[k, n] - z[k // g, n]), exact; plain numpy (the fast path's reference)."""
    q, z = unpack_awq(qweight), unpack_awq(qzeros).astype(np.int16)
    gi = np.arange(q.shape[0]) // g
    return np.ascontiguousarray((scales.astype(np.float32)[gi] * (q.astype(np.float32) - z[gi].astype(np.float32))).T)


def unpack_awq(words: np.ndarray) -> np.ndarray:
    """int32 (R, C) in AWQ GEMM order → uint8 (R, 8C): column 8c + AWQ_ORDER[i] is nibble i of word (r, c)."""
    u = words.view(np.uint32)
    shifts = (np.arange(8, dtype=np.uint32) * np.uint32(4))[None, None, :]
    nib = ((u[:, :, None] >> shifts) & np.uint32(0xF)).astype(np.uint8)     # (R, C, 8): slot i
    out = np.empty_like(nib)
    out[:, :, list(AWQ_ORDER)] = nib                                          # slot i → column AWQ_ORDER[i]
    return out.reshape(u.shape[0], u.shape[1] * 8)


@dataclass(frozen=True)
class AWQParams:
    bits: int
    group_size: int
    version: str
    PARTS = ("qweight", "qzeros", "scales")

    @classmethod
    def from_config(cls, qc: dict) -> "AWQParams":
        bits = qc.get("bits", qc.get("w_bit"))
        if bits != 4:
            raise ConvertError(f"config.json: awq bits {bits!r} is not supported (only 4)")
        g = qc.get("group_size", qc.get("q_group_size"))
        if isinstance(g, bool) or not isinstance(g, int) or g <= 0:
            raise ConvertError(f"config.json: awq group_size must be a positive integer, found {g!r}")
        version = str(qc.get("version", "gemm")).lower()
        if version not in AWQ_VERSIONS:
            raise ConvertError(f"config.json: awq version {qc.get('version')!r} is not supported "
                               f"(supported: {', '.join(AWQ_VERSIONS)})")
        if qc.get("zero_point", True) is not True:
            raise ConvertError("config.json: awq zero_point=false is not supported")
        return cls(bits=4, group_size=g, version=version)

    def describe(self) -> dict:
        return {"bits": self.bits, "group_size": self.group_size, "version": self.version}

    def open_linear(self, name: str, shape: tuple[int, int], parts: dict[str, SourceTensor]) -> ImportedTensor:
        n, k = shape
        g = self.group_size
        if k % g or n % 8:
            raise ConvertError(f"awq tensor {name!r}: shape {shape} needs K % {g} == 0 and N % 8 == 0")
        want = {"qweight": ((k, n // 8), ("I32",)), "qzeros": ((k // g, n // 8), ("I32",)),
                "scales": ((k // g, n), ("F16", "BF16", "F32"))}
        for part, (sh, dts) in want.items():
            t = parts.get(part)
            if t is None:
                raise ConvertError(f"awq tensor {name!r}: {name[:-len('.weight')]}.{part} is missing")
            if tuple(t.shape) != sh or t.dtype not in dts:
                raise ConvertError(f"{t.file}: awq {t.name!r} is {t.dtype} {list(t.shape)}, expected "
                                   f"{'/'.join(dts)} {list(sh)} for a g{g} {shape} linear")

        def load():
            q = unpack_awq(read_tensor(parts["qweight"]))                   # (K, N)
            z = unpack_awq(read_tensor(parts["qzeros"])).astype(np.int16)   # (G, N)
            return q, z, scales_f32(parts["scales"])

        def dequant() -> np.ndarray:
            from .dequant import awq_dequantize_fast
            return awq_dequantize_fast(read_tensor(parts["qweight"]), scales_f32(parts["scales"]),
                                       unpack_awq(read_tensor(parts["qzeros"])), AWQ_ORDER, g)

        symmetric = not np.any(unpack_awq(read_tensor(parts["qzeros"])) != INT4_ZERO_CODE)
        layout = LAYOUT_INT4_ROWMAJOR_K8 if symmetric else LAYOUT_INT4_ROWMAJOR_K8_ASYM

        def exact():
            """Layout 1 (qweight, scales) when every zero is 8, else layout 2 (qweight, scales, zeros): the codes
            (4-bit nibbles: zeros are 0..15 by construction) as they are."""
            q, z, s = load()
            qweight, scales = layout1_from_codes(q, exact_scales_f16(s))
            if symmetric:
                return qweight, scales
            return qweight, scales, np.ascontiguousarray(z.T.astype(np.uint8))

        if g not in INT4_GROUP_SIZES or k % K_MULTIPLE:
            reason = f"group size {g} (the int4 layouts take {INT4_GROUP_SIZES})"
        elif exact_scales_f16(scales_f32(parts["scales"])) is None:
            reason = "scales are negative, non-finite or not f16 values"
        else:
            reason = ""
        return ImportedTensor(name, shape, f"awq 4-bit g{g}", dequant, None if reason else exact,
                              None if reason else g, reason, layout)
