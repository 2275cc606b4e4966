"""Fast exact dequantization of GPTQ / AWQ packed weights (numba, parallel over output rows), bit-identical to the
numpy references `gptq.GPTQLinear.dequantize_reference` / `awq.dequantize_reference` (tests/test_import_*.py).

Both compute w[n, k] = float32(s[g, n]) * (float32(q[k, n]) - float32(zero[g, n])) with g the group of k: the codes
and zeros are small integers and s an f16 value, so the float32 product is exact and equal in any order.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(cache=True, parallel=True)
def _gptq_kernel(words_t, scales_t, zeros_t, gidx, out):
    """words_t uint32 (N, K/8): GPTQ qweight transposed (word r of row n holds k = 8r + j at nibble j);
    scales_t / zeros_t float32 (N, G); gidx int64 (K,); out float32 (N, K)."""
    n_rows, n_words = words_t.shape
    for n in prange(n_rows):
        for r in range(n_words):
            w = words_t[n, r]
            for j in range(8):
                k = 8 * r + j
                g = gidx[k]
                out[n, k] = scales_t[n, g] * (np.float32((w >> np.uint32(4 * j)) & np.uint32(0xF)) - zeros_t[n, g])


@njit(cache=True, parallel=True)
def _awq_kernel(words_t, order, scales_t, zeros_t, group, out):
    """words_t uint32 (N/8, K): AWQ qweight transposed (word (c, k) holds n = 8c + order[i] at nibble i);
    scales_t / zeros_t float32 (N, G); out float32 (N, K)."""
    n_cols, k_all = words_t.shape
    for c in prange(n_cols):
        for k in range(k_all):
            w = words_t[c, k]
            g = k // group
            for i in range(8):
                n = 8 * c + order[i]
                out[n, k] = scales_t[n, g] * (np.float32((w >> np.uint32(4 * i)) & np.uint32(0xF)) - zeros_t[n, g])


def gptq_dequantize_fast(qweight: np.ndarray, scales: np.ndarray, zeros: np.ndarray, gidx: np.ndarray) -> np.ndarray:
    """4-bit GPTQ: qweight int32 (K/8, N), scales float32 (G, N), zeros (G, N) (already offset), gidx (K,) →
    float32 (N, K)."""
    k8, n = qweight.shape
    out = np.empty((n, 8 * k8), np.float32)
    _gptq_kernel(np.ascontiguousarray(qweight.view(np.uint32).T), np.ascontiguousarray(scales.T, dtype=np.float32),
                 np.ascontiguousarray(zeros.T, dtype=np.float32), np.ascontiguousarray(gidx, dtype=np.int64), out)
    return out


def awq_dequantize_fast(qweight: np.ndarray, scales: np.ndarray, zeros: np.ndarray, order, group: int) -> np.ndarray:
    """AWQ GEMM: qweight int32 (K, N/8), scales float32 (G, N), zeros (G, N) → float32 (N, K)."""
    k, n8 = qweight.shape
    out = np.empty((8 * n8, k), np.float32)
    _awq_kernel(np.ascontiguousarray(qweight.view(np.uint32).T), np.asarray(order, dtype=np.int64),
                np.ascontiguousarray(scales.T, dtype=np.float32), np.ascontiguousarray(zeros.T, dtype=np.float32),
                group, out)
    return out
