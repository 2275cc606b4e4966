"""GPTQ for layout 1: calibration-aware INT4 codes under fixed per-group scales (symmetric, f16 scale per group).

Frantar et al., "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained Transformers" (2022).
The layout is unchanged: the file holds the same qweight / scales as rtn or mse; only the choice of codes differs.

Objective. A linear y = x W^T sees inputs x with second moment H = (2/T) X^T X (X: (T, K) calibration inputs).
GPTQ picks codes q (N, K) to lower the output error  E(Q) = tr((W - Q) H (W - Q)^T),  Q = s * q,  instead of
the weight error |W - Q|^2 that rtn / mse lower. Columns are quantized left to right; the rounding error of
column j, divided by the j-th diagonal of the upper Cholesky factor U of H^-1, is fed back into the columns not
yet quantized (W[:, j+1:] -= err_j * U[j, j+1:]), which is the least-squares correction of the remaining weights.

Scales are chosen first, per group, from the original weights (the spec's rtn or mse rule, nanoqwen_quant.quantize)
and then held fixed ("static groups"): every group keeps a scale the spec's rules could have produced, and the
error feedback only moves codes. Codes are q = clamp(rint(w' / s), -8, 7) on the updated weight w' (float64),
q = 0 where s == 0.

`gptq_codes_reference` is the textbook one-column-at-a-time loop; `gptq_codes` is the blocked ("lazy batch")
form of the same algorithm: updates inside a block of BLOCK columns, one matrix product per block for the rest.
Both run in float64 and give the same codes (tests/test_quant_gptq.py).
"""
from __future__ import annotations

import numpy as np

from nanoqwen_format.constants import INT4_ZERO_CODE
from nanoqwen_format.int4_layout import pack_int4_reference

from .quantize import QMAX, QMIN, QuantizationError, check_shape, quantize

# Damping: H + DAMP_REL * mean(diag H) * I before inversion. GPTQ's default (1 %): keeps the Cholesky factor of a
# rank-deficient H (fewer calibration tokens than K, or dead input channels) well conditioned.
DAMP_REL = 0.01
BLOCK = 128                       # columns updated together in gptq_codes (the paper's lazy-batch width)
SCALE_MODES = ("rtn", "mse")      # how the fixed per-group scales are chosen before the error feedback
GPTQ_SCALE_MODE = "mse"           # what --mode gptq uses (bench/RESULTS.md: lower perplexity than rtn scales)


def hessian(x: np.ndarray) -> np.ndarray:
    """x: (T, K) inputs of a linear layer → H = (2/T) x^T x, float64 (K, K)."""
    x = np.asarray(x, dtype=np.float64)
    return (2.0 / max(1, x.shape[0])) * (x.T @ x)


def inverse_cholesky(h: np.ndarray, damp_rel: float = DAMP_REL) -> np.ndarray:
    """Upper Cholesky factor U of (H + damp)^-1 (U^T U = (H + damp)^-1), float64 (K, K). Dead channels
    (diag H == 0: never active in the calibration text) get diag 1, so they are rounded plainly."""
    h = np.array(h, dtype=np.float64, copy=True)
    k = h.shape[0]
    if h.shape != (k, k) or not np.isfinite(h).all():
        raise QuantizationError(f"hessian: expected a finite ({k}, {k}) matrix, found shape {h.shape}")
    dead = np.diag(h) <= 0
    h[dead, :] = 0
    h[:, dead] = 0
    h[dead, dead] = 1.0
    mean_diag = float(np.mean(np.diag(h)))
    h[np.diag_indices(k)] += damp_rel * mean_diag
    try:
        lower = np.linalg.cholesky(h)                                # H = L L^T
        l_inv = np.linalg.inv(lower)                                 # triangular inverse, float64
        h_inv = l_inv.T @ l_inv                                      # H^-1 = L^-T L^-1
        return np.linalg.cholesky(h_inv).T                           # upper U with U^T U = H^-1
    except np.linalg.LinAlgError as e:
        raise QuantizationError(f"hessian is not positive definite after damping ({e})") from None


def _round(w: np.ndarray, s: np.ndarray) -> np.ndarray:
    """q = clamp(rint(w / s), -8, 7) elementwise (float64), q = 0 where s == 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.rint(w / np.where(s == 0, 1.0, s))
    return np.where(s == 0, 0.0, np.clip(q, QMIN, QMAX))


def gptq_codes_reference(w, u: np.ndarray, scales, group_size: int) -> np.ndarray:
    """Reference: one column at a time. w float (N, K), u = inverse_cholesky(H), scales f16 (N, K/g)
    → codes int8 (N, K) in -8..7."""
    w = np.array(w, dtype=np.float64, copy=True)
    s_all = np.asarray(scales, dtype=np.float64)
    n, k = w.shape
    q = np.zeros((n, k), np.int8)
    for j in range(k):
        s = s_all[:, j // group_size]
        qj = _round(w[:, j], s)
        q[:, j] = qj
        err = (w[:, j] - s * qj) / u[j, j]
        w[:, j + 1:] -= np.outer(err, u[j, j + 1:])
    return q


def gptq_codes(w, u: np.ndarray, scales, group_size: int, block: int = BLOCK) -> np.ndarray:
    """Fast path: the same algorithm in blocks of `block` columns (lazy batch updates). Same inputs / output as
    gptq_codes_reference."""
    w = np.array(w, dtype=np.float64, copy=True)
    s_all = np.asarray(scales, dtype=np.float64)
    n, k = w.shape
    q = np.zeros((n, k), np.int8)
    for a in range(0, k, block):
        b = min(k, a + block)
        wb = w[:, a:b]                                      # view: updated in place
        errb = np.empty((n, b - a))
        ub = u[a:b, a:b]
        for i in range(b - a):
            s = s_all[:, (a + i) // group_size]
            qi = _round(wb[:, i], s)
            q[:, a + i] = qi
            err = (wb[:, i] - s * qi) / ub[i, i]
            wb[:, i + 1:] -= np.outer(err, ub[i, i + 1:])
            errb[:, i] = err
        if b < k:
            w[:, b:] -= errb @ u[a:b, b:]
    return q


def gptq_objective(w, codes: np.ndarray, scales, group_size: int, h: np.ndarray) -> float:
    """E(Q) = tr((W - Q) H (W - Q)^T) with Q = s * codes (float64). The calibration objective GPTQ lowers."""
    w = np.asarray(w, dtype=np.float64)
    s = np.repeat(np.asarray(scales, dtype=np.float64), group_size, axis=1)     # (N, K)
    d = w - s * codes
    return float(np.einsum("nk,kl,nl->", d, np.asarray(h, dtype=np.float64), d))


def pack_codes(codes: np.ndarray) -> np.ndarray:
    """codes int (N, K) in -8..7 → qweight uint32 (N, K/8), layout 1."""
    return pack_int4_reference((codes.astype(np.int16) + INT4_ZERO_CODE).astype(np.uint8))


def gptq_quantize(w, h: np.ndarray, group_size: int = 128, scale_mode: str = "mse", damp_rel: float = DAMP_REL,
                  block: int = BLOCK, u: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """float32 (N, K) weight + its input Hessian (K, K) → (qweight uint32 (N, K/8), scales float16 (N, K/g)),
    layout 1. Scales come from the spec's `scale_mode` rule (rtn or mse) on w; codes from GPTQ. u: a precomputed
    inverse_cholesky(h, damp_rel) (the converter computes it once per tensor and quantizes rows in blocks)."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    check_shape(w.shape, group_size)
    if scale_mode not in SCALE_MODES:
        raise QuantizationError(f"scale_mode: expected one of {SCALE_MODES}, found {scale_mode!r}")
    if h.shape != (w.shape[1], w.shape[1]):
        raise QuantizationError(f"hessian shape {h.shape} does not match in_features K={w.shape[1]}")
    _, scales = quantize(w, group_size, scale_mode)           # raises on non-finite weights / f16 overflow
    codes = gptq_codes(w, inverse_cholesky(h, damp_rel) if u is None else u, scales, group_size, block)
    return pack_codes(codes), scales
