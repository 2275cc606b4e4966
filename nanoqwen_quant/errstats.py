"""Per-block error statistics for nanoqwen-verify: Σref², Σ(ref−got)², max |ref−got| and the number of elements
over their bound, in one pass (numba, parallel over rows) — plus the numpy reference they are tested against
(tests/test_verify_stats.py).

Bounds (documented in nanoqwen_quant.verify):
* plain tensors: |e| <= rel·|w| + ab
* int4 tensors, per element with its group's scale s: |e| <= max(s/2, |w| − 7s)·(1 + slack_rel) + slack_abs,
  and where s == 0: |w| <= zero_max.
A NaN error counts as a violation. Arrays: ref, got float32 (R, M); scales float32 (R, M/g).
Returns float64 (4,): [Σref², Σe², max|e|, violations].
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .quantize import QMAX      # largest positive int4 code q


@njit(cache=True, parallel=True)
def _stats_plain_kernel(ref, got, rel, ab, out):
    """out float64 (R, 4) per row."""
    for r in prange(ref.shape[0]):
        sig = 0.0
        err = 0.0
        mx = 0.0
        bad = 0
        for k in range(ref.shape[1]):
            w = np.float64(ref[r, k])
            e = abs(w - np.float64(got[r, k]))
            sig += w * w
            err += e * e
            mx = e if e > mx else mx
            if not (e <= rel * abs(w) + ab):
                bad += 1
        out[r, 0] = sig
        out[r, 1] = err
        out[r, 2] = mx
        out[r, 3] = bad


@njit(cache=True, parallel=True)
def _stats_int4_kernel(ref, got, scales, g, slack_rel, slack_abs, zero_max, out):
    for r in prange(ref.shape[0]):
        sig = 0.0
        err = 0.0
        mx = 0.0
        bad = 0
        for k in range(ref.shape[1]):
            w = np.float64(ref[r, k])
            s = np.float64(scales[r, k // g])
            e = abs(w - np.float64(got[r, k]))
            sig += w * w
            err += e * e
            mx = e if e > mx else mx
            if s == 0:
                lim = zero_max
            else:
                lim = max(s / 2, abs(w) - QMAX * s) * (1 + slack_rel) + slack_abs
            if not (e <= lim):
                bad += 1
        out[r, 0] = sig
        out[r, 1] = err
        out[r, 2] = mx
        out[r, 3] = bad


def _reduce(per_row: np.ndarray) -> np.ndarray:
    if per_row.shape[0] == 0:
        return np.zeros(4)
    return np.array([per_row[:, 0].sum(), per_row[:, 1].sum(), per_row[:, 2].max(), per_row[:, 3].sum()])


def stats_plain(ref, got, rel: float, ab: float) -> np.ndarray:
    ref2, got2 = np.ascontiguousarray(ref).reshape(ref.shape[0], -1), np.ascontiguousarray(got).reshape(ref.shape[0], -1)
    out = np.empty((ref2.shape[0], 4))
    _stats_plain_kernel(ref2, got2, float(rel), float(ab), out)
    return _reduce(out)


def stats_int4(ref, got, scales32, g: int, slack_rel: float, slack_abs: float, zero_max: float) -> np.ndarray:
    out = np.empty((ref.shape[0], 4))
    _stats_int4_kernel(np.ascontiguousarray(ref), np.ascontiguousarray(got), np.ascontiguousarray(scales32),
                       g, float(slack_rel), float(slack_abs), float(zero_max), out)
    return _reduce(out)


# ------------------------------------------------------------------------------------------------ references
def stats_plain_reference(ref, got, rel, ab) -> np.ndarray:
    r = np.asarray(ref, np.float64)
    e = np.abs(r - np.asarray(got, np.float64))
    bad = np.count_nonzero(~(e <= np.abs(r) * rel + ab))
    return np.array([np.sum(r * r), np.sum(e * e), e.max() if e.size else 0.0, bad])


def stats_int4_reference(ref, got, scales32, g, slack_rel, slack_abs, zero_max) -> np.ndarray:
    r = np.asarray(ref, np.float64)
    e = np.abs(r - np.asarray(got, np.float64))
    s = np.repeat(np.asarray(scales32, np.float64), g, axis=1)
    lim = np.maximum(s / 2, np.abs(r) - QMAX * s) * (1 + slack_rel) + slack_abs
    lim = np.where(s == 0, zero_max, lim)
    bad = np.count_nonzero(~(e <= lim))
    return np.array([np.sum(r * r), np.sum(e * e), e.max() if e.size else 0.0, bad])
