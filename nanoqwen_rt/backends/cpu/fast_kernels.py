"""numba kernels of the CPU backend's fast numerics (numerics="fast"): integer dot products over int16 activations.

The oracle kernels (kernels.py) keep every activation in float32. These round the input of each one-token product
to int16 once per weight group (step = absmax of the group / 32767, round to nearest), so that the dot product of a
group is an exact int32 sum of integer products and only one float multiply per group remains, the shape of
llama.cpp's Q4_0 x Q8_0 dot (with 16-bit instead of 8-bit activations: 256x finer steps for the same vpmaddwd).
  * int4g weights (layout 1, the file's bytes as they are): byte m of a row holds two codes, low nibble at
    k = 8(m//4) + LO[m%4], high nibble at k = 8(m//4) + HI[m%4]; the activation is quantized straight into those two
    orders (xlo, xhi: int16 (K/2,)), so a group's sum is sum_m (b_m & 15) * xlo[m] + (b_m >> 4) * xhi[m], and the
    code offset comes out as 8 * sum(q) per group: sum (u - 8) q = sum u q - 8 sum q, all exact in int32
    (|sum| <= 15 * 32767 * 256 < 2^31).
  * the lm_head (f16 / bf16 / f32 in the file) is rounded once, when the backend loads, to int8 per row and group
    (`quantize_rows_i8`, step = absmax / 127) and multiplied as int8 x int16 (`gemv_i8`).
The per-chunk dots are LLVM vector IR (`_dot_intrinsic`): loads of 16-128 bytes, widen to i32, multiply, add,
`llvm.vector.reduce.add`; LLVM lowers that to pmaddwd (vpdpwssd with AVX-512 VNNI) on x86 and to the target's own
multiply-add elsewhere; numba's scalar integer arithmetic (which widens to int64) vectorised at half this speed.

What the rounding costs is bounded per call (tests/test_cpu_fast.py): each activation moves by at most half a step,
so |y_fast - y_exact| <= sum over groups of (step_g / 2) * sum_k |w_k| for int4 weights, plus the int8 weight
rounding of the lm_head (half a weight step per weight).
Threads as in kernels.py: row blocks split by ``prange`` on numba's OpenMP pool (PASSIVE waits, set there) when the
weights are many (PARALLEL_MIN_WEIGHTS); several weights sharing one input run as one parallel region.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import errors, njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from .kernels import PARALLEL_MIN_WEIGHTS, _widen_bf16, _widen_f16

__all__ = ["LO", "HI", "Q16_MAX", "Q8_MAX", "quantize_x16_int4", "quantize_x16", "gemv_int4_q16_multi",
           "quantize_rows_i8", "lm_head_group", "gemv_i8", "LM_HEAD_GROUPS"]

#: byte m of a layout-1 int4 row: low nibble at k = 8(m//4) + LO[m%4], high nibble at 8(m//4) + HI[m%4]
#: (nibble i of word j sits at k = 8j + PERM[i], PERM = 0,2,4,6,1,3,5,7; byte b of the word holds nibbles 2b, 2b+1)
LO = np.array([0, 4, 1, 5], dtype=np.int64)
HI = np.array([2, 6, 3, 7], dtype=np.int64)

#: largest int16 code of an activation: step = absmax / Q16_MAX, so the largest |x| of a group maps to +-32767
Q16_MAX = 32767
#: largest int8 code of an lm_head weight (symmetric: -127..127)
Q8_MAX = 127
#: lm_head rounding group (weights per int8 scale), the first of these that divides hidden_size: 128 like the
#: file's default int4 group (one f32 scale per 128 int8 weights: +3 % bytes); a model whose hidden_size none of
#: them divides keeps its stored lm_head (the oracle kernel)
LM_HEAD_GROUPS = (128, 64, 32)

_ROW_BLOCK = 64   # rows per parallel work item (as kernels._ROW_BLOCK)


def _dot_intrinsic(nbytes: int, nibbles: bool):
    """An intrinsic dot(row, xa, xb, off) -> int32 over bytes [off, off + nbytes) of the uint8/int8 array `row`:
    nibbles=True: sum (row[m] & 15) * xa[m] + (row[m] >> 4) * xb[m] (row uint8, xa/xb int16, indexed alike);
    nibbles=False: sum row[m] * xa[m] (row int8, xa int16; xb unused). Exact in int32 for the ranges used here."""
    @intrinsic
    def dot(typingctx, row, xa, xb, off):
        if not all(isinstance(a, types.Array) and a.ndim == 1 and a.layout == "C" for a in (row, xa, xb)):
            raise errors.TypingError("dot: row, xa, xb must be contiguous 1-D arrays (vector loads)")
        sig = types.int32(row, xa, xb, types.intp)

        def codegen(context, builder, signature, args):
            i8, i16, i32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
            v8, v16, v32 = (ir.VectorType(t, nbytes) for t in (i8, i16, i32))

            def load(aty, a, vty):
                data = context.make_array(aty)(context, builder, a).data
                return builder.load(builder.bitcast(builder.gep(data, [args[3]]), vty.as_pointer()), align=1)

            w = load(signature.args[0], args[0], v8)
            xa = builder.sext(load(signature.args[1], args[1], v16), v32)
            if nibbles:
                lo = builder.zext(builder.and_(w, ir.Constant(v8, [15] * nbytes)), v32)
                hi = builder.zext(builder.lshr(w, ir.Constant(v8, [4] * nbytes)), v32)
                xb = builder.sext(load(signature.args[2], args[2], v16), v32)
                p = builder.add(builder.mul(lo, xa), builder.mul(hi, xb))
            else:
                p = builder.mul(builder.sext(w, v32), xa)
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i32, [v32]),
                                                f"llvm.vector.reduce.add.v{nbytes}i32")
            return builder.call(fn, [p])
        return sig, codegen
    return dot


_dot_u4_16 = _dot_intrinsic(16, True)
_dot_u4_32 = _dot_intrinsic(32, True)
_dot_u4_64 = _dot_intrinsic(64, True)
_dot_i8_32 = _dot_intrinsic(32, False)
_dot_i8_64 = _dot_intrinsic(64, False)
_dot_i8_128 = _dot_intrinsic(128, False)


@njit(cache=True, inline="always")
def _round_group(x, k0, k1):
    """(step, 1/step) of x[k0:k1]: step = absmax / Q16_MAX (0 and 0 for an all-zero group; NaN for a non-finite
    one, which then poisons every output that reads the group)."""
    a = np.float32(0.0)
    finite = True
    for k in range(k0, k1):
        a = max(a, abs(x[k]))                     # (max drops a NaN: checked apart)
        finite &= np.isfinite(x[k])
    if not finite:
        return np.float32(np.nan), np.float32(0.0)
    if a == 0:
        return np.float32(0.0), np.float32(0.0)
    return a / np.float32(Q16_MAX), np.float32(Q16_MAX) / a


@njit(cache=True)
def quantize_x16_int4(x, group_size, xlo, xhi, xsum, xstep):
    """Round x (f32 (K,)) to int16 per group of group_size for `gemv_int4_q16*`: xlo[m] / xhi[m] (int16 (K/2,)) are
    the codes of k = 8(m//4) + LO[m%4] / HI[m%4]; xsum[g] (int32) the sum of group g's codes; xstep[g] (f32) its
    step (x ~ code * step)."""
    K = x.shape[0]
    for g in range(K // group_size):
        k0 = g * group_size
        step, inv = _round_group(x, k0, k0 + group_size)
        xstep[g] = step
        s = 0
        for m in range(k0 // 2, (k0 + group_size) // 2):
            b = 8 * (m // 4)
            r = m % 4
            ql = np.int16(np.rint(x[b + LO[r]] * inv))
            qh = np.int16(np.rint(x[b + HI[r]] * inv))
            xlo[m] = ql
            xhi[m] = qh
            s += np.int32(ql) + np.int32(qh)
        xsum[g] = s


@njit(cache=True)
def quantize_x16(x, group_size, xq, xstep):
    """Round x (f32 (K,)) to int16 xq (K,) per group of group_size; xstep[g] = the step of group g (for `gemv_i8`)."""
    K = x.shape[0]
    for g in range(K // group_size):
        k0 = g * group_size
        step, inv = _round_group(x, k0, k0 + group_size)
        xstep[g] = step
        for k in range(k0, k0 + group_size):
            xq[k] = np.int16(np.rint(x[k] * inv))


@njit(cache=True, inline="always")
def _int4_rows(qb, scale_bits, group_size, xlo, xhi, xsum, xstep, out, n0, n1):
    """out[n] for rows [n0, n1) of a layout-1 int4 weight seen as bytes qb (uint8 (N, K/2))."""
    gb = group_size // 2                       # bytes per group: 16, 32, 64 or 128
    G = qb.shape[1] // gb
    for n in range(n0, n1):
        row = qb[n]
        acc = np.float32(0.0)
        for g in range(G):
            m0 = g * gb
            if gb == 16:
                s = _dot_u4_16(row, xlo, xhi, m0)
            elif gb == 32:
                s = _dot_u4_32(row, xlo, xhi, m0)
            else:
                s = np.int32(0)
                for m in range(m0, m0 + gb, 64):
                    s += _dot_u4_64(row, xlo, xhi, m)
            acc += (_widen_f16(scale_bits[n, g]) * xstep[g]) * np.float32(s - np.int32(8) * xsum[g])
        out[n] = acc


@njit(cache=True)
def _gemv_int4_q16_serial(xlo, xhi, xsum, xstep, qbs, scales, group_size, outs):
    for m in range(len(qbs)):
        _int4_rows(qbs[m], scales[m], group_size, xlo, xhi, xsum, xstep, outs[m], 0, qbs[m].shape[0])


@njit(parallel=True, cache=True)
def _gemv_int4_q16_parallel(xlo, xhi, xsum, xstep, qbs, scales, group_size, outs):
    """All row blocks of all the weights (one input) as one work list: one parallel region."""
    M = len(qbs)
    first = np.zeros(M + 1, dtype=np.int64)
    for m in range(M):
        first[m + 1] = first[m] + (qbs[m].shape[0] + _ROW_BLOCK - 1) // _ROW_BLOCK
    for b in prange(first[M]):
        m = 0
        while b >= first[m + 1]:
            m += 1
        n0 = (b - first[m]) * _ROW_BLOCK
        _int4_rows(qbs[m], scales[m], group_size, xlo, xhi, xsum, xstep, outs[m], n0,
                   min(qbs[m].shape[0], n0 + _ROW_BLOCK))


def gemv_int4_q16_multi(x, qbytes, scales, group_size, outs):
    """outs[m] = W_m @ x with x rounded to int16 per group (fast numerics) for int4g weights sharing K and
    group_size. x: f32 (K,); qbytes: uint8 (N_m, K/2) views of the packed words; scales: uint16 (N_m, K/g) f16 bits;
    outs: f32 (N_m,) each, every element written. One parallel region for all when they are large together."""
    K = x.shape[0]
    xlo = np.empty(K // 2, dtype=np.int16)
    xhi = np.empty(K // 2, dtype=np.int16)
    xsum = np.empty(K // group_size, dtype=np.int32)
    xstep = np.empty(K // group_size, dtype=np.float32)
    quantize_x16_int4(x, group_size, xlo, xhi, xsum, xstep)
    args = (xlo, xhi, xsum, xstep, tuple(qbytes), tuple(scales), group_size, tuple(outs))
    if sum(q.shape[0] for q in qbytes) * K >= PARALLEL_MIN_WEIGHTS:
        _gemv_int4_q16_parallel(*args)
    else:
        _gemv_int4_q16_serial(*args)


# ------------------------------------------------------------------------------------------ int8 lm_head
def lm_head_group(K: int) -> int | None:
    """The lm_head's int8 rounding group for hidden size K (LM_HEAD_GROUPS), or None when none divides K."""
    return next((g for g in LM_HEAD_GROUPS if K % g == 0), None)


@njit(cache=True, inline="always")
def _widen_any(w, kind, n, k):
    """float32 of weight (n, k): kind 0 = f16 bits, 1 = bf16 bits, 2 = float32 (w is then f32)."""
    if kind == 0:
        return _widen_f16(w[n, k])
    if kind == 1:
        return _widen_bf16(w[n, k])
    return np.float32(w[n, k])


@njit(cache=True, inline="always")
def _quantize_rows(w, kind, group_size, q, steps, n0, n1):
    G = w.shape[1] // group_size
    for n in range(n0, n1):
        for g in range(G):
            k0 = g * group_size
            a = np.float32(0.0)
            finite = True
            for k in range(k0, k0 + group_size):
                v = _widen_any(w, kind, n, k)
                a = max(a, abs(v))                # (max drops a NaN: checked apart)
                finite &= np.isfinite(v)
            if not finite:
                steps[n, g] = np.float32(np.nan)          # a non-finite weight poisons its row's logit
                for k in range(k0, k0 + group_size):
                    q[n, k] = 0
                continue
            step = a / np.float32(Q8_MAX)
            inv = np.float32(Q8_MAX) / a if a > 0 else np.float32(0.0)
            steps[n, g] = step
            for k in range(k0, k0 + group_size):
                q[n, k] = np.int8(np.rint(_widen_any(w, kind, n, k) * inv))


@njit(parallel=True, cache=True)
def _quantize_rows_parallel(w, kind, group_size, q, steps):
    N = w.shape[0]
    for b in prange((N + 1023) // 1024):
        _quantize_rows(w, kind, group_size, q, steps, b * 1024, min(N, (b + 1) * 1024))


def quantize_rows_i8(w: np.ndarray, kind: int, group_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Round a stored matrix (N, K) to int8 per row and group: (q int8 (N, K), steps f32 (N, K/group_size)),
    w ~ q * step. kind: 0 = w holds f16 bits (uint16), 1 = bf16 bits (uint16), 2 = float32."""
    N, K = w.shape
    q = np.empty((N, K), dtype=np.int8)
    steps = np.empty((N, K // group_size), dtype=np.float32)
    _quantize_rows_parallel(w, kind, group_size, q, steps)
    return q, steps


@njit(cache=True, inline="always")
def _i8_rows(q, steps, group_size, xq, xstep, out, n0, n1):
    G = q.shape[1] // group_size
    for n in range(n0, n1):
        row = q[n]
        acc = np.float32(0.0)
        for g in range(G):
            k0 = g * group_size
            if group_size == 32:
                s = _dot_i8_32(row, xq, xq, k0)
            elif group_size == 64:
                s = _dot_i8_64(row, xq, xq, k0)
            else:
                s = np.int32(0)
                for k in range(k0, k0 + group_size, 128):
                    s += _dot_i8_128(row, xq, xq, k)
            acc += (steps[n, g] * xstep[g]) * np.float32(s)
        out[n] = acc


@njit(parallel=True, cache=True)
def _gemv_i8_parallel(q, steps, group_size, xq, xstep, out):
    N = q.shape[0]
    for b in prange((N + _ROW_BLOCK - 1) // _ROW_BLOCK):
        _i8_rows(q, steps, group_size, xq, xstep, out, b * _ROW_BLOCK, min(N, (b + 1) * _ROW_BLOCK))


@njit(cache=True)
def _gemv_i8_serial(q, steps, group_size, xq, xstep, out):
    _i8_rows(q, steps, group_size, xq, xstep, out, 0, q.shape[0])


def gemv_i8(x, q, steps, group_size, out):
    """out = W @ x for an int8 matrix from `quantize_rows_i8` (q int8 (N, K), steps f32 (N, K/g)), x f32 (K,)
    rounded to int16 per group of the same size; out f32 (N,), every element written."""
    K = x.shape[0]
    xq = np.empty(K, dtype=np.int16)
    xstep = np.empty(K // group_size, dtype=np.float32)
    quantize_x16(x, group_size, xq, xstep)
    if q.shape[0] * K >= PARALLEL_MIN_WEIGHTS:
        _gemv_i8_parallel(q, steps, group_size, xq, xstep, out)
    else:
        _gemv_i8_serial(q, steps, group_size, xq, xstep, out)


def warmup_fast_kernels(int4_groups, lm_head_group_size) -> None:
    """Compile / load from numba's cache the fast kernels a model uses (its int4 group sizes, its lm_head group)."""
    for g in sorted(int4_groups):
        K = max(128, g)
        qb = np.zeros((16, K // 2), dtype=np.uint8)
        sc = np.zeros((16, K // g), dtype=np.uint16)
        o = np.empty(16, dtype=np.float32)
        x = np.ones(K, dtype=np.float32)
        for m in (1, 2, 3):
            gemv_int4_q16_multi(x, (qb,) * m, (sc,) * m, g, (o,) * m)
            xlo = np.zeros(K // 2, np.int16)
            _gemv_int4_q16_parallel(xlo, xlo, np.zeros(K // g, np.int32), np.zeros(K // g, np.float32),
                                    (qb,) * m, (sc,) * m, g, (o,) * m)
    if lm_head_group_size is not None:
        K = max(128, lm_head_group_size)
        for kind, dt in ((0, np.uint16), (1, np.uint16), (2, np.float32)):
            quantize_rows_i8(np.zeros((16, K), dtype=dt), kind, lm_head_group_size)
        q = np.zeros((16, K), dtype=np.int8)
        st = np.zeros((16, K // lm_head_group_size), dtype=np.float32)
        o = np.empty(16, dtype=np.float32)
        gemv_i8(np.ones(K, dtype=np.float32), q, st, lm_head_group_size, o)
        _gemv_i8_parallel(q, st, lm_head_group_size, np.zeros(K, np.int16), np.zeros(K // lm_head_group_size,
                                                                                     np.float32), o)
