"""numba kernels of the CPU backend: streaming GEMM/GEMV straight from the file's packed weights.

Every kernel computes ``out[t, n] = sum_k W[n, k] * x[t, k]`` with float32 accumulation, reading the weight in its
stored form (zero-copy views of the mmap'd file):
  * int4g layout 1: ``qweight`` uint32 (N, K/8) + ``scales`` f16 bits as uint16 (N, K/g);
  * f16 / bf16: uint16 bits (N, K), widened through a 65536-entry float32 lookup table (exact).
Decode (T == 1) runs a fused unpack-multiply GEMV; prefill (T > 1) dequantizes ONE row into a float32 (K,)
scratch buffer and reuses it for all T tokens, so it pays the dequantization once per row, and nothing of the
size of the whole weight is ever materialised. Large weights are split over blocks of rows (numba prange),
small ones run serially (thread hand-off costs more than it saves there). The slow references (`*_reference`) sit beside them for tests.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

__all__ = ["F16_LUT", "BF16_LUT", "PERM", "matmul_int4", "matmul_u16", "rows_u16",
           "matmul_int4_reference", "matmul_u16_reference", "PARALLEL_MIN_WEIGHTS"]

#: float32 value of every f16 bit pattern (index = uint16 bits); exact widening
F16_LUT: np.ndarray = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
#: float32 value of every bf16 bit pattern: bf16 is the top half of an f32
BF16_LUT: np.ndarray = (np.arange(65536, dtype=np.uint32) << 16).view(np.float32).copy()

#: layout 1: nibble i of a word holds the value at k = 8j + PERM[i] (spec, docs/architecture.md)
PERM = np.array([0, 2, 4, 6, 1, 3, 5, 7], dtype=np.int64)

_ROW_BLOCK = 64   # rows per parallel work item: enough work per item to amortise the thread hand-off

#: weights (N*K) from which the parallel kernels are used; below it the hand-off to numba's thread pool costs more
#: than it saves (measured on the 2-core CI box: a 256x256 GEMV takes 25 us serial vs 400+ us parallel under load)
PARALLEL_MIN_WEIGHTS = 1 << 21


@njit(cache=True, fastmath=True, inline="always")
def _nib(word, shift):
    """Signed code of one nibble as float32: u - 8."""
    return np.float32((word >> shift) & 0xF) - np.float32(8.0)


@njit(cache=True, fastmath=True)
def _int4_rows(x, qweight, scale_bits, lut, group_size, out, n0, n1):
    """Rows [n0, n1) of out = x @ W.T for an int4g layout-1 weight (see matmul_int4)."""
    T, K = x.shape
    words_per_group = group_size // 8
    n_groups = K // group_size
    if T == 1:
        # GEMV: fused unpack + multiply, one f32 partial sum per group, scaled once per group
        for n in range(n0, n1):
            acc = np.float32(0.0)
            for gi in range(n_groups):
                a = np.float32(0.0)
                for jj in range(words_per_group):
                    j = gi * words_per_group + jj
                    w = qweight[n, j]
                    b = 8 * j
                    # nibble i → k = 8j + PERM[i], PERM = [0, 2, 4, 6, 1, 3, 5, 7]
                    a += (_nib(w, 0) * x[0, b] + _nib(w, 4) * x[0, b + 2] + _nib(w, 8) * x[0, b + 4]
                          + _nib(w, 12) * x[0, b + 6] + _nib(w, 16) * x[0, b + 1] + _nib(w, 20) * x[0, b + 3]
                          + _nib(w, 24) * x[0, b + 5] + _nib(w, 28) * x[0, b + 7])
                acc += lut[scale_bits[n, gi]] * a
            out[0, n] = acc
        return
    # GEMM (prefill): dequantize one row into (K,) scratch once, reuse it for all T tokens
    w_row = np.empty(K, dtype=np.float32)
    for n in range(n0, n1):
        for j in range(K // 8):
            word = qweight[n, j]
            s = lut[scale_bits[n, (8 * j) // group_size]]
            b = 8 * j
            w_row[b + 0] = s * _nib(word, 0)
            w_row[b + 2] = s * _nib(word, 4)
            w_row[b + 4] = s * _nib(word, 8)
            w_row[b + 6] = s * _nib(word, 12)
            w_row[b + 1] = s * _nib(word, 16)
            w_row[b + 3] = s * _nib(word, 20)
            w_row[b + 5] = s * _nib(word, 24)
            w_row[b + 7] = s * _nib(word, 28)
        for t in range(T):
            acc = np.float32(0.0)
            for k in range(K):
                acc += w_row[k] * x[t, k]
            out[t, n] = acc


@njit(parallel=True, cache=True, fastmath=True)
def _int4_parallel(x, qweight, scale_bits, lut, group_size, out):
    N = qweight.shape[0]
    for b in prange((N + _ROW_BLOCK - 1) // _ROW_BLOCK):
        _int4_rows(x, qweight, scale_bits, lut, group_size, out, b * _ROW_BLOCK, min(N, (b + 1) * _ROW_BLOCK))


@njit(cache=True, fastmath=True)
def _int4_serial(x, qweight, scale_bits, lut, group_size, out):
    _int4_rows(x, qweight, scale_bits, lut, group_size, out, 0, qweight.shape[0])


def matmul_int4(x, qweight, scale_bits, lut, group_size, out):
    """out = x @ W.T. x: f32 (T, K) C-contiguous; qweight: u32 (N, K/8); scale_bits: u16 (N, K/g) f16 bits;
    lut: F16_LUT; out: f32 (T, N), every element written. Parallel over row blocks for large weights."""
    if qweight.shape[0] * qweight.shape[1] * 8 >= PARALLEL_MIN_WEIGHTS:
        _int4_parallel(x, qweight, scale_bits, lut, group_size, out)
    else:
        _int4_serial(x, qweight, scale_bits, lut, group_size, out)


@njit(cache=True, fastmath=True)
def _u16_rows(x, w_bits, lut, out, n0, n1):
    T, K = x.shape
    if T == 1:
        for n in range(n0, n1):
            acc = np.float32(0.0)
            for k in range(K):
                acc += lut[w_bits[n, k]] * x[0, k]
            out[0, n] = acc
        return
    w_row = np.empty(K, dtype=np.float32)          # (K,) one widened row
    for n in range(n0, n1):
        for k in range(K):
            w_row[k] = lut[w_bits[n, k]]
        for t in range(T):
            acc = np.float32(0.0)
            for k in range(K):
                acc += w_row[k] * x[t, k]
            out[t, n] = acc


@njit(parallel=True, cache=True, fastmath=True)
def _u16_parallel(x, w_bits, lut, out):
    N = w_bits.shape[0]
    for b in prange((N + _ROW_BLOCK - 1) // _ROW_BLOCK):
        _u16_rows(x, w_bits, lut, out, b * _ROW_BLOCK, min(N, (b + 1) * _ROW_BLOCK))


@njit(cache=True, fastmath=True)
def _u16_serial(x, w_bits, lut, out):
    _u16_rows(x, w_bits, lut, out, 0, w_bits.shape[0])


def matmul_u16(x, w_bits, lut, out):
    """out = x @ W.T. x: f32 (T, K); w_bits: u16 (N, K) f16 or bf16 bits; lut: F16_LUT or BF16_LUT;
    out: f32 (T, N). Parallel over row blocks for large weights."""
    if w_bits.shape[0] * w_bits.shape[1] >= PARALLEL_MIN_WEIGHTS:
        _u16_parallel(x, w_bits, lut, out)
    else:
        _u16_serial(x, w_bits, lut, out)


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
