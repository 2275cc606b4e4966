"""Symmetric group-wise INT4 quantizer for layout 1 (spec §INT4 layout 1; docs/architecture.md).

Shapes: a weight `w` is float32 (N, K) = (out_features, in_features); groups of `g` values run along K.
Output: qweight uint32 (N, K//8) (packed codes, layout 1), scales float16 (N, K//g).

Rules (exactly the spec's):
* amax = max |w| over the group (float32).
* rtn: s32 = float32(amax / 7). mse: for r_i = float32(1.0 - 0.02*i), i = 0..20 (1.00 … 0.60):
  s32 = float32(float32(r_i * amax) / 7); rtn is mse's candidate i = 0.
* The scale is rounded to f16 FIRST (round-to-nearest-even): s = float32(f16(s32)); s must be finite.
* q = clamp(rint(float32(w / s)), -8, 7) (rint: round half to even; division in float32); u = q + 8.
  s == 0 (all-zero group, or amax so small that s underflows) → u = 8 for the whole group.
* mse picks the candidate with the lowest SSE = sum_k (float64(w) - float64(s) * q)^2, summed in k order in
  float64; ties → the larger r (the earlier candidate).
* Non-finite weights, or a scale that overflows f16 (amax > ~458 k), raise QuantizationError.

`quantize_reference` is plain numpy written for clarity; `quantize`/`dequantize` are numba-parallel and produce
identical bytes (tests/test_quant_quantize.py).
"""
from __future__ import annotations

import math

import numba
import numpy as np
from numba import njit, prange

from nanoqwen_format.constants import INT4_GROUP_SIZES, INT4_PERM, INT4_ZERO_CODE
from nanoqwen_format.int4_layout import pack_int4_reference

from .cast import _f32bits_to_f16bits

MODES = ("rtn", "mse")
QMIN, QMAX = -8, 7                    # signed code range; stored u = q + INT4_ZERO_CODE
RTN_DIVISOR = 7.0                     # s = amax / 7 maps the largest |w| to code ±7
MSE_N_CANDIDATES = 21                 # r_i = 1 - 0.02 i, i = 0..20
MSE_RATIO_STEP = 0.02
# clipping ratios as float32: computed in float64 (Python floats) then rounded once to float32
MSE_RATIOS = np.array([1.0 - MSE_RATIO_STEP * i for i in range(MSE_N_CANDIDATES)], dtype=np.float32)
RTN_RATIOS = MSE_RATIOS[:1]           # rtn is mse restricted to r = 1.0
F16_MAX = 65504.0
K_MULTIPLE = 32                       # layout 1 requires K % 32 == 0 (a 16-byte GPU chunk never straddles a group)


class QuantizationError(ValueError):
    """Input a quantizer cannot encode (bad shape, group size, non-finite weights, scale overflow)."""


def _ratios(mode: str) -> np.ndarray:
    if mode == "rtn":
        return RTN_RATIOS
    if mode == "mse":
        return MSE_RATIOS
    raise QuantizationError(f"mode: expected one of {MODES}, found {mode!r}")


def check_shape(shape: tuple[int, ...], group_size: int, name: str = "weight") -> None:
    """Raise QuantizationError unless a (N, K) weight can be stored as int4g with this group size."""
    if group_size not in INT4_GROUP_SIZES:
        raise QuantizationError(f"{name}: group_size must be one of {INT4_GROUP_SIZES}, found {group_size}")
    if len(shape) != 2:
        raise QuantizationError(f"{name}: int4 needs a 2-D (N, K) weight, found shape {tuple(shape)}")
    n, k = shape
    if k % group_size or k % K_MULTIPLE:
        raise QuantizationError(f"{name}: in_features K={k} must be a multiple of the group size {group_size} "
                                f"and of {K_MULTIPLE}")


def can_quantize(shape: tuple[int, ...], group_size: int) -> bool:
    try:
        check_shape(shape, group_size)
        return True
    except QuantizationError:
        return False


# ---------------------------------------------------------------------------------------------- reference
def quantize_reference(w, group_size: int = 128, mode: str = "rtn") -> tuple[np.ndarray, np.ndarray]:
    """Reference: float32 (N, K) → (qweight uint32 (N, K//8), scales float16 (N, K//g)). Slow and obvious."""
    w = np.asarray(w, dtype=np.float32)
    check_shape(w.shape, group_size)
    if not np.isfinite(w).all():
        raise QuantizationError("weight contains NaN or Inf")
    n, k = w.shape
    wg = w.reshape(n, k // group_size, group_size)                 # (N, G, g)
    amax = np.abs(wg).max(axis=-1)                                  # (N, G) float32
    best_s = np.zeros_like(amax)                                    # (N, G) float32 (f16-representable)
    best_sse = np.full(amax.shape, np.inf)                          # (N, G) float64
    for r in _ratios(mode):
        s32 = (r * amax) / np.float32(RTN_DIVISOR)                  # float32 arithmetic
        with np.errstate(over="ignore"):
            s = s32.astype(np.float16).astype(np.float32)           # round to f16 first
        if np.isinf(s).any():
            raise QuantizationError(f"scale overflows float16 (max |w| = {float(amax.max()):.6g})")
        q = _codes_reference(wg, s)                                 # (N, G, g) float32 in -8..7
        err = wg.astype(np.float64) - s[..., None].astype(np.float64) * q.astype(np.float64)
        sse = np.cumsum(err * err, axis=-1)[..., -1]                # sequential sum in k order
        better = sse < best_sse                                     # strict: ties keep the larger r
        best_s = np.where(better, s, best_s)
        best_sse = np.where(better, sse, best_sse)
    q = _codes_reference(wg, best_s)
    u = (q + INT4_ZERO_CODE).astype(np.uint8).reshape(n, k)
    return pack_int4_reference(u), best_s.astype(np.float16)


def _codes_reference(wg: np.ndarray, s: np.ndarray) -> np.ndarray:
    """q = clamp(rint(w / s), -8, 7) with s broadcast per group; s == 0 gives q = 0."""
    sb = s[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.rint(wg / np.where(sb == 0, np.float32(1), sb))
    q = np.clip(q, QMIN, QMAX)
    return np.where(sb == 0, np.float32(0), q).astype(np.float32)


# ---------------------------------------------------------------------------------------------- numba
# The numba kernels hard-code the nibble shifts of layout 1 (value p of a word at bit 4*_INV_PERM[p]); checked here.
_INV_PERM = tuple(int(i) for i in np.argsort(np.array(INT4_PERM)))
if tuple(4 * i for i in _INV_PERM) != (0, 16, 4, 20, 8, 24, 12, 28):
    raise ImportError("nanoqwen_format INT4_PERM changed: update the hard-coded shifts in nanoqwen_quant.quantize")


@njit(cache=True, inline="always")
def _round_to_f16_s(x, sf, su):
    """float32 x ≥ 0 → float32 holding f16(x) (round-to-nearest-even, subnormals, ≥ 65520 → inf), on the bits.
    sf float32 (1,) / su its uint32 view: scratch for moving a scalar between float and bits."""
    sf[0] = x
    h, bad = _f32bits_to_f16bits(su[0])
    if bad:
        return np.float32(np.inf)
    h32 = np.uint32(h)
    if h32 >= np.uint32(0x400):                                   # f16 normal: rebias exponent 15 → 127
        su[0] = (h32 << np.uint32(13)) + np.uint32(0x38000000)
        return sf[0]
    return np.float32(h32) * np.float32(5.9604644775390625e-08)  # subnormal: h * 2^-24, exact in float32


@njit(cache=True)
def _round_to_f16(x):
    """Scalar convenience wrapper of _round_to_f16_s (tests)."""
    sf = np.empty(1, np.float32)
    return _round_to_f16_s(np.float32(x), sf, sf.view(np.uint32))


@njit(cache=True, inline="always")
def _amax_bits(seg):
    """seg: uint32 (g,) float32 bit patterns → max |w| as a bit pattern (integer max of sign-cleared bits: exact
    for finite values, and vectorizes without fast-math). Loops index from 0 so LLVM drops numba's
    negative-index wraparound and vectorizes."""
    mb = np.uint32(0)
    for k in range(seg.shape[0]):
        mb = max(mb, seg[k] & np.uint32(0x7FFFFFFF))
    return mb


@njit(cache=True, inline="always")
def _clamp_code(q):
    """clamp(q, -8, 7) for a float32 q that is not NaN. Plain compares: numba's min/max carry NaN handling that
    keeps LLVM from vectorizing the loops around them (≈3x slower)."""
    q = np.float32(QMAX) if q > np.float32(QMAX) else q
    return np.float32(QMIN) if q < np.float32(QMIN) else q


@njit(cache=True, inline="always")
def _encode_group(ws, s, codes, qs):
    """ws float32 (g,) weights, s the group's f16-rounded scale → qs uint32 (g/8,) packed words (layout 1).
    codes: uint32 (g,) scratch."""
    g = ws.shape[0]
    if s == 0:
        codes[:] = np.uint32(INT4_ZERO_CODE)
    else:
        for k in range(g):
            codes[k] = np.uint32(np.int32(_clamp_code(np.rint(ws[k] / s)) + np.float32(INT4_ZERO_CODE)))
    for j in range(g // 8):
        b = 8 * j
        # nibble i holds value PERM[i] = (0, 2, 4, 6, 1, 3, 5, 7): value p sits at bit 4*INV_PERM[p]
        qs[j] = (codes[b] | (codes[b + 1] << np.uint32(16)) | (codes[b + 2] << np.uint32(4))
                 | (codes[b + 3] << np.uint32(20)) | (codes[b + 4] << np.uint32(8))
                 | (codes[b + 5] << np.uint32(24)) | (codes[b + 6] << np.uint32(12))
                 | (codes[b + 7] << np.uint32(28)))


@njit(cache=True, inline="always")
def _group_sse_all(ws, cand, sdiv, sse):
    """sse[c] = Σ_k (float64(w) - float64(s_c) * q)^2 for every candidate scale cand[c] (float32 (C,)), each sum
    in increasing k (the spec's order); q = clamp(rint(w / s_c)), s_c == 0 → q = 0. The candidates are the inner
    loop: independent accumulators, so the loop vectorizes across candidates without reordering any sum."""
    nc = cand.shape[0]
    for c in range(nc):                                 # sdiv: s, or 1 where s == 0 (then s * q = 0 anyway)
        sse[c] = 0.0
        sdiv[c] = cand[c] if cand[c] != 0 else np.float32(1.0)
    for k in range(ws.shape[0]):
        x = ws[k]
        for c in range(nc):
            q = _clamp_code(np.rint(x / sdiv[c]))
            d = np.float64(x) - np.float64(cand[c]) * np.float64(q)
            sse[c] += d * d


@njit(cache=True, parallel=True)
def _quantize_kernel(w, wbits, g, ratios, qweight, scales32, status):
    """w float32 (N, K), wbits its uint32 view; ratios float32 (R,) (R == 1: rtn); writes qweight uint32 (N, K//8),
    scales32 float32 (N, K//g) (f16-representable values), status int8 (N,) (0 ok, 1 non-finite, 2 f16 overflow)."""
    n_rows, k_all = w.shape
    n_groups = k_all // g
    seven = np.float32(RTN_DIVISOR)
    n_ratios = ratios.shape[0]
    for n in prange(n_rows):
        codes = np.empty(g, np.uint32)                    # (g,) u codes of one group
        sf = np.empty(1, np.float32)                      # scalar float <-> bits scratch
        su = sf.view(np.uint32)
        cand = np.empty(n_ratios, np.float32)             # (R,) candidate f16-rounded scales of one group
        sse = np.empty(n_ratios, np.float64)              # (R,) their SSEs
        sdiv = np.empty(n_ratios, np.float32)             # (R,) divisors (scratch)
        for gi in range(n_groups):
            k0 = gi * g
            mb = _amax_bits(wbits[n, k0:k0 + g])
            if mb >= np.uint32(0x7F800000):               # Inf or NaN somewhere in the group
                status[n] = 1
                break
            su[0] = mb
            amax = sf[0]
            ws = w[n, k0:k0 + g]
            best_s = _round_to_f16_s((ratios[0] * amax) / seven, sf, su)
            if best_s == np.inf:
                status[n] = 2
                break
            if n_ratios > 1:
                cand[0] = best_s
                for ri in range(1, n_ratios):
                    cand[ri] = _round_to_f16_s((ratios[ri] * amax) / seven, sf, su)   # ≤ cand[0]: finite
                _group_sse_all(ws, cand, sdiv, sse)
                best_sse = sse[0]
                for ri in range(1, n_ratios):
                    if sse[ri] < best_sse:                # strict: ties keep the larger r
                        best_sse = sse[ri]
                        best_s = cand[ri]
            scales32[n, gi] = best_s
            _encode_group(ws, best_s, codes, qweight[n, k0 // 8:(k0 + g) // 8])


@njit(cache=True, parallel=True)
def _dequantize_kernel(qweight, scales32, g, out):
    """qweight uint32 (N, K//8), scales32 float32 (N, K//g) → out float32 (N, K) = s * (u - 8)."""
    n_rows, n_words = qweight.shape
    wpg = g // 8                                          # words per group
    zero = np.float32(INT4_ZERO_CODE)
    for n in prange(n_rows):
        for gi in range(n_words // wpg):
            s = scales32[n, gi]
            qs = qweight[n, gi * wpg:(gi + 1) * wpg]
            os_ = out[n, gi * g:(gi + 1) * g]
            for j in range(wpg):
                word = qs[j]
                b = 8 * j
                # value p of the word sits at bit 4*INV_PERM[p]: shifts (0, 16, 4, 20, 8, 24, 12, 28)
                os_[b] = s * (np.float32(word & np.uint32(0xF)) - zero)
                os_[b + 1] = s * (np.float32((word >> np.uint32(16)) & np.uint32(0xF)) - zero)
                os_[b + 2] = s * (np.float32((word >> np.uint32(4)) & np.uint32(0xF)) - zero)
                os_[b + 3] = s * (np.float32((word >> np.uint32(20)) & np.uint32(0xF)) - zero)
                os_[b + 4] = s * (np.float32((word >> np.uint32(8)) & np.uint32(0xF)) - zero)
                os_[b + 5] = s * (np.float32((word >> np.uint32(24)) & np.uint32(0xF)) - zero)
                os_[b + 6] = s * (np.float32((word >> np.uint32(12)) & np.uint32(0xF)) - zero)
                os_[b + 7] = s * (np.float32((word >> np.uint32(28)) & np.uint32(0xF)) - zero)


def quantize(w, group_size: int = 128, mode: str = "rtn", out: tuple[np.ndarray, np.ndarray] | None = None
             ) -> tuple[np.ndarray, np.ndarray]:
    """Fast path: float32 (N, K) → (qweight uint32 (N, K//8), scales float16 (N, K//g)), bytes identical to
    quantize_reference. `out` may give preallocated (qweight, scales) arrays (e.g. row slices of the full tensor)."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    check_shape(w.shape, group_size)
    ratios = _ratios(mode)
    n, k = w.shape
    if out is None:
        qweight = np.empty((n, k // 8), np.uint32)
        scales = np.empty((n, k // group_size), np.float16)
    else:
        qweight, scales = out
        if qweight.shape != (n, k // 8) or qweight.dtype != np.uint32 or scales.shape != (n, k // group_size) \
                or scales.dtype != np.float16:
            raise QuantizationError(f"out arrays: expected uint32 {(n, k // 8)} and float16 {(n, k // group_size)}")
    scales32 = np.empty((n, k // group_size), np.float32)
    status = np.zeros(n, np.int8)
    _quantize_kernel(w, w.view(np.uint32), group_size, ratios, qweight, scales32, status)
    if status.any():
        row = int(np.flatnonzero(status)[0])
        if status[row] == 1:
            raise QuantizationError(f"weight contains NaN or Inf (row {row})")
        raise QuantizationError(f"scale overflows float16 (row {row}, max |w| = {float(np.abs(w[row]).max()):.6g})")
    scales[...] = scales32          # exact: every value is f16-representable
    return qweight, scales


def dequantize(qweight, scales, group_size: int) -> np.ndarray:
    """Fast path: qweight uint32 (N, K//8), scales float16 (N, K//g) → float32 (N, K): float32(s) * (u - 8)."""
    qweight = np.ascontiguousarray(qweight)
    scales = np.asarray(scales)
    n, nw = qweight.shape
    k = nw * 8
    if qweight.dtype != np.uint32 or scales.dtype != np.float16 or k % group_size \
            or scales.shape != (n, k // group_size):
        raise QuantizationError(f"dequantize: expected qweight uint32 (N, K/8) and scales float16 (N, K/{group_size}),"
                                f" found {qweight.dtype} {qweight.shape}, {scales.dtype} {scales.shape}")
    out = np.empty((n, k), np.float32)
    _dequantize_kernel(qweight, np.ascontiguousarray(scales, dtype=np.float32), group_size, out)
    return out


def snr_db(ref, approx) -> float:
    """Signal-to-noise ratio 10·log10(Σref² / Σ(ref−approx)²) in dB, float64 sums; inf when identical."""
    r = np.asarray(ref, dtype=np.float64)
    e = r - np.asarray(approx, dtype=np.float64)
    num, den = float(np.sum(r * r)), float(np.sum(e * e))
    if den == 0.0:
        return math.inf
    if num == 0.0:
        return -math.inf
    return 10.0 * math.log10(num / den)


def set_threads(n: int | None) -> None:
    """Limit numba's worker threads (None: leave the default, all cores)."""
    if n:
        numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
