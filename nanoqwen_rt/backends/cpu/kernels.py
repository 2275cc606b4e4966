"""numba kernels of the CPU backend: GEMV / GEMM straight from the file's packed weights.

Every kernel computes ``out[t, n] = sum_k W[n, k] * x[t, k]`` with float32 accumulation, reading the weight in its
stored form (zero-copy views of the mmap'd file):
  * int4g layouts 1 and 2: ``qweight`` uint32 (N, K/8) + ``scales`` f16 bits as uint16 (N, K/g) + ``zeros`` uint8
    (N, K/g), the zero point of each group: layout 2's stored ones, or for layout 1 a shared read-only array of
    its constant 8 (`symmetric_zeros`), so both layouts run the same code and layout 1's arithmetic is what it was
    (a product by 8.0 is exact, whether the 8 is a constant or read from memory);
  * f16 / bf16: uint16 bits (N, K), widened exactly in registers (`_widen_f16`: the CPU's f16 conversion;
    `_widen_bf16`: a shift).

Decode (one token, T == 1) runs a GEMV written so that LLVM vectorises it across words of the packed row:
  * the input is first permuted to match the nibble order of a word (`_permute_x`: xp[i, j] = x[8j + PERM[i]]),
    and pre-scaled by 2^-4i, so nibble i of word j is multiplied as ``float(w & (0xF << 4i)) * xp[i, j]``: one AND,
    one int→float conversion and one FMA per nibble, with no shift and no gather;
  * the offset of the codes (u - z, z the group's zero point) is taken out of the loop: sum (u - z) x =
    sum u x - z sum x, with sum x per group computed once per input (`xs`);
  * the per-word partial sums of a row go to a small scratch, then are summed per group and scaled once per group.
Prefill (T > 1) dequantizes a tile of rows to float32 once (`_dequant_int4_rows`, columns in the words' nibble-plane
order, the input columns permuted to match) and multiplies all T tokens
with it through numpy's BLAS (``np.dot``), tile by tile, so the dequantization is paid once per weight per prompt
and the multiply runs at BLAS speed; nothing of the size of the whole weight is materialised.

Threads: a GEMV is split over row blocks by ``prange`` (numba's OpenMP pool, PASSIVE wait policy: see below) when
the weight is large enough (PARALLEL_MIN_WEIGHTS); q/k/v and gate/up share one parallel region (gemv_int4_multi).
A prompt's tiles are split between the backend's own worker threads (one per numba thread), each multiplying with
numpy's BLAS held to one thread (blas_single_threaded): one hand-off per matmul, no thread waits inside it.
The slow references (`*_reference`) sit beside the kernels for tests.
"""
from __future__ import annotations

import itertools
import os
import threading
from concurrent.futures import ThreadPoolExecutor

# numba runs the parallel GEMVs on its OpenMP pool (its default threading layer where libgomp is present). GNU
# OpenMP's default wait policy makes idle pool threads spin; on a busy machine they then burn the time slices the
# working threads need: measured on the shared 2-core box at load average 9, a 4864x896 INT4 GEMV took 33 ms per
# call with the default policy, 4 ms serial and 1.1 ms with PASSIVE (sleeping) pool threads (bench/NOTES.md). So the
# backend asks for PASSIVE for its process, unless the user chose a policy; libgomp reads it when it is first loaded,
# which is numba's first parallel call (a libgomp loaded earlier by another library keeps its own setting).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numba  # noqa: E402
import numpy as np  # noqa: E402
from llvmlite import ir  # noqa: E402
from numba import njit, prange, types  # noqa: E402
from numba.extending import intrinsic  # noqa: E402
from threadpoolctl import ThreadpoolController  # noqa: E402

__all__ = ["F16_LUT", "BF16_LUT", "PERM", "symmetric_zeros", "matmul_int4", "matmul_u16", "rows_u16", "gemv_int4", "gemm_int4",
           "gemv_u16", "gemm_u16", "gemv_int4_multi", "gemm_int4_multi", "matmul_int4_reference", "matmul_u16_reference", "PARALLEL_MIN_WEIGHTS",
           "widen_f16_bits", "warmup_kernels", "blas_single_threaded", "rms_norm", "silu_mul", "attention", "attention_prefill", "rms_norm_reference",
           "silu_mul_reference", "attention_reference"]

#: float32 value of every f16 bit pattern (index = uint16 bits); exact widening (embedding gather, tests)
F16_LUT: np.ndarray = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
#: float32 value of every bf16 bit pattern: bf16 is the top half of an f32
BF16_LUT: np.ndarray = (np.arange(65536, dtype=np.uint32) << 16).view(np.float32).copy()

#: layout 1: nibble i of a word holds the value at k = 8j + PERM[i] (spec, docs/architecture.md)
PERM = np.array([0, 2, 4, 6, 1, 3, 5, 7], dtype=np.int64)

#: layout 1's zero point: its codes are u = q + 8 (nanoqwen_format's INT4_ZERO_CODE)
SYMMETRIC_ZERO = 8

_ROW_BLOCK = 64   # rows per parallel work item of a GEMV: enough work per item to amortise the thread hand-off

#: weights (N*K) from which a GEMV is split over threads; below it the hand-off to numba's thread pool costs more
#: than it saves (measured on the 2-core CI box: a 256x256 GEMV takes 25 us serial vs 400+ us parallel under load)
PARALLEL_MIN_WEIGHTS = 1 << 21

#: float32 elements of one dequantized prefill tile: 256 KB, so the tile and the BLAS packing of it stay in L2.
#: (1 MB tiles were 0-40 % faster in a noisy single-threaded test, but OpenBLAS picks other kernels by matrix size,
#: so the tile size is part of the oracle's float32 rounding on small shapes: kept, bench/NOTES.md)
_TILE_ELEMENTS = 1 << 16

_zeros_lock = threading.Lock()
_symmetric_zeros: dict = {}


def symmetric_zeros(n: int, groups: int) -> np.ndarray:
    """Layout 1's zero points as the kernels read layout 2's: uint8 (n, groups) all SYMMETRIC_ZERO, read-only (the
    type of the file's mmap'd views, so a q/k/v tuple mixing the layouts is one numba type), one array per shape
    shared by every weight of that shape (a few distinct shapes per model: ~1 MB for a 7B one)."""
    key = (int(n), int(groups))
    with _zeros_lock:
        z = _symmetric_zeros.get(key)
        if z is None:
            z = np.full(key, SYMMETRIC_ZERO, dtype=np.uint8)
            z.setflags(write=False)
            _symmetric_zeros[key] = z
        return z


def zeros_or_symmetric(zeros, qweight, group_size: int) -> np.ndarray:
    """zeros as given (layout 2: uint8 (N, K/g)), or layout 1's (symmetric_zeros) when None. qweight: u32
    (N, K/8) or its u8 (N, K/2) view."""
    if zeros is not None:
        return zeros
    n, kb = qweight.shape
    k = kb * (8 if qweight.dtype == np.uint32 else 2)
    return symmetric_zeros(n, k // group_size)


_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_blas: ThreadpoolController | None = None


def _worker_pool() -> tuple[ThreadPoolExecutor, int]:
    """The prefill GEMMs' worker threads (one per core numba uses), started on first use."""
    global _pool, _blas
    with _pool_lock:
        if _pool is None:
            _blas = ThreadpoolController()
            _pool = ThreadPoolExecutor(max_workers=numba.config.NUMBA_NUM_THREADS, thread_name_prefix="nanoqwen-cpu")
        return _pool, numba.config.NUMBA_NUM_THREADS


def blas_single_threaded():
    """Context: numpy's BLAS on one thread while our workers each run their own np.dot (its own thread pool would
    oversubscribe the cores; measured at load 9: 76 tile products 41 ms single-threaded, 0.36-2.7 s on 2 BLAS
    threads that spin-wait). OpenBLAS's setting is process-wide: other threads' BLAS calls share it meanwhile."""
    _worker_pool()
    return _blas.limit(limits=1, user_api="blas")


# Fast-math flags of the f16/bf16 kernels: reassociation (vector sums) and FMA contraction, but NOT "no NaNs / no
# infinities": a NaN or inf weight must reach the output as it would in the float64 reference.
_FLOAT_FLAGS = {"reassoc", "contract", "nsz", "arcp"}


@intrinsic
def _u32_as_f32(typingctx, u):
    """Reinterpret the bits of a uint32 as a float32 (LLVM bitcast)."""
    sig = types.float32(types.uint32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return sig, codegen


@intrinsic
def _f16_bits_as_f32(typingctx, h):
    """float32 of the f16 whose bits are the uint16 h: LLVM `fpext half → float` (numba has no float16 type), which
    x86 runs as vcvtph2ps, 16 at a time: exact for every pattern (subnormals, infinities, NaN)."""
    sig = types.float32(types.uint16)

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())
    return sig, codegen


@njit(cache=True, inline="always")
def _widen_f16(h):
    """Exact float32 of f16 bits h (uint16)."""
    return _f16_bits_as_f32(np.uint16(h))


@njit(cache=True, inline="always")
def _widen_bf16(h):
    return _u32_as_f32(np.uint32(h) << np.uint32(16))


@njit(cache=True)
def widen_f16_bits(bits, out):
    """out[i] = float32 of f16 bits[i] (tests check `_widen_f16` on all 65536 patterns through this)."""
    for i in range(bits.shape[0]):
        out[i] = _widen_f16(bits[i])


# ------------------------------------------------------------------------------------------ row-block work list
@njit(cache=True, inline="always")
def row_block_list(mats, block):
    """The work list of all the row blocks of several weights (a tuple of 2-D arrays, rows first), `block` rows
    each: first[m] is the index of matrix m's first block, first[-1] the number of blocks (int64 (M + 1,))."""
    M = len(mats)
    first = np.zeros(M + 1, dtype=np.int64)
    for m in range(M):
        first[m + 1] = first[m] + (mats[m].shape[0] + block - 1) // block
    return first


@njit(cache=True, inline="always")
def row_block(first, mats, block, b):
    """Block b of the work list `first` (row_block_list): (matrix m, its rows [n0, n1))."""
    m = 0
    while b >= first[m + 1]:
        m += 1
    n0 = (b - first[m]) * block
    return m, n0, min(mats[m].shape[0], n0 + block)


# ------------------------------------------------------------------------------------------------------ int4
@njit(cache=True, fastmath=True)
def _permute_x(x, group_size, xp, xs):
    """xp[i, j] = x[8j + PERM[i]] * 2^-4i (f32 (8, K/8)); xs[g] = sum of x over group g (f32 (K/g,))."""
    K = x.shape[0]
    for j in range(K // 8):
        b = 8 * j
        xp[0, j] = x[b]
        xp[1, j] = x[b + 2] * np.float32(2.0 ** -4)
        xp[2, j] = x[b + 4] * np.float32(2.0 ** -8)
        xp[3, j] = x[b + 6] * np.float32(2.0 ** -12)
        xp[4, j] = x[b + 1] * np.float32(2.0 ** -16)
        xp[5, j] = x[b + 3] * np.float32(2.0 ** -20)
        xp[6, j] = x[b + 5] * np.float32(2.0 ** -24)
        xp[7, j] = x[b + 7] * np.float32(2.0 ** -28)
    for gi in range(K // group_size):
        s = np.float32(0.0)
        for k in range(gi * group_size, (gi + 1) * group_size):
            s += x[k]
        xs[gi] = s


@njit(cache=True, fastmath=True)
def _gemv_int4_rows(xp, xs, qweight, scale_bits, zeros, group_size, out, n0, n1):
    """out[n] for rows [n0, n1) of an int4g weight (zeros: its zero points); xp, xs from _permute_x."""
    KW = qweight.shape[1]
    wpg = group_size // 8
    n_groups = KW // wpg
    part = np.empty(KW, dtype=np.float32)            # (K/8,) per-word partial sums of one row
    for n in range(n0, n1):
        # float(w & (0xF << 4i)) = u_i * 2^4i exactly (4 significant bits); xp[i] carries the 2^-4i
        for j in range(KW):
            w = qweight[n, j]
            part[j] = (np.float32(w & np.uint32(0xF)) * xp[0, j]
                       + np.float32(w & np.uint32(0xF0)) * xp[1, j]
                       + np.float32(w & np.uint32(0xF00)) * xp[2, j]
                       + np.float32(w & np.uint32(0xF000)) * xp[3, j]
                       + np.float32(w & np.uint32(0xF0000)) * xp[4, j]
                       + np.float32(w & np.uint32(0xF00000)) * xp[5, j]
                       + np.float32(w & np.uint32(0xF000000)) * xp[6, j]
                       + np.float32(w & np.uint32(0xF0000000)) * xp[7, j])
        acc = np.float32(0.0)
        for gi in range(n_groups):
            a = np.float32(0.0)
            for j in range(gi * wpg, (gi + 1) * wpg):
                a += part[j]
            acc += _widen_f16(scale_bits[n, gi]) * (a - np.float32(zeros[n, gi]) * xs[gi])
        out[n] = acc


@njit(cache=True, fastmath=True)
def _gemv_int4_serial(x, qweight, scale_bits, zeros, group_size, out):
    K = x.shape[0]
    xp = np.empty((8, K // 8), dtype=np.float32)
    xs = np.empty(K // group_size, dtype=np.float32)
    _permute_x(x, group_size, xp, xs)
    _gemv_int4_rows(xp, xs, qweight, scale_bits, zeros, group_size, out, 0, qweight.shape[0])


@njit(parallel=True, cache=True, fastmath=True)
def _gemv_int4_parallel(x, qweight, scale_bits, zeros, group_size, out):
    K = x.shape[0]
    N = qweight.shape[0]
    xp = np.empty((8, K // 8), dtype=np.float32)
    xs = np.empty(K // group_size, dtype=np.float32)
    _permute_x(x, group_size, xp, xs)
    for b in prange((N + _ROW_BLOCK - 1) // _ROW_BLOCK):
        _gemv_int4_rows(xp, xs, qweight, scale_bits, zeros, group_size, out, b * _ROW_BLOCK,
                        min(N, (b + 1) * _ROW_BLOCK))


@njit(parallel=True, cache=True, fastmath=True)
def _gemv_int4_multi_parallel(x, qweights, scales, zeros, group_size, outs):
    """outs[m] = W_m @ x for several int4g weights of the same K and group (one tuple entry each), in ONE parallel
    region: the row blocks of all of them are one work list, so q/k/v (or gate/up) cost one thread hand-off."""
    K = x.shape[0]
    xp = np.empty((8, K // 8), dtype=np.float32)
    xs = np.empty(K // group_size, dtype=np.float32)
    _permute_x(x, group_size, xp, xs)
    first = row_block_list(qweights, _ROW_BLOCK)
    for b in prange(first[-1]):
        m, n0, n1 = row_block(first, qweights, _ROW_BLOCK, b)
        _gemv_int4_rows(xp, xs, qweights[m], scales[m], zeros[m], group_size, outs[m], n0, n1)


def gemv_int4_multi(x, qweights, scales, group_size, outs, zeros=None):
    """outs[m] = W_m @ x for a tuple of int4g weights sharing K and group_size (scales: their u16 f16-bit scales,
    outs: f32 (N_m,) each, zeros: their uint8 (N_m, K/g) zero points, None = all layout 1): one parallel region for
    all when they are large together, else one serial GEMV each."""
    zeros = tuple(zeros_or_symmetric(z, q, group_size) for q, z in zip(qweights, zeros or (None,) * len(qweights)))
    if sum(q.shape[0] for q in qweights) * qweights[0].shape[1] * 8 >= PARALLEL_MIN_WEIGHTS:
        _gemv_int4_multi_parallel(x, tuple(qweights), tuple(scales), zeros, group_size, tuple(outs))
    else:
        for qw, sc, z, o in zip(qweights, scales, zeros, outs):
            _gemv_int4_serial(x, qw, sc, z, group_size, o)


def gemv_int4(x, qweight, scale_bits, group_size, out, zeros=None):
    """out = W @ x. x: f32 (K,) contiguous; qweight: u32 (N, K/8); scale_bits: u16 (N, K/g) f16 bits; out: f32 (N,),
    every element written; zeros: uint8 (N, K/g) zero points (layout 2), None = layout 1's 8. Split over threads
    for large weights."""
    zeros = zeros_or_symmetric(zeros, qweight, group_size)
    if qweight.shape[0] * qweight.shape[1] * 8 >= PARALLEL_MIN_WEIGHTS:
        _gemv_int4_parallel(x, qweight, scale_bits, zeros, group_size, out)
    else:
        _gemv_int4_serial(x, qweight, scale_bits, zeros, group_size, out)


@njit(cache=True, fastmath=True, nogil=True)
def _dequant_int4_rows(qweight, scale_bits, zeros, group_size, n0, n1, w):
    """w[r, i*K/8 + j] = dequantized weight at k = 8j + PERM[i] of row n0 + r (f32 (n1 - n0, K)): the nibble-plane
    order of the packed words, so every store is contiguous; the input columns are permuted to match
    (`_plane_order`). Each value is the spec's f32(s) * f32(u - z) (u - z is exact in float32)."""
    KW = qweight.shape[1]
    wpg = group_size // 8
    sw = np.empty(KW, dtype=np.float32)              # (K/8,) the scale of each word's group
    zw = np.empty(KW, dtype=np.float32)              # (K/8,) the zero point of each word's group
    for r in range(n1 - n0):
        n = n0 + r
        for j in range(KW):
            sw[j] = _widen_f16(scale_bits[n, j // wpg])
            zw[j] = np.float32(zeros[n, j // wpg])
        for i in range(8):
            sh = np.uint32(4 * i)
            for j in range(KW):
                w[r, i * KW + j] = sw[j] * (np.float32((qweight[n, j] >> sh) & np.uint32(0xF)) - zw[j])


def _plane_order(K: int) -> np.ndarray:
    """Column k' = i*K/8 + j of a dequantized tile holds input column 8j + PERM[i]."""
    return (8 * np.arange(K // 8)[None, :] + PERM[:, None]).reshape(-1)


def _tile_rows(K: int) -> int:
    return max(16, (_TILE_ELEMENTS // K) // 16 * 16)


def _tiled_gemm(x_t, mats, outs):
    """outs[m] (T, N_m) = x @ W_m.T for several weights sharing the input, mats[m] = (N_m, fill_tile_m), where
    fill_tile_m(n0, n1, w) writes rows [n0, n1) of W_m (f32, in x_t's row order) into w[:n1 - n0]. x_t: f32 (K, T)
    contiguous. The tiles of all the weights are one work list that the calling thread and the backend's workers
    take from in turn (whoever gets the cores does the work: on a shared machine a descheduled thread does not hold
    the others up); each dequantizes a tile into its own buffer and multiplies it by single-threaded BLAS (np.dot
    releases the GIL, the numba tile fillers are nogil) and writes the transpose of its (rows, T) product into the
    output's columns (in the worker: a transposed copy of a whole (N, T) product on the calling thread took 2.5 ms
    per 4864-row weight at 128 tokens). Each tile is the same BLAS call whichever thread takes it, so the result
    does not depend on the threads (bitwise). It does depend on the tile shape (OpenBLAS picks kernels by matrix
    size, and the x @ W.T form of the same product differs too): both are fixed."""
    K, T = x_t.shape
    rows = _tile_rows(K)
    work = [(m, n0, min(N, n0 + rows)) for m, (N, _) in enumerate(mats) for n0 in range(0, N, rows)]
    take = itertools.count()                                           # next(): atomic under the GIL

    def worker():
        w = np.empty((rows, K), dtype=np.float32)
        while (i := next(take)) < len(work):
            m, n0, n1 = work[i]
            mats[m][1](n0, n1, w)
            outs[m][:, n0:n1] = np.dot(w[:n1 - n0], x_t).T

    pool, n_workers = _worker_pool()
    with blas_single_threaded():
        futs = [pool.submit(worker) for _ in range(min(n_workers, len(work)) - 1)]
        try:
            worker()
        finally:
            for fut in futs:
                fut.result()


def gemm_int4_multi(x, qweights, scales, group_size, outs, zeros=None):
    """outs[m] = x @ W_m.T for T tokens and several int4g weights sharing K and group_size (q/k/v, gate/up). x: f32
    (T, K) contiguous; outs: f32 (T, N_m); zeros: their uint8 (N_m, K/g) zero points, None = all layout 1. Tiles of
    rows are dequantized to f32 once and multiplied with all T tokens by BLAS, the tiles of all the weights in one
    work list (`_tiled_gemm`)."""
    K = qweights[0].shape[1] * 8
    x_t = np.ascontiguousarray(x[:, _plane_order(K)].T)       # (K, T), rows in the tiles' column order
    zeros = [zeros_or_symmetric(z, q, group_size) for q, z in zip(qweights, zeros or (None,) * len(qweights))]

    def filler(qweight, scale_bits, z):
        return lambda n0, n1, w: _dequant_int4_rows(qweight, scale_bits, z, group_size, n0, n1, w)
    _tiled_gemm(x_t, [(q.shape[0], filler(q, s, z)) for q, s, z in zip(qweights, scales, zeros)], outs)


def gemm_int4(x, qweight, scale_bits, group_size, out, zeros=None):
    """out = x @ W.T for T tokens. x: f32 (T, K) contiguous; out: f32 (T, N) (gemm_int4_multi of one weight)."""
    gemm_int4_multi(x, (qweight,), (scale_bits,), group_size, (out,), None if zeros is None else (zeros,))


def matmul_int4(x, qweight, scale_bits, group_size, out, zeros=None):
    """out = x @ W.T. x: f32 (T, K) C-contiguous; qweight: u32 (N, K/8); scale_bits: u16 (N, K/g) f16 bits;
    out: f32 (T, N), every element written; zeros: uint8 (N, K/g) zero points (layout 2), None = layout 1's 8.
    GEMV for one token, tiled BLAS GEMM for more."""
    if x.shape[0] == 1:
        gemv_int4(x[0], qweight, scale_bits, group_size, out[0], zeros)
    else:
        gemm_int4(x, qweight, scale_bits, group_size, out, zeros)


# ------------------------------------------------------------------------------------------------ f16 / bf16
@njit(cache=True, fastmath=_FLOAT_FLAGS)
def _gemv_u16_rows(x, w_bits, is_bf16, out, n0, n1):
    K = x.shape[0]
    for n in range(n0, n1):
        acc = np.float32(0.0)
        if is_bf16:
            for k in range(K):
                acc += _widen_bf16(w_bits[n, k]) * x[k]
        else:
            for k in range(K):
                acc += _widen_f16(w_bits[n, k]) * x[k]
        out[n] = acc


@njit(cache=True, fastmath=_FLOAT_FLAGS)
def _gemv_u16_serial(x, w_bits, is_bf16, out):
    _gemv_u16_rows(x, w_bits, is_bf16, out, 0, w_bits.shape[0])


@njit(parallel=True, cache=True, fastmath=_FLOAT_FLAGS)
def _gemv_u16_parallel(x, w_bits, is_bf16, out):
    N = w_bits.shape[0]
    for b in prange((N + _ROW_BLOCK - 1) // _ROW_BLOCK):
        _gemv_u16_rows(x, w_bits, is_bf16, out, b * _ROW_BLOCK, min(N, (b + 1) * _ROW_BLOCK))


def gemv_u16(x, w_bits, is_bf16, out):
    """out = W @ x. x: f32 (K,); w_bits: u16 (N, K) f16 (is_bf16 False) or bf16 bits; out: f32 (N,)."""
    if w_bits.shape[0] * w_bits.shape[1] >= PARALLEL_MIN_WEIGHTS:
        _gemv_u16_parallel(x, w_bits, is_bf16, out)
    else:
        _gemv_u16_serial(x, w_bits, is_bf16, out)


@njit(cache=True, fastmath=_FLOAT_FLAGS, nogil=True)
def _widen_u16_rows(w_bits, is_bf16, n0, n1, w):
    K = w_bits.shape[1]
    for r in range(n1 - n0):
        if is_bf16:
            for k in range(K):
                w[r, k] = _widen_bf16(w_bits[n0 + r, k])
        else:
            for k in range(K):
                w[r, k] = _widen_f16(w_bits[n0 + r, k])


def gemm_u16(x, w_bits, is_bf16, out):
    """out = x @ W.T for T tokens (tiles widened to f32, multiplied by BLAS; see gemm_int4)."""
    _tiled_gemm(np.ascontiguousarray(x.T), [(w_bits.shape[0], lambda n0, n1, w: _widen_u16_rows(w_bits, is_bf16, n0,
                                                                                           n1, w))], (out,))


def matmul_u16(x, w_bits, is_bf16, out):
    """out = x @ W.T. x: f32 (T, K); w_bits: u16 (N, K) f16 or bf16 bits (is_bf16); out: f32 (T, N)."""
    if x.shape[0] == 1:
        gemv_u16(x[0], w_bits, is_bf16, out[0])
    else:
        gemm_u16(x, w_bits, is_bf16, out)


@njit(cache=True)
def rows_u16(w_bits, ids, lut, out):
    """Embedding gather: out[t, :] = lut[w_bits[ids[t], :]]. w_bits u16 (V, H); ids int32 (T,); out f32 (T, H)."""
    for t in range(ids.shape[0]):
        r = ids[t]
        for k in range(w_bits.shape[1]):
            out[t, k] = lut[w_bits[r, k]]


def warmup_kernels(kinds) -> None:
    """Compile / load from numba's cache every kernel variant the given weight kinds ("INT4G", "F16", "BF16")
    dispatch to (serial and parallel GEMV, the GEMM tiles) and the per-layer ops, on tiny inputs, so the first real
    call pays no JIT."""
    x1 = np.ones(128, dtype=np.float32)
    x2 = np.ones((2, 128), dtype=np.float32)
    o1 = np.empty(16, dtype=np.float32)
    o2 = np.empty((2, 16), dtype=np.float32)
    if "INT4G" in kinds:
        qw = np.zeros((16, 16), dtype=np.uint32)
        sc = np.zeros((16, 1), dtype=np.uint16)
        z = symmetric_zeros(16, 1)                     # read-only, as the file's zero points and this one are
        _gemv_int4_serial(x1, qw, sc, z, 128, o1)
        _gemv_int4_parallel(x1, qw, sc, z, 128, o1)
        for m in (2, 3):
            _gemv_int4_multi_parallel(x1, (qw,) * m, (sc,) * m, (z,) * m, 128, (o1,) * m)
        gemm_int4(x2, qw, sc, 128, o2)
    for kind in ("F16", "BF16"):
        if kind in kinds:
            wb = np.zeros((16, 128), dtype=np.uint16)
            _gemv_u16_serial(x1, wb, kind == "BF16", o1)
            _gemv_u16_parallel(x1, wb, kind == "BF16", o1)
            gemm_u16(x2, wb, kind == "BF16", o2)
    rms_norm(x2, x1, 1e-6, x2)
    kv = np.ones((1, 2, 64), dtype=np.float32)
    attention(np.ones((1, 2, 64), dtype=np.float32), kv, kv, 1, np.empty((1, 128), dtype=np.float32))


# -- slow, obvious references (tests) ---------------------------------------------------------------------
def matmul_int4_reference(x: np.ndarray, qweight: np.ndarray, scales_f16: np.ndarray, group_size: int,
                          zeros: np.ndarray | None = None) -> np.ndarray:
    """Unpack every nibble with the layout-1 rule, dequantize in float64 (u - 8, or u - zeros per group for layout
    2), multiply in float64."""
    N, KW = qweight.shape
    K = KW * 8
    u = np.empty((N, K), dtype=np.int64)
    for i in range(8):
        u[:, PERM[i]::8] = (qweight.astype(np.int64) >> (4 * i)) & 0xF
    s = np.repeat(scales_f16.astype(np.float64), group_size, axis=1)     # (N, K)
    z = 8 if zeros is None else np.repeat(zeros.astype(np.int64), group_size, axis=1)
    w = s * (u - z)
    return (x.astype(np.float64) @ w.T)


def matmul_u16_reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """w: float16 array, or uint16 bf16 bits; widened with numpy (not the LUT), float64 product."""
    if w.dtype == np.uint16:
        wf = (w.astype(np.uint32) << 16).view(np.float32)
    else:
        wf = w.astype(np.float32)
    return x.astype(np.float64) @ wf.astype(np.float64).T


# ------------------------------------------------------------------------------------- small per-layer ops
# (Fast-math flags without "no infinities": the softmax starts from -inf and exp(-x) may overflow to inf.)
# One compiled call each instead of a chain of numpy temporaries: at batch 1 a layer's norms, SwiGLU and attention
# are a few thousand flops, and the numpy call overhead of the unfused versions cost more than the arithmetic.
@njit(cache=True, fastmath=_FLOAT_FLAGS)
def rms_norm(x, w, eps, out):
    """out[t] = x[t] * rsqrt(mean(x[t]^2) + eps) * w (HF Qwen2RMSNorm, float32). x, out: f32 (T, H); w: f32 (H,)."""
    T, H = x.shape
    for t in range(T):
        ss = np.float32(0.0)
        for k in range(H):
            ss += x[t, k] * x[t, k]
        r = np.float32(1.0) / np.sqrt(ss / np.float32(H) + np.float32(eps))
        for k in range(H):
            out[t, k] = (x[t, k] * r) * w[k]


def silu_mul(gate, up, out):
    """out = silu(gate) * up = gate / (1 + exp(-gate)) * up, elementwise, f32 (T, I); out may be gate. numpy's
    SIMD exp (a numba loop calls the scalar libm expf: 3.9 vs 1.4 ms at (128, 4864), best of 20). exp(-gate) overflows to
    inf for gate < -88, which gives the exact limit 0: the warning is silenced."""
    t = np.negative(gate)
    with np.errstate(over="ignore"):
        np.exp(t, out=t)
    t += np.float32(1.0)
    np.divide(gate, t, out=out)
    out *= up


@njit(cache=True, fastmath=_FLOAT_FLAGS)
def attention(q, k_cache, v_cache, p0, out):
    """Causal grouped-query attention of T queries at positions p0..p0+T-1 over cached keys/values 0..p0+T-1.

    q: f32 (T, H, hd), already rotated; k_cache, v_cache: f32 (G, >= p0+T, hd) (one layer); out: f32 (T, H*hd).
    Query head h reads kv head h // (H/G). Scores scaled by hd^-0.5, softmax in float32 with the max subtracted."""
    T, H, hd = q.shape
    G = k_cache.shape[0]
    r = H // G
    scale = np.float32(1.0) / np.sqrt(np.float32(hd))
    s = np.empty(p0 + T, dtype=np.float32)
    acc = np.empty(hd, dtype=np.float32)
    for t in range(T):
        L = p0 + t + 1                                  # keys 0..p0+t are visible to query t
        for h in range(H):
            g = h // r
            m = np.float32(-np.inf)
            for l in range(L):
                d = np.float32(0.0)
                for i in range(hd):
                    d += q[t, h, i] * k_cache[g, l, i]
                d *= scale
                s[l] = d
                m = max(m, d)
            tot = np.float32(0.0)
            for l in range(L):
                e = np.exp(s[l] - m)
                s[l] = e
                tot += e
            for i in range(hd):
                acc[i] = np.float32(0.0)
            for l in range(L):
                p = s[l]
                for i in range(hd):
                    acc[i] += p * v_cache[g, l, i]
            inv = np.float32(1.0) / tot
            for i in range(hd):
                out[t, h * hd + i] = acc[i] * inv


def attention_prefill(q, k_cache, v_cache, p0, out):
    """`attention` for many queries at once (a prompt): per kv head, the scores of all its query heads and tokens
    are one batched BLAS product (r, T, hd) @ (hd, L), the causal mask and the softmax are whole-array numpy ops,
    and the weighted sum of values is another batched product. Same arguments and result as `attention`."""
    T, H, hd = q.shape
    G = k_cache.shape[0]
    r = H // G
    L = p0 + T
    scale = np.float32(1.0 / np.sqrt(hd))
    masked = np.arange(L)[None, :] > (p0 + np.arange(T))[:, None]            # (T, L) True = key after the query
    o = out.reshape(T, H, hd)
    for g in range(G):
        qg = q[:, g * r:(g + 1) * r, :].transpose(1, 0, 2)                  # (r, T, hd)
        s = np.matmul(qg, k_cache[g, :L].T)                                  # (r, T, L)
        s *= scale
        s[:, masked] = -np.inf
        s -= s.max(axis=-1, keepdims=True)
        np.exp(s, out=s)
        s /= s.sum(axis=-1, keepdims=True)
        o[:, g * r:(g + 1) * r, :] = np.matmul(s, v_cache[g, :L]).transpose(1, 0, 2)


# -- slow, obvious references of the small ops (tests) ----------------------------------------------------
def rms_norm_reference(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """HF Qwen2RMSNorm in float64."""
    x = x.astype(np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w.astype(np.float64)


def silu_mul_reference(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    g = gate.astype(np.float64)
    return g / (1.0 + np.exp(-g)) * up.astype(np.float64)


def attention_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, p0: int) -> np.ndarray:
    """Dense masked softmax attention in float64. q (T, H, hd); k, v (G, >= p0+T, hd) → (T, H*hd)."""
    T, H, hd = q.shape
    G = k.shape[0]
    L = p0 + T
    kk = np.repeat(k[:, :L].astype(np.float64), H // G, axis=0)          # (H, L, hd)
    vv = np.repeat(v[:, :L].astype(np.float64), H // G, axis=0)
    s = np.einsum("thd,hld->htl", q.astype(np.float64), kk) / np.sqrt(hd)
    s[:, np.arange(L)[None, :] > (p0 + np.arange(T))[:, None]] = -np.inf
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("htl,hld->thd", p, vv).reshape(T, H * hd)
