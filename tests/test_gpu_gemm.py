"""Prefill INT4 GEMM (gemm_multi: gemm_int4_wgmma, csrc/src/gemm_wgmma.cuh, on a Hopper GPU from 128 tokens on;
gemm_int4_mma, csrc/src/gemm_kernels.cuh, otherwise) vs a float64 numpy reference, through libnanoqwen_testing's
nq_test_gemm_int4_multi (GPU only).

Covers what the kernels' tiling needs: M and N not multiples of the 128 x 128 tile (M 1 .. 512, N down to 3),
groups 32/64/128, bias and residual add on and off, 1-3 segments in one launch (q/k/v, gate/up), row strides
lda > K (the columns past K hold NaN: reading one poisons the result) and ldc > sum of N (the columns no segment
owns must come back bit-identical), and two runs giving identical bits (serial split-K, used where the grid leaves
SMs idle, adds the partials in a fixed order).
Cases that split (gemm_int4_mma, gemm.cu choose_splits, 132 SMs): M17-N1000 (3 splits). On a Hopper GPU from
M = 128 with >= 66 blocks, gemm_int4_wgmma runs instead, each of its block shapes (gemm.cu choose_wgmma) in some
case: 128 x 256 (M2048-N3584), 128 x 128 (M512-N3584-K18944, M128-N9000+4100), 192 x 128 (M512 q/k/v segments,
M513-N18944, M512-N4864+4864); the other cases run gemm_int4_mma.
Fresh random inputs every call; outputs poisoned with NaN when not accumulating. Every case runs INT4 layout 1
and layout 2 (fresh random zero points per segment, the layout-2 builds of the same kernels), and one case mixes
the layouts across segments (gemm_multi launches per segment then).
"""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from test_gpu_kernels import dequant, pack_fast, random_int4, random_zeros, rel_err

pytestmark = pytest.mark.gpu

# Error budget of one output: A is rounded to f16 in the library and the reference sees the same f16 values, so
# the only rounding left is the f16 dequantisation of each weight (2^-12 relative, independent signs) and f32
# accumulation (K * 2^-24 worst case, ~1e-3 of it for K = 18944, random signs: far smaller). The relative
# Frobenius error is therefore ~2^-12 = 2.4e-4; TOL_REL allows 4x that.
TOL_REL = 1e-3
# Largest single-element error relative to the RMS of the reference: an element is a sum of K products each off by
# at most 2^-11 relative; 1e-2 of the RMS is ~40 x the expected f16 dequant error of one output, far below the
# size of any indexing mistake (a wrong k-pair, row or scale moves an element by O(RMS)).
TOL_ELEM = 1e-2

_F32P = ctypes.POINTER(ctypes.c_float)


@pytest.fixture(scope="module")
def lib():
    from nq_testing_lib import load_testing_library
    return load_testing_library()


def run_gemm(lib, segs, A, K, g, lda, bias, C, ldc, add):
    """segs: [(q uint32 (N, K/8), s f16 (N, K/g)[, z uint8 (N, K/g) or None])]; A f32 (M, lda); bias: list of f32
    (N) or None per segment; C f32 (M, ldc) in/out. Returns (rc, C after)."""
    n = len(segs)
    qs = [np.ascontiguousarray(seg[0]) for seg in segs]
    ss = [np.ascontiguousarray(seg[1].view(np.uint16)) for seg in segs]
    zs = [None if len(seg) < 3 or seg[2] is None else np.ascontiguousarray(seg[2]) for seg in segs]
    qp = (ctypes.POINTER(ctypes.c_uint32) * n)(*[q.ctypes.data_as(ctypes.POINTER(ctypes.c_uint32)) for q in qs])
    sp = (ctypes.POINTER(ctypes.c_uint16) * n)(*[s.ctypes.data_as(ctypes.POINTER(ctypes.c_uint16)) for s in ss])
    _U8P = ctypes.POINTER(ctypes.c_uint8)
    zp = (_U8P * n)(*[ctypes.cast(None, _U8P) if z is None else z.ctypes.data_as(_U8P) for z in zs])
    Ns = (ctypes.c_int32 * n)(*[q.shape[0] for q in qs])
    bs = [None if b is None else np.ascontiguousarray(b, dtype=np.float32) for b in bias]
    bp = (_F32P * n)(*[ctypes.cast(None, _F32P) if b is None else b.ctypes.data_as(_F32P) for b in bs])
    A = np.ascontiguousarray(A, dtype=np.float32)
    out = np.ascontiguousarray(C, dtype=np.float32).copy()
    rc = lib.nq_test_gemm_int4_multi(n, qp, sp, zp, Ns, K, g, A.ctypes.data_as(_F32P), A.shape[0], lda, bp,
                                     out.ctypes.data_as(_F32P), ldc, 1 if add else 0)
    return rc, out


def make_case(rng, M, Ns, K, g, lda_pad, ldc_pad, with_bias, add, layouts=None):
    """Random weights/activations for segments of N in Ns, of INT4 layouts[i] (1 or 2; default all 1); returns
    everything run_gemm needs plus the float64 reference of the whole (M, ldc) output."""
    segs, us = [], []
    for i, N in enumerate(Ns):
        u, q, s = random_int4(rng, N, K, g)
        z = random_zeros(rng, N, K, g) if layouts and layouts[i] == 2 else None
        segs.append((q, s, z))
        us.append((u, s, z))
    lda, ldc = K + lda_pad, sum(Ns) + ldc_pad
    A = np.full((M, lda), np.nan, dtype=np.float32)                    # columns >= K: NaN, never to be read
    A[:, :K] = rng.standard_normal((M, K)).astype(np.float32)
    bias = [(rng.standard_normal(N).astype(np.float32) if with_bias else None) for N in Ns]
    if add:
        C = rng.standard_normal((M, ldc)).astype(np.float32)             # the residual being added to
    else:
        C = np.full((M, ldc), np.nan, dtype=np.float32)                  # poison: unwritten outputs stay NaN
        C[:, sum(Ns):] = rng.standard_normal((M, ldc_pad)).astype(np.float32)  # not owned: must come back as is
    a16 = A[:, :K].astype(np.float16).astype(np.float64)               # what the kernel multiplies
    ref = C.astype(np.float64).copy()
    off = 0
    for (u, s, z), N, b in zip(us, Ns, bias):
        y = a16 @ dequant(u, s, g, z).T
        if b is not None:
            y += b.astype(np.float64)
        ref[:, off:off + N] = (ref[:, off:off + N] if add else 0.0) + y
        off += N
    return segs, A, lda, bias, C, ldc, ref, off


def check(out, ref, C_in, owned, what):
    assert np.isfinite(out[:, :owned]).all(), f"{what}: unwritten (NaN) outputs or a NaN read past K"
    assert np.array_equal(out[:, owned:], C_in[:, owned:]), f"{what}: wrote columns no segment owns"
    err = rel_err(out[:, :owned], ref[:, :owned])
    assert err < TOL_REL, f"{what}: relative error {err:.2e}"
    d = np.abs(out[:, :owned].astype(np.float64) - ref[:, :owned])
    worst = float(d.max() / np.sqrt(np.mean(ref[:, :owned] ** 2)))
    assert worst < TOL_ELEM, f"{what}: worst element off by {worst:.2e} of the RMS"


CASES = [  # (M, [N per segment], K, group, lda pad, ldc pad, bias, add)
    (1, [896], 896, 64, 0, 0, False, False),
    (17, [1000], 3584, 128, 8, 4, True, False),          # N not a multiple of 128, strides wider than the data
    (130, [896, 128, 128], 896, 32, 0, 0, True, False),  # 0.5B q/k/v in one launch, group 32
    (512, [4864, 4864], 896, 64, 0, 0, False, False),    # 0.5B gate/up
    (64, [3, 40, 130], 256, 32, 16, 2, True, True),      # tiny segments, bias and residual add
    (200, [3584], 18944, 128, 0, 0, False, True),        # 7B down + residual, M not a multiple of 128
    (129, [512, 512], 3584, 128, 0, 0, True, False),     # 7B k/v-shaped pair, one row past a tile
    # the 7B shapes at the M of issue 12 (1, 7, 64: gemm_int4_mma; 512, 513, 2048: gemm_int4_wgmma), groups 32..256
    (1, [3584], 18944, 256, 0, 0, False, True),          # down, one token
    (7, [3584, 512, 512], 3584, 32, 0, 0, True, False),  # q/k/v, group 32
    (64, [3584], 3584, 64, 8, 0, False, False),           # o
    (512, [3584, 512, 512], 3584, 32, 8, 4, True, False),  # q/k/v segments, strides wider than the data
    (512, [3584], 18944, 128, 0, 0, False, True),        # down + residual
    (513, [18944], 3584, 256, 0, 0, False, False),       # gate, one token past a tile, group 256
    (2048, [3584], 3584, 64, 0, 0, True, True),          # o, bias and residual add
    (128, [9000, 4100], 512, 64, 0, 0, True, True),      # the smallest wgmma M (104 blocks), segment tails
    # few-token builds on a Hopper GPU (gemm.cu): 16-token tile to M = 16, 32-token to 64 (M = 64 above: two tiles),
    # two 64-token tiles from 65
    (100, [4608], 3584, 128, 0, 0, True, False),         # q/k/v rows, two 64-token tiles
    (40, [3584], 18944, 64, 0, 0, False, True),          # down + residual, two 32-token tiles, the second short
]


@pytest.mark.parametrize("layout", [1, 2])
@pytest.mark.parametrize("case", CASES, ids=[f"M{c[0]}-N{'+'.join(map(str, c[1]))}-K{c[2]}-g{c[3]}"
                                              f"{'-bias' if c[6] else ''}{'-add' if c[7] else ''}" for c in CASES])
def test_gemm_int4_multi_vs_numpy(lib, case, layout):
    M, Ns, K, g, lda_pad, ldc_pad, with_bias, add = case
    rng = np.random.default_rng()
    segs, A, lda, bias, C, ldc, ref, owned = make_case(rng, M, Ns, K, g, lda_pad, ldc_pad, with_bias, add,
                                                       [layout] * len(Ns))
    rc, out = run_gemm(lib, segs, A, K, g, lda, bias, C, ldc, add)
    assert rc == 0, lib.nq_last_error().decode()
    check(out, ref, C, owned, f"gemm layout {layout}")


@pytest.mark.parametrize("M", [7, 512])
def test_gemm_int4_multi_mixed_layouts(lib, M):
    """q/k/v-shaped segments of layouts 2, 1, 2 in one gemm_multi call: one launch per segment, each its layout's
    build (few-token at M = 7, prefill at M = 512 on a Hopper GPU)."""
    rng = np.random.default_rng()
    segs, A, lda, bias, C, ldc, ref, owned = make_case(rng, M, [3584, 512, 512], 3584, 128, 0, 0, True, False,
                                                       [2, 1, 2])
    rc, out = run_gemm(lib, segs, A, 3584, 128, lda, bias, C, ldc, False)
    assert rc == 0, lib.nq_last_error().decode()
    check(out, ref, C, owned, "gemm mixed layouts")


@pytest.mark.parametrize("layout", [1, 2])
@pytest.mark.parametrize("M,N,K", [(512, 3584, 18944), (17, 1000, 3584)])
def test_gemm_split_k_is_deterministic(lib, M, N, K, layout):
    """Split-K (gemm_int4_mma; the few-token wgmma builds at M = 17 on a Hopper GPU) adds the partials of a tile in
    split order, and the prefill gemm_int4_wgmma (M = 512 here) does not split: two runs on the same inputs give the
    same bits."""
    rng = np.random.default_rng()
    segs, A, lda, bias, C, ldc, ref, owned = make_case(rng, M, [N], K, 128, 0, 0, True, True, [layout])
    outs = []
    for _ in range(2):
        rc, out = run_gemm(lib, segs, A, K, 128, lda, bias, C, ldc, True)
        assert rc == 0, lib.nq_last_error().decode()
        outs.append(out)
    check(outs[0], ref, C, owned, "gemm")
    assert np.array_equal(outs[0], outs[1]), "two runs of the same GEMM differ"


@pytest.mark.parametrize("g", [16, 48, 96])
def test_gemm_rejects_groups_outside_the_contract(lib, g):
    """group must be one of the format's group sizes (nanoqwen_format.constants.INT4_GROUP_SIZES) dividing K, the
    one rule of the whole library: others fail closed."""
    rng = np.random.default_rng()
    K = 192
    u = rng.integers(0, 16, size=(64, K), dtype=np.uint8)
    q = pack_fast(u)
    s = np.ones((64, K // g), dtype=np.float16)
    A = rng.standard_normal((5, K)).astype(np.float32)
    C = np.zeros((5, 64), dtype=np.float32)
    rc, _ = run_gemm(lib, [(q, s)], A, K, g, K, [None], C, 64, False)
    assert rc != 0 and "group" in lib.nq_last_error().decode()


# gemm_swiglu (the MLP's first half, H = silu(A gate^T) * (A up^T) in f16): on a Hopper GPU from 128 tokens one
# gemm_int4_wgmma launch whose blocks hold gate and up rows in pairs (the SwiGLU epilogue), below that the unfused path
# (gemm_multi, then swiglu_rows).
# Error budget of one output against float64: g and u each carry the GEMM's ~2^-12 relative error (TOL_REL's
# reasoning), silu(g) * u inherits at most about twice that relative to its magnitude, and the f16 store adds 2^-11
# relative: ~1e-3 in all. SWIGLU_TOL_REL allows ~3x that for the Frobenius error.
SWIGLU_TOL_REL = 3e-3
# The fused and the unfused path multiply the same f16 values, so their f32 g and u differ at most by the f32
# accumulation order (~1e-7 relative); after the f16 rounding of the product an element differs by at most one f16
# unit in the last place (2^-11 relative on average, 2^-10 at worst) except where g cancels to ~0. Their relative
# Frobenius difference is therefore below 2^-10, while any indexing mistake in the epilogue would be O(1).
SWIGLU_PATHS_REL = 2.0 ** -10

SWIGLU_CASES = [  # (M, N, K, group)
    (512, 18944, 3584, 128),   # 7B gate/up at the TTFT prompt (the 128-row x 256-token build: 64-row pairs)
    (512, 4864, 896, 128),     # 0.5B gate/up at 512 tokens (the 192 x 128 build: 96-row pairs, the last one partial)
    (513, 4864, 896, 64),      # 0.5B, one token past a tile
    (128, 4900, 896, 32),      # the smallest fused M (the 128 x 128 build), N not a multiple of 64
    (128, 1000, 512, 32),      # 16 blocks, too few for the GPU: the unfused path
    (2048, 3072, 1024, 256),
    (64, 4864, 896, 128),      # below 128 tokens: the unfused path
    (7, 896, 256, 32),
]


def _silu_mul(g, u):
    return g / (1.0 + np.exp(-g)) * u


@pytest.mark.parametrize("layout", [1, 2])
@pytest.mark.parametrize("M,N,K,g", SWIGLU_CASES, ids=[f"M{c[0]}-N{c[1]}-K{c[2]}-g{c[3]}" for c in SWIGLU_CASES])
def test_gemm_swiglu_vs_numpy(lib, M, N, K, g, layout):
    rng = np.random.default_rng()
    ug, qg, sg = random_int4(rng, N, K, g)
    uu, qu, su = random_int4(rng, N, K, g)
    zg = random_zeros(rng, N, K, g) if layout == 2 else None
    zu = random_zeros(rng, N, K, g) if layout == 2 else None
    A = rng.standard_normal((M, K)).astype(np.float32)
    a16 = A.astype(np.float16).astype(np.float64)
    ref = _silu_mul(a16 @ dequant(ug, sg, g, zg).T, a16 @ dequant(uu, su, g, zu).T)
    _U8P = ctypes.POINTER(ctypes.c_uint8)
    u8p = lambda z: None if z is None else np.ascontiguousarray(z).ctypes.data_as(_U8P)  # noqa: E731
    outs = []
    for unfused in (0, 1):
        H = np.full((M, N), 0x7e00, dtype=np.uint16)        # poison (f16 NaN) also on the host side
        rc = lib.nq_test_gemm_swiglu(
            np.ascontiguousarray(qg).ctypes.data_as(ctypes.POINTER(ctypes.c_uint32)),
            np.ascontiguousarray(sg.view(np.uint16)).ctypes.data_as(ctypes.POINTER(ctypes.c_uint16)), u8p(zg),
            np.ascontiguousarray(qu).ctypes.data_as(ctypes.POINTER(ctypes.c_uint32)),
            np.ascontiguousarray(su.view(np.uint16)).ctypes.data_as(ctypes.POINTER(ctypes.c_uint16)), u8p(zu),
            N, K, g, A.ctypes.data_as(_F32P), M, unfused, H.ctypes.data_as(ctypes.POINTER(ctypes.c_uint16)))
        assert rc == 0, lib.nq_last_error().decode()
        h = H.view(np.float16).astype(np.float64)
        assert np.isfinite(h).all(), f"layout {layout}, unfused={unfused}: unwritten (NaN) outputs"
        err = rel_err(h, ref)
        assert err < SWIGLU_TOL_REL, f"layout {layout}, unfused={unfused}: relative error {err:.2e}"
        outs.append(h)
    d = rel_err(outs[0], outs[1])
    assert d <= SWIGLU_PATHS_REL, f"layout {layout}: fused vs unfused: {d:.2e} relative"


# Dense (f16 / bf16) weights through gemm(): the f16 lm_head of a batched step or a logits_all pass (gemm_f16_kernel,
# a cp.async ring) and bf16 (gemm_kernel). Shapes cover partial row tiles (M not a multiple of 64, N not of 128), a
# K of 5 stages and one of 2, and the residual add. A and W are the f16 (bf16) values the kernel sees, so the float64
# reference differs only by f32 accumulation: TOL_REL / TOL_ELEM are loose here.
@pytest.mark.parametrize("dtype", [1, 2], ids=["f16", "bf16"])
@pytest.mark.parametrize("M,N,K,add", [(1, 200, 128, 0), (5, 1000, 320, 1), (32, 4100, 3584, 0), (64, 384, 896, 1),
                                       (100, 130, 64, 0)])
def test_gemm_dense_vs_numpy(lib, dtype, M, N, K, add):
    rng = np.random.default_rng()
    W = rng.standard_normal((N, K)).astype(np.float32)
    if dtype == 1:
        Wq = W.astype(np.float16)
        bits, Wref = Wq.view(np.uint16), Wq.astype(np.float64)
    else:
        bits = (W.view(np.uint32) >> 16).astype(np.uint16)          # bf16 by truncation, exact as bits
        Wref = (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    A = rng.standard_normal((M, K)).astype(np.float32)
    C0 = rng.standard_normal((M, N)).astype(np.float32)
    C = C0.copy()
    rc = lib.nq_test_gemm_dense(np.ascontiguousarray(bits).ctypes.data_as(ctypes.POINTER(ctypes.c_uint16)), dtype, N,
                                K, A.ctypes.data_as(_F32P), M, add, C.ctypes.data_as(_F32P))
    assert rc == 0, lib.nq_last_error().decode()
    ref = A.astype(np.float16).astype(np.float64) @ Wref.T + (C0 if add else 0)
    assert np.isfinite(C).all()
    err = rel_err(C, ref)
    assert err < TOL_REL, f"relative error {err:.2e}"
    assert np.abs(C - ref).max() < TOL_ELEM * np.sqrt(np.mean(ref ** 2))
