"""GPTQ checkpoints (`quantization_config.quant_method == "gptq"`, as AutoGPTQ / GPTQModel / optimum save them).

Per quantized linear of logical shape (N, K) = (out_features, in_features), with b bits, p = 32 // b values per
int32 word, group size g (-1 in the config: one group spanning K), G = ceil(K / g) groups:

* `qweight` int32 (K/p, N): packed along K. Word (r, n) holds k = p*r + j at bits b*j (j = 0..p-1, low bits first).
* `qzeros`  int32 (G, N/p): packed along N the same way: word (G_, c) holds the zero of n = p*c + j at bits b*j.
* `scales`  f16 (G, N).
* `g_idx`   int32 (K,): the group of input k (k // g without act-order; a permutation with `desc_act: true`).
  Absent in some files: then k // g.
* w[n, k] = scales[g_idx[k], n] * (q[k, n] - zero[g_idx[k], n]).

The stored zero: checkpoint_format "gptq" (the default, AutoGPTQ's historical packing) stores zero - 1, so a
symmetric 4-bit checkpoint (zero 8) stores 7; checkpoint_format "gptq_v2" (GPTQModel) stores the zero itself (8).

Lossless import: 4 bits, g in the format's group sizes, K % g == 0, g_idx == k // g, and finite f16 scales >= 0;
then every zero 8: w = s * (q - 8) is layout 1's own rule with u = q and the same f16 scale, so the codes are only
repacked; zeros in 0..15 (sym: false): w = s * (q - z) is layout 2's rule (spec §9.5), the codes repacked the same
way and the zeros stored beside them. Anything else (a permuted g_idx from desc_act, a zero of 16 (the "gptq"
format stores zero - 1, so a zero of 0 wraps to 16), 2/8 bits, odd groups) is dequantized exactly (float32(s) times
a small integer is exact in float32) and requantized by our quantizer into layout 1; the converter reports why and
the error.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nanoqwen_format.constants import (INT4_GROUP_SIZES, INT4_MAX_CODE, INT4_PERM, INT4_ZERO_CODE,
                                       LAYOUT_INT4_ROWMAJOR_K8, LAYOUT_INT4_ROWMAJOR_K8_ASYM)
from nanoqwen_format.int4_layout import pack_int4_reference

from ..hf import ConvertError, SourceTensor
from ..quantize import K_MULTIPLE
from . import ImportedTensor, read_tensor, scales_f32

SUPPORTED_BITS = (2, 4, 8)
CHECKPOINT_FORMATS = {"gptq": 1, "gptq_v2": 0}     # format -> what to add to the stored zero


def unpack_along_rows(words: np.ndarray, bits: int) -> np.ndarray:
    """int32 (R, C) → uint8 (R * 32/bits, C): row p*r + j of the result is bits [b*j, b*j+b) of word row r."""
    p = 32 // bits
    u = words.view(np.uint32)
    shifts = (np.arange(p, dtype=np.uint32) * np.uint32(bits))[None, :, None]        # (1, p, 1)
    vals = (u[:, None, :] >> shifts) & np.uint32((1 << bits) - 1)                    # (R, p, C)
    return vals.astype(np.uint8).reshape(u.shape[0] * p, u.shape[1])


def unpack_along_cols(words: np.ndarray, bits: int) -> np.ndarray:
    """int32 (R, C) → uint8 (R, C * 32/bits): column p*c + j of the result is bits [b*j, b*j+b) of word (r, c)."""
    p = 32 // bits
    u = words.view(np.uint32)
    shifts = (np.arange(p, dtype=np.uint32) * np.uint32(bits))[None, None, :]        # (1, 1, p)
    vals = (u[:, :, None] >> shifts) & np.uint32((1 << bits) - 1)                    # (R, C, p)
    return vals.astype(np.uint8).reshape(u.shape[0], u.shape[1] * p)


def exact_scales_f16(s32: np.ndarray) -> np.ndarray | None:
    """float32 scales → f16 when every value is an f16 value that layout 1 allows (finite, >= 0; -0 becomes +0,
    which dequantizes identically); None otherwise."""
    if not np.all(np.isfinite(s32)) or np.any(s32 < 0):
        return None
    s16 = s32.astype(np.float16)
    if not np.array_equal(s16.astype(np.float32), s32):
        return None
    return np.abs(s16)        # clears the sign of -0.0


def layout1_from_codes(u_kn: np.ndarray, s16_gn: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """u codes uint8 (K, N) (w = s * (u - 8)) and scales f16 (G, N) → layout-1 qweight (N, K/8), scales (N, G)."""
    return pack_int4_reference(np.ascontiguousarray(u_kn.T)), np.ascontiguousarray(s16_gn.T)


def gptq_words_to_layout1(words: np.ndarray) -> np.ndarray:
    """Fast path of the lossless repack: GPTQ 4-bit qweight int32 (K/8, N) → layout-1 qweight uint32 (N, K/8).
    GPTQ word (r, n) holds k = 8r + j at nibble j; layout-1 word (n, r) holds k = 8r + INT4_PERM[i] at nibble i:
    the same 8 codes, so each word only has its nibbles shuffled, then the matrix is transposed. Equal to
    layout1_from_codes(unpack_along_rows(words, 4), ...) (tests/test_import_gptq.py)."""
    u = words.view(np.uint32)
    out = np.zeros_like(u)
    for i, p in enumerate(INT4_PERM):
        out |= ((u >> np.uint32(4 * p)) & np.uint32(0xF)) << np.uint32(4 * i)
    return np.ascontiguousarray(out.T)


@dataclass(frozen=True)
class GPTQParams:
    bits: int
    group_size: int            # -1: one group over K
    desc_act: bool
    sym: bool
    checkpoint_format: str
    PARTS = ("qweight", "qzeros", "scales", "g_idx")

    @classmethod
    def from_config(cls, qc: dict) -> "GPTQParams":
        bits = qc.get("bits")
        if bits not in SUPPORTED_BITS:
            raise ConvertError(f"config.json: gptq bits {bits!r} is not supported (supported: {SUPPORTED_BITS})")
        g = qc.get("group_size", -1)
        if isinstance(g, bool) or not isinstance(g, int) or not (g == -1 or g > 0):
            raise ConvertError(f"config.json: gptq group_size must be -1 or a positive integer, found {g!r}")
        fmt = qc.get("checkpoint_format") or "gptq"
        if fmt not in CHECKPOINT_FORMATS:
            raise ConvertError(f"config.json: gptq checkpoint_format {fmt!r} is not supported "
                               f"(supported: {', '.join(CHECKPOINT_FORMATS)})")
        return cls(bits=bits, group_size=g, desc_act=bool(qc.get("desc_act", False)), sym=bool(qc.get("sym", True)),
                   checkpoint_format=fmt)

    def describe(self) -> dict:
        return {"bits": self.bits, "group_size": self.group_size, "desc_act": self.desc_act, "sym": self.sym,
                "checkpoint_format": self.checkpoint_format}

    def open_linear(self, name: str, shape: tuple[int, int], parts: dict[str, SourceTensor]) -> ImportedTensor:
        return GPTQLinear(self, name, shape, parts).imported()


class GPTQLinear:
    def __init__(self, params: GPTQParams, name: str, shape: tuple[int, int], parts: dict[str, SourceTensor]):
        self.p, self.name, self.shape, self.parts = params, name, shape, parts
        self.layout = 0                  # the exact int4g layout, set by imported() (0: none)
        n, k = shape
        b = params.bits
        per = 32 // b
        g = k if params.group_size == -1 else params.group_size
        self.g = g
        n_groups = -(-k // g)
        for part in ("qweight", "qzeros", "scales"):
            if part not in parts:
                raise ConvertError(f"gptq tensor {name!r}: {name[:-len('.weight')]}.{part} is missing")
        if params.desc_act and "g_idx" not in parts:   # act-order permutes K: k // g would be another weight
            raise ConvertError(f"gptq tensor {name!r}: desc_act is true but {name[:-len('.weight')]}.g_idx is "
                               f"missing (the act-order permutation cannot be recovered)")
        want = {"qweight": ((k // per, n), ("I32",)), "qzeros": ((n_groups, n // per), ("I32",)),
                "scales": ((n_groups, n), ("F16", "BF16", "F32")), "g_idx": ((k,), ("I32", "I64"))}
        if k % per or n % per:
            raise ConvertError(f"gptq tensor {name!r}: shape {shape} is not a multiple of {per} values per word")
        for part, t in parts.items():
            sh, dts = want[part]
            if tuple(t.shape) != sh or t.dtype not in dts:
                raise ConvertError(f"{t.file}: gptq {t.name!r} is {t.dtype} {list(t.shape)}, expected "
                                   f"{'/'.join(dts)} {list(sh)} for a {b}-bit g{params.group_size} {shape} linear")

    def _load(self):
        """codes uint8 (K, N), zeros int16 (G, N), scales float32 (G, N), g_idx int64 (K,)."""
        b = self.p.bits
        q = unpack_along_rows(read_tensor(self.parts["qweight"]), b)
        z = unpack_along_cols(read_tensor(self.parts["qzeros"]), b).astype(np.int16)
        z += CHECKPOINT_FORMATS[self.p.checkpoint_format]
        s = scales_f32(self.parts["scales"])
        k = self.shape[1]
        if "g_idx" in self.parts:
            gi = read_tensor(self.parts["g_idx"]).astype(np.int64)
            if gi.min(initial=0) < 0 or gi.max(initial=0) >= s.shape[0]:
                raise ConvertError(f"gptq {self.parts['g_idx'].name!r}: group index outside 0..{s.shape[0] - 1}")
        else:
            gi = np.arange(k, dtype=np.int64) // self.g
        return q, z, s, gi

    def dequantize_reference(self) -> np.ndarray:
        """float32 (N, K): s[g_idx[k], n] * (q[k, n] - zero[g_idx[k], n]), exact. Plain numpy."""
        q, z, s, gi = self._load()
        w = s[gi] * (q.astype(np.float32) - z[gi].astype(np.float32))        # (K, N)
        return np.ascontiguousarray(w.T)

    def dequantize(self) -> np.ndarray:
        """Same values as dequantize_reference; 4-bit through the numba kernel (sources/dequant.py)."""
        if self.p.bits != 4:
            return self.dequantize_reference()
        from .dequant import gptq_dequantize_fast
        z = unpack_along_cols(read_tensor(self.parts["qzeros"]), 4).astype(np.int16) \
            + CHECKPOINT_FORMATS[self.p.checkpoint_format]
        gi = read_tensor(self.parts["g_idx"]).astype(np.int64) if "g_idx" in self.parts \
            else np.arange(self.shape[1], dtype=np.int64) // self.g
        s = scales_f32(self.parts["scales"])
        if gi.min(initial=0) < 0 or gi.max(initial=0) >= s.shape[0]:
            raise ConvertError(f"gptq {self.parts['g_idx'].name!r}: group index outside 0..{s.shape[0] - 1}")
        return gptq_dequantize_fast(read_tensor(self.parts["qweight"]), s, z, gi)

    def _zeros(self) -> np.ndarray:
        """The zero points the source means, int16 (G, N) (the stored value + the format's offset)."""
        return unpack_along_cols(read_tensor(self.parts["qzeros"]), self.p.bits).astype(np.int16) \
            + CHECKPOINT_FORMATS[self.p.checkpoint_format]

    def _exact_layout(self) -> tuple[int, str]:
        """(layout id, '') when the checkpoint is layout 1 (every zero 8) or layout 2 (zeros in 0..15) in
        disguise; (0, why not) otherwise. Reads qzeros, scales, g_idx only."""
        n, k = self.shape
        if self.p.bits != 4:
            return 0, f"{self.p.bits}-bit"
        if self.g not in INT4_GROUP_SIZES or k % self.g or k % K_MULTIPLE:
            return 0, f"group size {self.p.group_size} (the int4 layouts take {INT4_GROUP_SIZES} dividing K)"
        if "g_idx" in self.parts:
            gi = read_tensor(self.parts["g_idx"]).astype(np.int64)
            if not np.array_equal(gi, np.arange(k) // self.g):
                return 0, "g_idx is not k // group_size (desc_act / act-order: no int4 layout permutes K)"
        if exact_scales_f16(scales_f32(self.parts["scales"])) is None:
            return 0, "scales are negative, non-finite or not f16 values"
        z = self._zeros()
        if np.all(z == INT4_ZERO_CODE):
            return LAYOUT_INT4_ROWMAJOR_K8, ""
        if z.max() > INT4_MAX_CODE:          # only checkpoint_format "gptq" (stored zero - 1) reads back 16
            return 0, (f"zero point {int(z.max())} outside 0..{INT4_MAX_CODE} (checkpoint_format "
                       f"{self.p.checkpoint_format!r} stores zero - 1: a zero of 0 wraps to 16)")
        return LAYOUT_INT4_ROWMAJOR_K8_ASYM, ""

    def exact(self) -> tuple[np.ndarray, ...]:
        """Layout-1 (qweight, scales) or layout-2 (qweight, scales, zeros), as _exact_layout() says (only called
        when it found one): the codes u = q repacked, the f16 scales and the zero points transposed to (N, G)."""
        s16 = exact_scales_f16(scales_f32(self.parts["scales"]))
        qweight, scales = gptq_words_to_layout1(read_tensor(self.parts["qweight"])), np.ascontiguousarray(s16.T)
        if self.layout == LAYOUT_INT4_ROWMAJOR_K8:
            return qweight, scales
        return qweight, scales, np.ascontiguousarray(self._zeros().T.astype(np.uint8))

    def imported(self) -> ImportedTensor:
        self.layout, reason = self._exact_layout()
        enc = f"gptq {self.p.bits}-bit g{self.p.group_size}" + (" desc_act" if self.p.desc_act else "") \
            + ("" if self.p.sym else " asym")
        return ImportedTensor(self.name, self.shape, enc, self.dequantize, None if reason else self.exact,
                              None if reason else self.g, reason, self.layout or LAYOUT_INT4_ROWMAJOR_K8)
