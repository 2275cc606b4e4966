"""numba kernels of the CPU backend: streaming GEMM/GEMV straight from the file's packed weights.

Every kernel computes ``out[t, n] = sum_k W[n, k] * x[t, k]`` with float32 accumulation, reading the weight in its
stored form (zero-copy views of the mmap'd file):
  * int4g layout 1: ``qweight`` uint32 (N, K/8) + ``scales`` f16 bits as uint16 (N, K/g);
  * f16 / bf16: uint16 bits (N, K), widened through a 65536-entry float32 lookup table (exact).
Work is split over blocks of rows (numba prange); each block dequantizes ONE row into a float32 (K,) scratch
buffer and reuses it for all T tokens, so prefill (T > 1) pays the dequantization once per row, and nothing of
the size of the whole weight is ever materialised. The slow references (`*_reference`) sit beside them for tests.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

__all__ = ["F16_LUT", "BF16_LUT", "PERM", "matmul_int4", "matmul_u16", "rows_u16",
           "matmul_int4_reference", "matmul_u16_reference"]

#: float32 value of every f16 bit pattern (index = uint16 bits); exact widening
F16_LUT: np.ndarray = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
#: float32 value of every bf16 bit pattern: bf16 is the top half of an f32
BF16_LUT: np.ndarray = (np.arange(65536, dtype=np.uint32) << 16).view(np.float32).copy()

#: layout 1: nibble i of a word holds the value at k = 8j + PERM[i] (spec, docs/architecture.md)
PERM = np.array([0, 2, 4, 6, 1, 3, 5, 7], dtype=np.int64)

_ROW_BLOCK = 16   # rows per parallel work item: enough work per item, small enough to balance 2..128 cores


@njit(parallel=True, cache=True, fastmath=True)
def matmul_int4(x, qweight, scale_bits, lut, group_size, out):
    """x: f32 (T, K); qweight: u32 (N, K/8); scale_bits: u16 (N, K/g) f16 bits; lut: F16_LUT; out: f32 (T, N)."""
    T, K = x.shape
    N = qweight.shape[0]
    n_blocks = (N + _ROW_BLOCK - 1) // _ROW_BLOCK
    for b in prange(n_blocks):
        w = np.empty(K, dtype=np.float32)          # (K,) one dequantized row
        for n in range(b * _ROW_BLOCK, min(N, (b + 1) * _ROW_BLOCK)):
            for j in range(K // 8):
                word = qweight[n, j]
                s = lut[scale_bits[n, (8 * j) // group_size]]
                base = 8 * j
                # nibble i → k = 8j + PERM[i], PERM = [0, 2, 4, 6, 1, 3, 5, 7]
                w[base + 0] = s * (np.float32((word >> 0) & 0xF) - np.float32(8.0))
                w[base + 2] = s * (np.float32((word >> 4) & 0xF) - np.float32(8.0))
                w[base + 4] = s * (np.float32((word >> 8) & 0xF) - np.float32(8.0))
                w[base + 6] = s * (np.float32((word >> 12) & 0xF) - np.float32(8.0))
                w[base + 1] = s * (np.float32((word >> 16) & 0xF) - np.float32(8.0))
                w[base + 3] = s * (np.float32((word >> 20) & 0xF) - np.float32(8.0))
                w[base + 5] = s * (np.float32((word >> 24) & 0xF) - np.float32(8.0))
                w[base + 7] = s * (np.float32((word >> 28) & 0xF) - np.float32(8.0))
            for t in range(T):
                acc = np.float32(0.0)
                for k in range(K):
                    acc += w[k] * x[t, k]
                out[t, n] = acc


@njit(parallel=True, cache=True, fastmath=True)
def matmul_u16(x, w_bits, lut, out):
    """x: f32 (T, K); w_bits: u16 (N, K) f16 or bf16 bits; lut: F16_LUT or BF16_LUT; out: f32 (T, N)."""
    T, K = x.shape
    N = w_bits.shape[0]
    n_blocks = (N + _ROW_BLOCK - 1) // _ROW_BLOCK
    for b in prange(n_blocks):
        w = np.empty(K, dtype=np.float32)          # (K,) one widened row
        for n in range(b * _ROW_BLOCK, min(N, (b + 1) * _ROW_BLOCK)):
            for k in range(K):
                w[k] = lut[w_bits[n, k]]
            for t in range(T):
                acc = np.float32(0.0)
                for k in range(K):
                    acc += w[k] * x[t, k]
                out[t, n] = acc


@njit(cache=True)
def rows_u16(w_bits, ids, lut, out):
    """Embedding gather: out[t, :] = lut[w_bits[ids[t], :]]. w_bits u16 (V, H); ids int32 (T,); out f32 (T, H)."""
    for t in range(ids.shape[0]):
        r = ids[t]
        for k in range(w_bits.shape[1]):
            out[t, k] = lut[w_bits[r, k]]


# -- slow, obvious references (tests) ---------------------------------------------------------------------
def matmul_int4_reference(x: np.ndarray, qweight: np.ndarray, scales_f16: np.ndarray, group_size: int) -> np.ndarray:
    """Unpack every nibble with the layout-1 rule, dequantize in float64, multiply in float64."""
    N, KW = qweight.shape
    K = KW * 8
    u = np.empty((N, K), dtype=np.int64)
    for i in range(8):
        u[:, PERM[i]::8] = (qweight.astype(np.int64) >> (4 * i)) & 0xF
    s = np.repeat(scales_f16.astype(np.float64), group_size, axis=1)     # (N, K)
    w = s * (u - 8)
    return (x.astype(np.float64) @ w.T)


def matmul_u16_reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """w: float16 array, or uint16 bf16 bits; widened with numpy (not the LUT), float64 product."""
    if w.dtype == np.uint16:
        wf = (w.astype(np.uint32) << 16).view(np.float32)
    else:
        wf = w.astype(np.float32)
    return x.astype(np.float64) @ wf.astype(np.float64).T
