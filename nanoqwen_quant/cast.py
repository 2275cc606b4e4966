"""Fast dtype casts for the converter (numba, parallel), each with the numpy expression it must equal bit for bit
(tests/test_quant_cast.py):

* bf16_to_f32(raw uint16 (M,))   == (raw.astype(uint32) << 16).view(float32)
* to_f16_bits(x)                 == x.astype(float16).view(uint16) for float32 x or bf16 bits (uint16),
                                    round-to-nearest-even incl. f16 subnormals; returns the count of values that
                                    are non-finite or overflow f16 (|v| >= 65520), which the caller must refuse.
Arrays are 1-D contiguous (callers pass reshape(-1) views).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

_CHUNK = 1 << 16            # elements per parallel work item


@njit(cache=True, parallel=True)
def _bf16_to_f32_kernel(raw, out_bits):
    """raw uint16 (M,) bf16 bits → out_bits uint32 (M,) float32 bits."""
    m = raw.shape[0]
    for c in prange((m + _CHUNK - 1) // _CHUNK):
        a = c * _CHUNK
        b = min(m, a + _CHUNK)
        src = raw[a:b]
        dst = out_bits[a:b]
        for i in range(b - a):
            dst[i] = np.uint32(src[i]) << np.uint32(16)


@njit(cache=True, inline="always")
def _f32bits_to_f16bits(x):
    """float32 bit pattern → (f16 bit pattern, bad) with round-to-nearest-even; bad: NaN/Inf/|v| >= 65520."""
    sign = np.uint32((x >> np.uint32(16)) & np.uint32(0x8000))
    a = x & np.uint32(0x7FFFFFFF)
    if a >= np.uint32(0x477FF000):                       # ≥ 65520 rounds to inf; also Inf and NaN inputs
        return np.uint16(sign | np.uint32(0x7C00)), 1
    if a >= np.uint32(0x38800000):                       # ≥ 2^-14: f16 normal; rebias exponent 127 → 15
        h = (a - np.uint32(0x38000000)) >> np.uint32(13)
        rem = a & np.uint32(0x1FFF)
        if rem > np.uint32(0x1000) or (rem == np.uint32(0x1000) and (h & np.uint32(1))):
            h += np.uint32(1)
        return np.uint16(sign | h), 0
    e = a >> np.uint32(23)                               # f16 subnormal (or zero): value / 2^-24, RNE
    if e < np.uint32(101):                               # value < 2^-26 (incl. f32 subnormals): rounds to 0
        return np.uint16(sign), 0
    m = (a & np.uint32(0x7FFFFF)) | np.uint32(0x800000)  # value = m * 2^(e - 150); h = m / 2^(126 - e)
    s = np.uint32(126) - e                               # 14..25
    h = m >> s
    rem = m & ((np.uint32(1) << s) - np.uint32(1))
    half = np.uint32(1) << (s - np.uint32(1))
    if rem > half or (rem == half and (h & np.uint32(1))):
        h += np.uint32(1)
    return np.uint16(sign | h), 0


@njit(cache=True, parallel=True)
def _f32_to_f16_kernel(bits, out, shift):
    """bits uint32 (M,) float32 bits, or uint16 bf16 bits with shift=16 → out uint16 (M,) f16 bits; returns the
    number of bad values. Pass 1 applies the f16-normal-range rule to every element without branches (vectorizes);
    pass 2 redoes, with the full rule, only elements outside [2^-14, 65520)."""
    m = bits.shape[0]
    n_chunks = (m + _CHUNK - 1) // _CHUNK
    bad = np.zeros(n_chunks, np.int64)
    for c in prange(n_chunks):
        a0 = c * _CHUNK
        b0 = min(m, a0 + _CHUNK)
        src = bits[a0:b0]
        dst = out[a0:b0]
        n_special = 0
        for i in range(b0 - a0):
            x = np.uint32(src[i]) << np.uint32(shift)
            a = x & np.uint32(0x7FFFFFFF)
            h = (a - np.uint32(0x38000000)) >> np.uint32(13)
            rem = a & np.uint32(0x1FFF)
            up = np.uint32(rem > np.uint32(0x1000)) | (np.uint32(rem == np.uint32(0x1000)) & h & np.uint32(1))
            dst[i] = np.uint16(((x >> np.uint32(16)) & np.uint32(0x8000)) | ((h + up) & np.uint32(0x7FFF)))
            n_special += (a < np.uint32(0x38800000)) | (a >= np.uint32(0x477FF000))
        nb = 0
        if n_special:
            for i in range(b0 - a0):
                x = np.uint32(src[i]) << np.uint32(shift)
                a = x & np.uint32(0x7FFFFFFF)
                if a < np.uint32(0x38800000) or a >= np.uint32(0x477FF000):
                    h, isbad = _f32bits_to_f16bits(x)
                    dst[i] = h
                    nb += isbad
        bad[c] = nb
    return bad.sum()


def bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    """uint16 bf16 bits (any shape) → float32 of the same shape (exact)."""
    raw = np.ascontiguousarray(raw, dtype=np.uint16)
    out = np.empty(raw.shape, np.uint32)
    _bf16_to_f32_kernel(raw.reshape(-1), out.reshape(-1))
    return out.view(np.float32)


def to_f16_bits(x: np.ndarray, out: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """float32 array, or uint16 array of bf16 bits → (uint16 f16 bits of the same shape, number of values that are
    non-finite or overflow f16). `out` (uint16, same size, contiguous) may be given."""
    x = np.ascontiguousarray(x)
    if x.dtype == np.float32:
        bits, shift = x.reshape(-1).view(np.uint32), 0
    elif x.dtype == np.uint16:
        bits, shift = x.reshape(-1), 16
    else:
        raise TypeError(f"to_f16_bits: expected float32 or uint16 (bf16 bits), found {x.dtype}")
    if out is None:
        out = np.empty(x.shape, np.uint16)
    if out.dtype != np.uint16 or out.size != x.size or not out.flags.c_contiguous:
        raise ValueError(f"to_f16_bits: out must be contiguous uint16 of size {x.size}")
    bad = _f32_to_f16_kernel(bits, out.reshape(-1), shift)
    return out, int(bad)
