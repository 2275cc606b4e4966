"""numba kernels of the CPU backend's fast numerics (numerics="fast"): integer dot products over int16 activations.

The oracle kernels (kernels.py) keep every activation in float32. These round the input of each product (each
token's, in a prompt as in decode) to int16 once per weight group (step = absmax of the group / 32767, round to nearest), so that the dot product of a
group is an exact int32 sum of integer products and only one float multiply per group remains, the shape of
llama.cpp's Q4_0 x Q8_0 dot (with 16-bit instead of 8-bit activations: 256x finer steps for the same vpmaddwd).
  * int4g weights (layouts 1 and 2, the file's bytes as they are): byte m of a row holds two codes, low nibble at
    k = 8(m//4) + LO[m%4], high nibble at k = 8(m//4) + HI[m%4]; the activation is quantized straight into those two
    orders (xlo, xhi: int16 (K/2,)), so a group's sum is sum_m (b_m & 15) * xlo[m] + (b_m >> 4) * xhi[m], and the
    code offset comes out as z * sum(q) per group, z the group's zero point (8 for layout 1, kernels.symmetric_zeros;
    layout 2's stored one): sum (u - z) q = sum u q - z sum q, all exact in int32 (|sum u q|, |z sum q| <=
    15 * 32767 * 256 < 2^27 each, so their difference is < 2^28).
  * the lm_head (f16 / bf16 / f32 in the file) is rounded once, when the backend loads, to int8 per row and group
    (`quantize_rows_i8`, step = absmax / 127) and multiplied as int8 x int16 (`gemv_i8`).
The per-chunk dots are LLVM vector IR (`_dot_intrinsic`): loads of 16-128 bytes, widen to i32, multiply, add,
`llvm.vector.reduce.add`; LLVM lowers that to pmaddwd (vpdpwssd with AVX-512 VNNI) on x86 and to the target's own
multiply-add elsewhere; numba's scalar integer arithmetic (which widens to int64) vectorised at half this speed.
A prompt's int4 products run as a GEMM (`gemm_int4_q16_multi`): each group of a weight row is unpacked once into
(code_lo, code_hi) int16 pairs and multiplied by the same pair of activations of 16 tokens per instruction
(`_pair_dots`: pairs broadcast, activations token-minor, vpdpwssd with AVX-512 VNNI), with the GEMV's rounding and
the GEMV's float order per group, so each token's outputs are bitwise what the GEMV gives for that token alone.

What the rounding costs is bounded per call (tests/test_cpu_fast.py): each activation moves by at most half a step,
so |y_fast - y_exact| <= sum over groups of (step_g / 2) * sum_k |w_k| for int4 weights, plus the int8 weight
rounding of the lm_head (half a weight step per weight).
Threads as in kernels.py: a GEMV's row blocks split by ``prange`` on numba's OpenMP pool (PASSIVE waits, set there)
when the weights are many (PARALLEL_MIN_WEIGHTS); several weights sharing one input run as one parallel region. The
GEMM's row blocks are one work list that the calling thread and the backend's worker threads take from through an
atomic cursor (whoever has a core does the work, as in kernels._tiled_gemm).
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import errors, njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from .kernels import (PARALLEL_MIN_WEIGHTS, _u32_as_f32, _widen_bf16, _widen_f16, _worker_pool, row_block,
                      row_block_list, symmetric_zeros, zeros_or_symmetric)

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


@intrinsic
def _f32_bits(typingctx, v):
    """The bits of a float32 as a uint32 (LLVM bitcast)."""
    sig = types.uint32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return sig, codegen


@njit(cache=True, inline="always")
def _round_group(x, k0, k1):
    """(step, 1/step) of x[k0:k1]: step = absmax / Q16_MAX (0 and 0 for an all-zero group; NaN for a non-finite
    one, which then poisons every output that reads the group). The absmax is taken on the bits (|x| with the sign
    bit cleared orders as its uint32 bits; >= 0x7F800000 is inf or NaN): an integer max, which LLVM vectorises
    (a float max it may not reorder), and the same value."""
    a = np.uint32(0)
    for k in range(k0, k1):
        a = max(a, _f32_bits(x[k]) & np.uint32(0x7FFFFFFF))
    if a >= np.uint32(0x7F800000):
        return np.float32(np.nan), np.float32(0.0)
    if a == 0:
        return np.float32(0.0), np.float32(0.0)
    af = _u32_as_f32(np.uint32(a))
    return af / np.float32(Q16_MAX), np.float32(Q16_MAX) / af


@njit(cache=True)
def quantize_x16_int4(x, group_size, xlo, xhi, xsum, xstep):
    """Round x (f32 (K,)) to int16 per group of group_size for `gemv_int4_q16*`: xlo[m] / xhi[m] (int16 (K/2,)) are
    the codes of k = 8(m//4) + LO[m%4] / HI[m%4]; xsum[g] (int32) the sum of group g's codes; xstep[g] (f32) its
    step (x ~ code * step). Codes are rounded in x's order (a vector loop), then moved into the byte order."""
    K = x.shape[0]
    q = np.empty(group_size, dtype=np.int16)
    for g in range(K // group_size):
        k0 = g * group_size
        step, inv = _round_group(x, k0, k0 + group_size)
        xstep[g] = step
        s = np.int32(0)
        for k in range(group_size):
            v = np.int16(np.rint(x[k0 + k] * inv))
            q[k] = v
            s += np.int32(v)
        xsum[g] = s
        for j in range(group_size // 8):               # word j: LO = 0, 4, 1, 5 and HI = 2, 6, 3, 7, unrolled
            b = 8 * j
            c = k0 // 2 + 4 * j
            xlo[c], xlo[c + 1], xlo[c + 2], xlo[c + 3] = q[b], q[b + 4], q[b + 1], q[b + 5]
            xhi[c], xhi[c + 1], xhi[c + 2], xhi[c + 3] = q[b + 2], q[b + 6], q[b + 3], q[b + 7]


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
def _int4_rows(qb, scale_bits, zeros, group_size, xlo, xhi, xsum, xstep, out, n0, n1):
    """out[n] for rows [n0, n1) of an int4 weight seen as bytes qb (uint8 (N, K/2)), zero points zeros (uint8
    (N, K/g))."""
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
            acc += (_widen_f16(scale_bits[n, g]) * xstep[g]) * np.float32(s - np.int32(zeros[n, g]) * xsum[g])
        out[n] = acc


@njit(cache=True)
def _gemv_int4_q16_serial(xlo, xhi, xsum, xstep, qbs, scales, zeros, group_size, outs):
    for m in range(len(qbs)):
        _int4_rows(qbs[m], scales[m], zeros[m], group_size, xlo, xhi, xsum, xstep, outs[m], 0, qbs[m].shape[0])


@njit(parallel=True, cache=True)
def _gemv_int4_q16_parallel(xlo, xhi, xsum, xstep, qbs, scales, zeros, group_size, outs):
    """All row blocks of all the weights (one input) as one work list: one parallel region."""
    first = row_block_list(qbs, _ROW_BLOCK)
    for b in prange(first[-1]):
        m, n0, n1 = row_block(first, qbs, _ROW_BLOCK, b)
        _int4_rows(qbs[m], scales[m], zeros[m], group_size, xlo, xhi, xsum, xstep, outs[m], n0, n1)


def gemv_int4_q16_multi(x, qbytes, scales, group_size, outs, zeros=None):
    """outs[m] = W_m @ x with x rounded to int16 per group (fast numerics) for int4g weights sharing K and
    group_size. x: f32 (K,); qbytes: uint8 (N_m, K/2) views of the packed words; scales: uint16 (N_m, K/g) f16 bits;
    outs: f32 (N_m,) each, every element written; zeros: uint8 (N_m, K/g) zero points each, None = all layout 1.
    One parallel region for all when they are large together."""
    K = x.shape[0]
    xlo = np.empty(K // 2, dtype=np.int16)
    xhi = np.empty(K // 2, dtype=np.int16)
    xsum = np.empty(K // group_size, dtype=np.int32)
    xstep = np.empty(K // group_size, dtype=np.float32)
    quantize_x16_int4(x, group_size, xlo, xhi, xsum, xstep)
    zeros = tuple(zeros_or_symmetric(z, q, group_size) for q, z in zip(qbytes, zeros or (None,) * len(qbytes)))
    args = (xlo, xhi, xsum, xstep, tuple(qbytes), tuple(scales), zeros, group_size, tuple(outs))
    if sum(q.shape[0] for q in qbytes) * K >= PARALLEL_MIN_WEIGHTS:
        _gemv_int4_q16_parallel(*args)
    else:
        _gemv_int4_q16_serial(*args)


# ------------------------------------------------------------------------------------- int4 GEMM (prompts)
# A prompt's T tokens go through each weight together: a group of R_ROWS rows is unpacked once into (code_lo,
# code_hi) int16 pairs (one int32 per byte, `_unpack_pairs`), and each pair is multiplied by the same byte's pair of
# activations (xlo, xhi) of 16 tokens at once: pairs broadcast to every lane, activations laid out token-minor
# (xp[m, t] = xlo[t, m] | xhi[t, m] << 16), so one vpdpwssd adds byte m's two products to 16 tokens' sums and no
# horizontal reduction is needed (`_pair_dots`). Per (row, group, token) the float part is the GEMV's expression
# in the GEMV's order, so a prompt token's products are bitwise those of the same token through gemv_int4_q16_multi.
R_ROWS = 8                       # rows per pass: R_ROWS x T_BLOCKS accumulators (16 of the 32 zmm registers)
T_BLOCKS = 2                     # blocks of 16 tokens per pass (measured: 8 x 2 and 4 x 4 ~1.6x faster than 4 x 2)
TOKEN_PAD = 16 * T_BLOCKS        # the token axis is padded to a multiple of this (padding tokens are zeros)


def _pair_dots(R: int, B: int):
    """An intrinsic dots(wp, xp, m0, count, t0, acc): for r < R, b < B, lane l < 16,
    acc[(r*B + b)*16 + l] = sum_{j < count} lo(wp[r*count + j]) * lo(xp[m0 + j, t]) + hi(..) * hi(..),
    t = t0 + 16b + l, with lo / hi the int16 halves of an int32; exact in int32 for the ranges used here. wp: int32
    (R*count,), xp: int32 (K/2, Tp) C-contiguous, acc: int32 (R*B*16,), overwritten. The multiply-add is generic
    LLVM IR (sext to i32, mul, add of the even and odd lanes) that x86 lowers to vpdpwssd (vpmaddwd + add without
    VNNI); the accumulators are allocas that LLVM keeps in registers."""
    @intrinsic
    def dots(typingctx, wp, xp, m0, count, t0, acc):
        if not (all(isinstance(a, types.Array) and a.layout == "C" and a.dtype == types.int32 for a in (wp, xp, acc))
                and wp.ndim == 1 and xp.ndim == 2 and acc.ndim == 1):
            raise errors.TypingError("dots: wp, acc int32 1-D and xp int32 2-D, contiguous")
        sig = types.void(wp, xp, types.intp, types.intp, types.intp, acc)

        def codegen(context, builder, signature, args):
            i16, i32 = ir.IntType(16), ir.IntType(32)
            v16, v32x16, v32x32 = ir.VectorType(i32, 16), ir.VectorType(i16, 32), ir.VectorType(i32, 32)
            wpa, xpa, aca = (context.make_array(signature.args[i])(context, builder, args[i]) for i in (0, 1, 5))
            Tp = cgutils.unpack_tuple(builder, xpa.shape, 2)[1]
            m0, count, t0 = args[2], args[3], args[4]
            accs = [cgutils.alloca_once_value(builder, ir.Constant(v16, [0] * 16)) for _ in range(R * B)]
            even = ir.Constant(v16, list(range(0, 32, 2)))
            odd = ir.Constant(v16, list(range(1, 32, 2)))
            lane0 = ir.Constant(v16, [0] * 16)
            with cgutils.for_range(builder, count) as loop:
                j = loop.index
                base = builder.add(builder.mul(builder.add(m0, j), Tp), t0)
                xs = []
                for b in range(B):
                    ptr = builder.gep(xpa.data, [builder.add(base, ir.Constant(base.type, 16 * b))])
                    xv = builder.load(builder.bitcast(ptr, v16.as_pointer()), align=4)
                    xs.append(builder.sext(builder.bitcast(xv, v32x16), v32x32))
                for r in range(R):
                    w = builder.load(builder.gep(wpa.data, [builder.add(builder.mul(ir.Constant(count.type, r), count),
                                                                        j)]))
                    wv = builder.shuffle_vector(builder.insert_element(ir.Constant(v16, None), w, ir.Constant(i32, 0)),
                                                ir.Constant(v16, None), lane0)
                    ws = builder.sext(builder.bitcast(wv, v32x16), v32x32)
                    for b in range(B):
                        p = builder.mul(ws, xs[b])
                        pm = builder.add(builder.shuffle_vector(p, p, even), builder.shuffle_vector(p, p, odd))
                        a = accs[r * B + b]
                        builder.store(builder.add(builder.load(a), pm), a)
            for i, a in enumerate(accs):
                ptr = builder.gep(aca.data, [ir.Constant(ir.IntType(64), 16 * i)])
                builder.store(builder.load(a), builder.bitcast(ptr, v16.as_pointer()), align=4)
            return context.get_dummy_value()
        return sig, codegen
    return dots


_pair_dots_rb = _pair_dots(R_ROWS, T_BLOCKS)


@njit(cache=True)
def quantize_x16_tokens(x, group_size, xq, xsum, xstep):
    """Round each token of x (f32 (T, K)) to int16 per group with `quantize_x16_int4` (the GEMV's rounding), laid
    out for `_pair_dots` in blocks of TOKEN_PAD tokens: xq int16 (Tp/TOKEN_PAD, K/2, TOKEN_PAD, 2) with
    xq[t // TOKEN_PAD, m, t % TOKEN_PAD] = (xlo[m], xhi[m]) of token t (a block's activations for one group are
    then gb * TOKEN_PAD * 4 contiguous bytes); xsum int32 (K/g, Tp), xstep f32 (K/g, Tp). Tokens T..Tp-1 are left
    as they are (zeros from the caller)."""
    T, K = x.shape
    G = K // group_size
    xlo = np.empty((T, K // 2), dtype=np.int16)
    xhi = np.empty((T, K // 2), dtype=np.int16)
    s = np.empty((T, G), dtype=np.int32)
    st = np.empty((T, G), dtype=np.float32)
    for t in range(T):
        quantize_x16_int4(x[t], group_size, xlo[t], xhi[t], s[t], st[t])
    xsum[:, :T] = s.T
    xstep[:, :T] = st.T
    for t0 in range(0, T, TOKEN_PAD):                   # transpose in tiles of 64 bytes x TOKEN_PAD tokens
        for m0 in range(0, K // 2, 64):
            for t in range(t0, min(T, t0 + TOKEN_PAD)):
                for m in range(m0, min(K // 2, m0 + 64)):
                    xq[t0 // TOKEN_PAD, m, t - t0, 0] = xlo[t, m]
                    xq[t0 // TOKEN_PAD, m, t - t0, 1] = xhi[t, m]


def _unpack_intrinsic(nbytes: int):
    """An intrinsic unpack(row, off, wp, w0): wp[w0 + j] = (row[off + j] & 15) | (row[off + j] >> 4) << 16 for
    j < nbytes (uint8 row, int32 wp): byte m's two codes as the int16 pair `_pair_dots` multiplies, one vector
    load, and, shift and or (numba's scalar loop did it a byte at a time, ~30 % of the GEMM)."""
    @intrinsic
    def unpack(typingctx, row, off, wp, w0):
        if not (isinstance(row, types.Array) and row.dtype == types.uint8 and isinstance(wp, types.Array)
                and wp.dtype == types.int32 and row.layout == "C" and wp.layout == "C"):
            raise errors.TypingError("unpack: row uint8, wp int32, contiguous")
        sig = types.void(row, types.intp, wp, types.intp)

        def codegen(context, builder, signature, args):
            v8, v32 = ir.VectorType(ir.IntType(8), nbytes), ir.VectorType(ir.IntType(32), nbytes)
            src = context.make_array(signature.args[0])(context, builder, args[0]).data
            dst = context.make_array(signature.args[2])(context, builder, args[2]).data
            b = builder.zext(builder.load(builder.bitcast(builder.gep(src, [args[1]]), v8.as_pointer()), align=1), v32)
            lo = builder.and_(b, ir.Constant(v32, [15] * nbytes))
            hi = builder.shl(builder.lshr(b, ir.Constant(v32, [4] * nbytes)), ir.Constant(v32, [16] * nbytes))
            builder.store(builder.or_(lo, hi), builder.bitcast(builder.gep(dst, [args[3]]), v32.as_pointer()), align=4)
            return context.get_dummy_value()
        return sig, codegen
    return unpack


_unpack_16 = _unpack_intrinsic(16)
_unpack_32 = _unpack_intrinsic(32)
_unpack_64 = _unpack_intrinsic(64)


@njit(cache=True, inline="always")
def _unpack_pairs(row, m0, gb, wp, w0):
    """wp[w0 + j] = the code pair of byte row[m0 + j], j < gb (gb = 16, 32 or a multiple of 64: group sizes 32, 64,
    128, 256, ...)."""
    if gb == 16:
        _unpack_16(row, m0, wp, w0)
    elif gb == 32:
        _unpack_32(row, m0, wp, w0)
    else:
        for j in range(0, gb, 64):
            _unpack_64(row, m0 + j, wp, w0 + j)


@njit(cache=True, nogil=True)
def _gemm_int4_q16_rows(qb, scale_bits, zeros, group_size, xp, xsum, xstep, T, out, n0, n1, wp, iacc, facc):
    """out[t, n] for rows [n0, n1) (at most _ROW_BLOCK) of one int4 weight (bytes qb, uint8 (N, K/2), zero points
    zeros uint8 (N, K/g)) and
    tokens t < T, from the activations of quantize_x16_tokens (xp: their int32 view (Tp/TOKEN_PAD, K/2, TOKEN_PAD)). Per group: the
    rows' codes unpacked once (wp), then for each block of TOKEN_PAD tokens (its activations, gb x TOKEN_PAD x 4
    bytes, stay in L1 across the row passes) R_ROWS rows at a time. Scratch: wp int32 (_ROW_BLOCK*gb,), iacc int32
    (R_ROWS*TOKEN_PAD,), facc f32 (_ROW_BLOCK, Tp)."""
    gb = group_size // 2
    G = qb.shape[1] // gb
    Tp = xp.shape[0] * TOKEN_PAD
    rows = n1 - n0
    facc[:rows] = np.float32(0.0)
    for g in range(G):
        m0 = g * gb
        for r in range(rows):
            _unpack_pairs(qb[n0 + r], m0, gb, wp, r * gb)
        wp[rows * gb:(-(-rows // R_ROWS) * R_ROWS) * gb] = 0          # rows past n1 of the last pass: zero codes
        for t0 in range(0, Tp, TOKEN_PAD):
            xs = xstep[g, t0:t0 + TOKEN_PAD]
            xm = xsum[g, t0:t0 + TOKEN_PAD]
            for r0 in range(0, rows, R_ROWS):
                _pair_dots_rb(wp[r0 * gb:(r0 + R_ROWS) * gb], xp[t0 // TOKEN_PAD], m0, gb, 0, iacc)
                for r in range(r0, min(rows, r0 + R_ROWS)):
                    sc = _widen_f16(scale_bits[n0 + r, g])
                    z = np.int32(zeros[n0 + r, g])
                    fr = facc[r, t0:t0 + TOKEN_PAD]
                    ia = iacc[(r - r0) * TOKEN_PAD:(r - r0 + 1) * TOKEN_PAD]
                    for l in range(TOKEN_PAD):                  # the GEMV's expression, in its order over groups
                        fr[l] += (sc * xs[l]) * np.float32(ia[l] - z * xm[l])
    for r in range(rows):
        for t in range(T):
            out[t, n0 + r] = facc[r, t]


@intrinsic
def _fetch_add(typingctx, arr):
    """Atomically arr[0] += 1; returns the value before (int64 (1,) array)."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.int64 and arr.ndim == 1):
        raise errors.TypingError("_fetch_add: int64 1-D array")
    sig = types.int64(arr)

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        return builder.atomic_rmw("add", data, ir.Constant(ir.IntType(64), 1), "seq_cst")
    return sig, codegen


@njit(cache=True, nogil=True)
def _gemm_int4_q16_worker(taken, first, qbs, scales, zeros, group_size, xp, xsum, xstep, T, outs):
    """Take row blocks from the work list `first` (row_block_list) until none is left and compute them; `taken`
    (int64 (1,)) is the shared cursor, advanced atomically, so any number of threads may run this at once and each
    block is computed by exactly one of them (the same arithmetic whichever it is)."""
    wp = np.empty(-(-_ROW_BLOCK // R_ROWS) * R_ROWS * (group_size // 2), dtype=np.int32)
    iacc = np.empty(R_ROWS * TOKEN_PAD, dtype=np.int32)
    facc = np.empty((_ROW_BLOCK, xp.shape[0] * TOKEN_PAD), dtype=np.float32)
    while True:
        b = _fetch_add(taken)
        if b >= first[-1]:
            return
        m, n0, n1 = row_block(first, qbs, _ROW_BLOCK, b)
        _gemm_int4_q16_rows(qbs[m], scales[m], zeros[m], group_size, xp, xsum, xstep, T, outs[m], n0, n1, wp, iacc,
                            facc)


def gemm_int4_q16_multi(x, qbytes, scales, group_size, outs, zeros=None):
    """outs[m] = x @ W_m.T for T tokens with each token rounded to int16 per group exactly as gemv_int4_q16_multi
    rounds it (fast numerics: a token's outputs are bitwise the GEMV's). x: f32 (T, K) contiguous; qbytes: uint8
    (N_m, K/2) views of the packed words; scales: uint16 (N_m, K/g) f16 bits; outs: f32 (T, N_m), every element
    written; zeros: uint8 (N_m, K/g) zero points each, None = all layout 1. The row blocks of all the weights are one work list that the calling thread and the backend's workers
    take from in turn (whoever has a core does the work)."""
    T, K = x.shape
    Tp = -(-T // TOKEN_PAD) * TOKEN_PAD
    G = K // group_size
    xq = np.zeros((Tp // TOKEN_PAD, K // 2, TOKEN_PAD, 2), dtype=np.int16)
    xsum = np.zeros((G, Tp), dtype=np.int32)
    xstep = np.zeros((G, Tp), dtype=np.float32)
    quantize_x16_tokens(x, group_size, xq, xsum, xstep)
    zeros = tuple(zeros_or_symmetric(z, q, group_size) for q, z in zip(qbytes, zeros or (None,) * len(qbytes)))
    qbytes, scales, outs = tuple(qbytes), tuple(scales), tuple(outs)
    first = row_block_list(qbytes, _ROW_BLOCK)
    args = (np.zeros(1, dtype=np.int64), first, qbytes, scales, zeros, group_size, xq.view(np.int32).reshape(Tp // TOKEN_PAD, K // 2, TOKEN_PAD),
            xsum, xstep, T, outs)
    pool, n_workers = _worker_pool()
    futs = [pool.submit(_gemm_int4_q16_worker, *args) for _ in range(min(n_workers, int(first[-1])) - 1)]
    try:
        _gemm_int4_q16_worker(*args)
    finally:
        for fut in futs:
            fut.result()


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
        o2 = np.empty((2, 16), dtype=np.float32)
        z = symmetric_zeros(16, K // g)              # read-only, as the file's zero points and this one are
        for m in (1, 2, 3):
            gemv_int4_q16_multi(x, (qb,) * m, (sc,) * m, g, (o,) * m, (z,) * m)
            gemm_int4_q16_multi(np.ones((2, K), dtype=np.float32), (qb,) * m, (sc,) * m, g, (o2,) * m, (z,) * m)
            xlo = np.zeros(K // 2, np.int16)
            _gemv_int4_q16_parallel(xlo, xlo, np.zeros(K // g, np.int32), np.zeros(K // g, np.float32),
                                    (qb,) * m, (sc,) * m, (z,) * m, g, (o,) * m)
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
