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

Act-order: the columns are processed in order of descending diag(H) (the inputs with the most energy first, while
the most columns are left to absorb their error), which is AutoGPTQ's desc_act. Because the scales were fixed
per plain group before the permutation (AutoGPTQ's static_groups), the file's layout stays plain g-wise: no g_idx,
no input permutation at run time. bench/NOTES.md ("GPTQ at the same group size") has the measured gain.

`gptq_codes_reference` is the textbook one-column-at-a-time loop; `gptq_codes` is the blocked ("lazy batch")
form of the same algorithm: inside a block of BLOCK columns a numba kernel parallel over rows (GPTQ's rows do not
interact), one matrix product per block for the columns after it. Both run in float64 and give the same codes
(tests/test_quant_gptq.py).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

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


def act_order(h: np.ndarray) -> np.ndarray:
    """GPTQ's act-order: the columns in order of descending diag(H) (stable), so the inputs with the most energy are
    quantized first, while the most columns are left to absorb their error. int64 (K,)."""
    return np.argsort(-np.diag(np.asarray(h, dtype=np.float64)), kind="stable")


def _order(order, k: int) -> np.ndarray:
    perm = np.arange(k) if order is None else np.asarray(order, dtype=np.int64)
    if perm.shape != (k,) or not np.array_equal(np.sort(perm), np.arange(k)):
        raise QuantizationError(f"order: expected a permutation of {k} columns")
    return perm


def gptq_codes_reference(w, u: np.ndarray, scales, group_size: int, order=None) -> np.ndarray:
    """Reference: one column at a time. w float (N, K), scales f16 (N, K/g), order: the columns' processing order
    (a permutation of K; None = left to right), u = inverse_cholesky of H with rows and columns in that order
    (H[order][:, order]). → codes int8 (N, K) in -8..7, in the original column order. Column order[j] keeps the
    scale of its own group order[j] // g: the groups stay plain runs of g columns ("static groups")."""
    w = np.array(w, dtype=np.float64, copy=True)
    s_all = np.asarray(scales, dtype=np.float64)
    n, k = w.shape
    perm = _order(order, k)
    wp = w[:, perm]
    q = np.zeros((n, k), np.int8)
    for j in range(k):
        c = perm[j]
        s = s_all[:, c // group_size]
        qj = _round(wp[:, j], s)
        q[:, c] = qj
        err = (wp[:, j] - s * qj) / u[j, j]
        wp[:, j + 1:] -= np.outer(err, u[j, j + 1:])
    return q


@njit(cache=True, parallel=True)
def _block_kernel(wb, ub, s_all, gcol, qb, errb):
    """One block of columns, every row independently (GPTQ's rows do not interact): wb (N, B) float64 updated in
    place, ub (B, B) the block of U, s_all (N, K/g) float64 scales, gcol (B,) each column's group, qb (N, B) int8
    codes out, errb (N, B) the scaled errors out (for the update of the columns after the block)."""
    n, bw = wb.shape
    for r in prange(n):
        for i in range(bw):
            s = s_all[r, gcol[i]]
            x = wb[r, i]
            c = 0.0
            if s != 0.0:
                c = np.rint(x / s)
                c = min(max(c, float(QMIN)), float(QMAX))
            qb[r, i] = np.int8(c)
            e = (x - s * c) / ub[i, i]
            errb[r, i] = e
            for j in range(i + 1, bw):
                wb[r, j] -= e * ub[i, j]


def gptq_codes(w, u: np.ndarray, scales, group_size: int, block: int = BLOCK, order=None) -> np.ndarray:
    """Fast path: the same algorithm in blocks of `block` columns (lazy batch updates: inside a block numba,
    parallel over rows; after it one matrix product for the remaining columns). Same inputs / output as
    gptq_codes_reference."""
    w = np.asarray(w, dtype=np.float64)
    s_all = np.ascontiguousarray(scales, dtype=np.float64)
    n, k = w.shape
    perm = _order(order, k)
    wp = np.ascontiguousarray(w[:, perm])
    gcol = perm // group_size
    u = np.ascontiguousarray(u, dtype=np.float64)
    qp = np.empty((n, k), np.int8)
    for a in range(0, k, block):
        b = min(k, a + block)
        wb = np.ascontiguousarray(wp[:, a:b])
        qb = np.empty((n, b - a), np.int8)
        errb = np.empty((n, b - a))
        _block_kernel(wb, np.ascontiguousarray(u[a:b, a:b]), s_all, gcol[a:b], qb, errb)
        qp[:, a:b] = qb
        if b < k:
            wp[:, b:] -= errb @ u[a:b, b:]
    q = np.empty_like(qp)
    q[:, perm] = qp
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


def gptq_prepare(h: np.ndarray, damp_rel: float = DAMP_REL) -> tuple[np.ndarray, np.ndarray]:
    """What GPTQ needs from a Hessian, computed once per tensor (rows are independent): (order, u) with
    order = act_order(h) and u = inverse_cholesky(H[order][:, order], damp_rel)."""
    h = np.asarray(h, dtype=np.float64)
    if h.ndim != 2 or h.shape[0] != h.shape[1]:
        raise QuantizationError(f"hessian: expected a square matrix, found shape {h.shape}")
    order = act_order(h)
    return order, inverse_cholesky(h[np.ix_(order, order)], damp_rel)


def gptq_quantize(w, h: np.ndarray, group_size: int = 128, scale_mode: str = "mse", damp_rel: float = DAMP_REL,
                  block: int = BLOCK, prepared: tuple[np.ndarray, np.ndarray] | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """float32 (N, K) weight + its input Hessian (K, K) → (qweight uint32 (N, K/8), scales float16 (N, K/g)),
    layout 1. Scales come from the spec's `scale_mode` rule (rtn or mse) on w, per plain group; codes from GPTQ
    with act-order (static groups). prepared: gptq_prepare(h, damp_rel), when the caller quantizes a tensor's
    rows in blocks."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    check_shape(w.shape, group_size)
    if scale_mode not in SCALE_MODES:
        raise QuantizationError(f"scale_mode: expected one of {SCALE_MODES}, found {scale_mode!r}")
    if h.shape != (w.shape[1], w.shape[1]):
        raise QuantizationError(f"hessian shape {h.shape} does not match in_features K={w.shape[1]}")
    _, scales = quantize(w, group_size, scale_mode)           # raises on non-finite weights / f16 overflow
    order, u = gptq_prepare(h, damp_rel) if prepared is None else prepared
    codes = gptq_codes(w, u, scales, group_size, block, order=order)
    return pack_codes(codes), scales
