"""libnanoqwen kernels vs float64 numpy references, through libnanoqwen_testing's nq_test_* entry points (GPU only).

Every call draws fresh random inputs; the library poisons its outputs (NaN) before each kernel, so an
unwritten element fails the finiteness check. Shapes sweep the linear layers of every Qwen2.5 size. The INT4 tests
run both layouts: layout 1 (symmetric, zero code 8) and layout 2 (a zero point 0..15 per (row, group), fresh random
zeros every call, never all 8); test_layout_2_with_zeros_8_is_layout_1 checks layout 2's kernels bit for bit
against layout 1's with every zero point 8 (the same dequantised weights).
"""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from nanoqwen_format.constants import INT4_PERM
from nanoqwen_format.int4_layout import dequantize_int4_asym_reference, dequantize_int4_reference, pack_int4_reference
from nanoqwen_format.shapes import QWEN25_SHAPES
from nq_testing_lib import check as _check

pytestmark = pytest.mark.gpu

PERM = np.array(INT4_PERM)


def _shapes():
    out = []
    for name, sh in QWEN25_SHAPES.items():
        out += [(f"{name}-qkv", sh.qkv_rows, sh.hidden), (f"{name}-gate", sh.intermediate, sh.hidden),
                (f"{name}-down", sh.hidden, sh.intermediate)]
    return out


# odd N (the last row pair of the split kernel is a single row) and N below one row pair per warp of the grid
SHAPES = _shapes() + [("odd-N", 4607, 3584), ("tiny", 3, 256), ("odd-K", 37, 96)]


@pytest.fixture(scope="module")
def lib():
    from nq_testing_lib import load_testing_library
    return load_testing_library()


def _f32p(a):
    return a.ctypes.data_as(ctypes.POINTER(ctypes.c_float))


def pack_fast(u: np.ndarray) -> np.ndarray:
    """Vectorised layout-1 packer (u (N, K) uint8 0..15 -> uint32 (N, K/8)); checked against the spec's
    reference packer in test_pack_fast_matches_reference."""
    N, K = u.shape
    v = u.reshape(N, K // 8, 8)[:, :, PERM].astype(np.uint32)           # nibble i holds k = 8j + PERM[i]
    return np.bitwise_or.reduce(v << (4 * np.arange(8, dtype=np.uint32)), axis=2).astype(np.uint32)


def random_int4(rng, N, K, g):
    u = rng.integers(0, 16, size=(N, K), dtype=np.uint8)                 # (N, K) codes
    s = (rng.uniform(0.5, 1.5, size=(N, K // g)) / np.sqrt(21.5 * K)).astype(np.float16)  # (N, K/g)
    s[rng.random(s.shape) < 0.1] *= -1                                   # some negative scales
    return u, pack_fast(u), s


def random_zeros(rng, N, K, g):
    """Layout-2 zero points: uint8 (N, K/g) uniform in 0..15 (fresh per call; never all 8)."""
    z = rng.integers(0, 16, size=(N, K // g), dtype=np.uint8)
    z.flat[0] = 3                                                        # at least one zero point is not 8
    return z


def dequant(u, s, g, z=None):
    """float64 W (N, K) = s * (u - z) per group; z None: layout 1 (z = 8)."""
    zz = 8.0 if z is None else np.repeat(z.astype(np.float64), g, axis=1)
    return (u.astype(np.float64) - zz) * np.repeat(s.astype(np.float64), g, axis=1)


def zeros_for(layout, rng, N, K, g):
    """None for layout 1, fresh random zero points for layout 2."""
    return None if layout == 1 else random_zeros(rng, N, K, g)


def _u8p(a):
    return None if a is None else np.ascontiguousarray(a).ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))


def test_pack_fast_matches_reference():
    rng = np.random.default_rng(1)
    u = rng.integers(0, 16, size=(6, 64), dtype=np.uint8)
    q = pack_fast(u)
    np.testing.assert_array_equal(q, pack_int4_reference(u))
    s = rng.uniform(-1, 1, size=(6, 2)).astype(np.float16)
    np.testing.assert_allclose(dequant(u, s, 32), dequantize_int4_reference(q, s, 32), rtol=0, atol=0)
    z = random_zeros(rng, 6, 64, 32)
    np.testing.assert_allclose(dequant(u, s, 32, z), dequantize_int4_asym_reference(q, s, z, 32), rtol=0, atol=0)


# INT4 GEMV with f16 arithmetic against float64 (test_gemv_int4_vs_numpy): the rigorous per-row bound (x to f16:
# u = 2^-11; f16 partial sums of 16 products: gamma_9 ~ 9u; 10u = 4.9e-3 of sum |w x|, with margin), and the typical
# relative error over many rows (random rounding: ~5e-4 measured on every Qwen2.5 shape, 3e-3 allowed). Both hold
# for layout 2 unchanged: u - z is exact in f16 as u - 8 is, and the bounds are relative to the same sums.
GEMV_F16_WORST = 5.5e-3
GEMV_F16_REL = 3e-3


def rel_err(y, ref):
    return float(np.linalg.norm(y.astype(np.float64) - ref) / np.linalg.norm(ref))



@pytest.mark.parametrize("layout", [1, 2])
@pytest.mark.parametrize("name,N,K", SHAPES, ids=[s[0] for s in SHAPES])
@pytest.mark.parametrize("g", [128, 64, 32, 256])
def test_gemv_int4_vs_numpy(lib, name, N, K, g, layout):
    if K % g:
        pytest.skip(f"K={K} is not a multiple of the group {g}")
    rng = np.random.default_rng()
    u, q, s = random_int4(rng, N, K, g)
    z = zeros_for(layout, rng, N, K, g)
    x = rng.standard_normal(K).astype(np.float32) * 3.0
    w_norm = (1.0 + 0.3 * rng.standard_normal(K)).astype(np.float32)
    eps = 1e-6
    xn = x.astype(np.float64) / np.sqrt(np.mean(x.astype(np.float64) ** 2) + eps) * w_norm
    w = dequant(u, s, g, z)                                              # float64 (N, K), once for both inputs
    for with_norm in (True, False):
        y = np.empty(N, dtype=np.float32)
        _check(lib, lib.nq_test_gemv_int4(q.ctypes.data_as(ctypes.POINTER(ctypes.c_uint32)),
                                          s.view(np.uint16).ctypes.data_as(ctypes.POINTER(ctypes.c_uint16)), _u8p(z),
                                          N, K, g, _f32p(x), _f32p(w_norm) if with_norm else None, eps, _f32p(y)))
        assert np.isfinite(y).all(), "unwritten (NaN-poisoned) outputs"
        xin = xn if with_norm else x.astype(np.float64)
        r = w @ xin
        # Worst case, per row: x rounded to f16 (u = 2^-11 of each product) and the kernel's f16 partial sums of 16
        # products (two chains of 8 fused multiply-adds, then one add: gamma_9 ~ 9u of the sum of |products|);
        # the f32 part above is negligible. A rigorous bound, so it holds for every draw.
        bound = np.abs(w) @ np.abs(xin)
        worst = float(np.max(np.abs(y - r) / bound))
        assert worst < GEMV_F16_WORST, f"{name} g{g} layout {layout} norm {with_norm}: error {worst:.2e} of sum |w x|"
        if N >= 16:  # with 3 rows the norm below is one draw of a heavy-tailed ratio (~0.5 % of draws > 3e-3)
            err = rel_err(y, r)
            assert err < GEMV_F16_REL, f"{name} g{g} layout {layout} norm {with_norm}: relative error {err:.2e}"


# shapes per mode as the decode step uses them; the split-K kernel picks 1, 2 or 4 warps per row pair among these
# (7B-down: 4, 32B-down and odd-N: 2, the rest 1), odd-N and tiny end in a single-row pair
ADD_SHAPES = [("7B-down", 3584, 18944), ("7B-o", 3584, 3584), ("0.5B-down", 896, 4864), ("32B-down", 5120, 27648),
              ("odd-N", 1001, 2048), ("tiny", 5, 128)]
SWIGLU_SHAPES = [("7B-gate", 18944, 3584), ("0.5B-gate", 4864, 896), ("odd-N", 1001, 2048), ("tiny", 5, 128)]


def _u32p(a):
    return a.ctypes.data_as(ctypes.POINTER(ctypes.c_uint32))


def _u16p(a):
    return a.view(np.uint16).ctypes.data_as(ctypes.POINTER(ctypes.c_uint16))


@pytest.mark.parametrize("layout", [1, 2])
@pytest.mark.parametrize("name,N,K", ADD_SHAPES, ids=[s[0] for s in ADD_SHAPES])
def test_gemv_int4_add_mode_vs_numpy(lib, name, N, K, layout):
    """y += W @ f16(x) (the o/down projections with the residual add)."""
    rng = np.random.default_rng()
    g = 128
    u, q, s = random_int4(rng, N, K, g)
    z = zeros_for(layout, rng, N, K, g)
    x = rng.standard_normal(K).astype(np.float32) * 2.0
    x16 = x.astype(np.float16).astype(np.float64)
    w = dequant(u, s, g, z)
    prod = w @ x16
    y0 = (rng.standard_normal(N) * np.std(prod)).astype(np.float32)   # residual of the same magnitude
    y = y0.copy()
    _check(lib, lib.nq_test_gemv_int4_mode(_u32p(q), _u16p(s), _u8p(z), None, None, None, N, K, g, _f32p(x), None,
                                           1e-6, 1, _f32p(y)))
    assert np.isfinite(y).all()
    # same arithmetic as test_gemv_int4_vs_numpy (x is given in f16 here, so exact); the residual add in f32
    # adds ~6e-8 x |y0|
    err = rel_err(y - y0, prod)
    assert err < GEMV_F16_REL, f"{name} layout {layout}: relative error {err:.2e}"


@pytest.mark.parametrize("layout", [1, 2])
@pytest.mark.parametrize("name,N,K", SWIGLU_SHAPES, ids=[s[0] for s in SWIGLU_SHAPES])
def test_gemv_int4_swiglu_mode_vs_numpy(lib, name, N, K, layout):
    """h = silu(Wg x') * (Wu x'), x' = rmsnorm(x) * norm_w (the gate/up projections)."""
    rng = np.random.default_rng()
    g = 128
    ug, qg, sg = random_int4(rng, N, K, g)
    uu, qu, su = random_int4(rng, N, K, g)
    zg, zu = zeros_for(layout, rng, N, K, g), zeros_for(layout, rng, N, K, g)
    x = rng.standard_normal(K).astype(np.float32) * 3.0
    w_norm = (1.0 + 0.3 * rng.standard_normal(K)).astype(np.float32)
    eps = 1e-6
    xn = x.astype(np.float64) / np.sqrt(np.mean(x.astype(np.float64) ** 2) + eps) * w_norm
    gate, up = dequant(ug, sg, g, zg) @ xn, dequant(uu, su, g, zu) @ xn
    ref = gate / (1.0 + np.exp(-gate)) * up
    y = np.empty(N, dtype=np.float32)
    _check(lib, lib.nq_test_gemv_int4_mode(_u32p(qg), _u16p(sg), _u8p(zg), _u32p(qu), _u16p(su), _u8p(zu), N, K, g,
                                           _f32p(x), _f32p(w_norm), eps, 2, _f32p(y)))
    assert np.isfinite(y).all(), "unwritten (NaN-poisoned) outputs"
    # product of two GEMV results (each within GEMV_F16_REL, see above; silu is 1-Lipschitz-ish in g, so the relative
    # errors add) rounded to f16 (2^-11): 8e-3
    err = rel_err(y, ref)
    assert err < 8e-3, f"{name} layout {layout}: relative error {err:.2e}"


@pytest.mark.parametrize("dtype", [1, 2])
@pytest.mark.parametrize("N,K", [(4864, 896), (1000, 3584), (QWEN25_SHAPES["7B"].vocab // 8, 3584)])
def test_gemv_dense_vs_numpy(lib, dtype, N, K):
    rng = np.random.default_rng()
    w32 = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    if dtype == 1:
        bits = w32.astype(np.float16).view(np.uint16)
        w = bits.view(np.float16).astype(np.float64)
    else:
        bits = (w32.view(np.uint32) >> 16).astype(np.uint16)             # bf16 by truncation: exact bits given
        w = (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    x = rng.standard_normal(K).astype(np.float32)
    y = np.empty(N, dtype=np.float32)
    _check(lib, lib.nq_test_gemv_dense(np.ascontiguousarray(bits).ctypes.data_as(ctypes.POINTER(ctypes.c_uint16)),
                                       dtype, N, K, _f32p(x), _f32p(y)))
    assert np.isfinite(y).all()
    err = rel_err(y, w @ x.astype(np.float64))
    assert err < 1e-3, f"relative error {err:.2e}"   # x rounded to f16 (2^-12), f32 products/sums


@pytest.mark.parametrize("layout", [1, 2])
@pytest.mark.parametrize("M", [1, 37, 64, 130])
@pytest.mark.parametrize("N,K,g", [(896, 896, 64), (4864, 896, 128), (512, 3584, 128), (3584, 18944, 128)])
def test_gemm_int4_vs_numpy(lib, M, N, K, g, layout):
    rng = np.random.default_rng()
    u, q, s = random_int4(rng, N, K, g)
    z = zeros_for(layout, rng, N, K, g)
    A = rng.standard_normal((M, K)).astype(np.float32)
    C = np.empty((M, N), dtype=np.float32)
    _check(lib, lib.nq_test_gemm_int4(q.ctypes.data_as(ctypes.POINTER(ctypes.c_uint32)),
                                      s.view(np.uint16).ctypes.data_as(ctypes.POINTER(ctypes.c_uint16)), _u8p(z),
                                      N, K, g, _f32p(A), M, _f32p(C)))
    assert np.isfinite(C).all()
    ref = A.astype(np.float64) @ dequant(u, s, g, z).T
    err = rel_err(C, ref)
    # A and the dequantised W each rounded to f16 (2^-12 relative each), f32 tensor-core accumulation
    assert err < 2e-3, f"layout {layout}: relative error {err:.2e}"


# Range: a down-projection input with a few "massive" channels (thousands, as checkpoints with outlier channels
# have). One f16 product (u - z) x with |u - z| = 15 overflows from |x| = 4,370; layout 1's (u - 8) x from 8,190. The
# layout-2 GEMV runs on x / 2 (F16Units::fma), so both layouts must stay finite and accurate at |x| = 6,000 with
# |u - z| >= 8 on those channels (the relative tolerance of test_gemv_int4_vs_numpy: the rounding is relative).
@pytest.mark.parametrize("layout", [1, 2])
def test_gemv_int4_large_activations_stay_finite(lib, layout):
    rng = np.random.default_rng()
    N, K, g = 512, 3584, 128
    u, q, s = random_int4(rng, N, K, g)
    z = zeros_for(layout, rng, N, K, g)
    z_or_8 = np.full((N, K // g), 8) if z is None else z.astype(np.int64)
    ch = rng.choice(K // 32, size=4, replace=False) * 32 + rng.integers(0, 32, size=4)     # 4 units, one channel each
    u[:, ch] = np.where(np.repeat(z_or_8, g, axis=1)[:, ch] >= 8, 0, 15)                  # |u - z| >= 8 there
    q = pack_fast(u)
    x = rng.standard_normal(K).astype(np.float32)
    x[ch] = rng.choice([-6000.0, 6000.0], size=4)
    w = dequant(u, s, g, z)
    for mode in ("store", "add"):
        y = np.zeros(N, dtype=np.float32)
        if mode == "store":
            _check(lib, lib.nq_test_gemv_int4(_u32p(q), _u16p(s), _u8p(z), N, K, g, _f32p(x), None, 1e-6, _f32p(y)))
        else:
            _check(lib, lib.nq_test_gemv_int4_mode(_u32p(q), _u16p(s), _u8p(z), None, None, None, N, K, g, _f32p(x),
                                                   None, 1e-6, 1, _f32p(y)))
        assert np.isfinite(y).all(), f"layout {layout} {mode}: inf/NaN outputs"
        err = rel_err(y, w @ x.astype(np.float16).astype(np.float64))
        assert err < GEMV_F16_REL, f"layout {layout} {mode}: relative error {err:.2e}"


# Layout 2 with every zero point 8 dequantises exactly as layout 1 (spec 9.5), and its kernels do the same arithmetic
# in the same order (1024 + 8 = 1032 subtracted, the same split and tile plans), so the GEMM outputs must be
# bit-identical: a check of the zero points' indexing and of every layout-2 build's plumbing that needs no tolerance.
# The GEMM cases reach every INT4 GEMM build on an H200 (gemm.cu, 132 SMs): M 1, 20, 40 (two 32-token tiles), 100 the
# few-token wgmma builds (16, 32, 64 tokens); M 130 x N 512 gemm_int4_mma (8 blocks: below half the SMs); M 512 x N
# 4608 the 192 x 128 build, M 512 x N 3584 x K 18944 the 128 x 128 build, M 2048 x N 3584 the 128 x 256 build
# (choose_wgmma's costs). The GEMV's layout-2 build runs on x / 2 and doubles its sums (its f16 range,
# F16Units::fma): exact scaling except where a halved x or an f16 partial falls into f16's subnormal range
# (|v| < 2^-14), which moves an output by about one f16 rounding of one partial; so its outputs are almost all
# bit-identical and the rest within GEMV_SAME_AS_L1 of the row scale (a misread zero point or a wrong x moves them
# by O(1)).
GEMV_SAME_AS_L1 = 1e-5


def _same_as_layout_1(y1, y2, what):
    assert np.isfinite(y1).all(), what
    assert np.mean(y1 == y2) > 0.99, f"{what}: {np.mean(y1 != y2):.2%} of the outputs differ"
    assert np.max(np.abs(y2 - y1)) <= GEMV_SAME_AS_L1 * np.max(np.abs(y1)), what


@pytest.mark.parametrize("g", [32, 128])
def test_layout_2_with_zeros_8_is_layout_1(lib, g):
    rng = np.random.default_rng()
    eights = lambda N, K: np.full((N, K // g), 8, dtype=np.uint8)  # noqa: E731
    # decode GEMV: STORE with and without the fused RMSNorm (7B q/k/v rows), ADD (7B down), SWIGLU (7B gate/up)
    N, K = 4608, 3584
    u, q, s = random_int4(rng, N, K, g)
    x = (rng.standard_normal(K) * 3).astype(np.float32)
    w_norm = (1.0 + 0.3 * rng.standard_normal(K)).astype(np.float32)
    for norm in (None, w_norm):
        ys = []
        for z in (None, eights(N, K)):
            y = np.empty(N, dtype=np.float32)
            _check(lib, lib.nq_test_gemv_int4(_u32p(q), _u16p(s), _u8p(z), N, K, g, _f32p(x),
                                              None if norm is None else _f32p(norm), 1e-6, _f32p(y)))
            ys.append(y)
        _same_as_layout_1(ys[0], ys[1], f"gemv store, norm {norm is not None}")
    N, K = 3584, 18944
    u, q, s = random_int4(rng, N, K, g)
    x = rng.standard_normal(K).astype(np.float32)
    y0 = rng.standard_normal(N).astype(np.float32)
    ys = []
    for z in (None, eights(N, K)):
        y = y0.copy()
        _check(lib, lib.nq_test_gemv_int4_mode(_u32p(q), _u16p(s), _u8p(z), None, None, None, N, K, g, _f32p(x), None,
                                               1e-6, 1, _f32p(y)))
        ys.append(y)
    _same_as_layout_1(ys[0] - y0, ys[1] - y0, "gemv add")
    N, K = 18944, 3584
    _, qg, sg = random_int4(rng, N, K, g)
    _, qu, su = random_int4(rng, N, K, g)
    x = (rng.standard_normal(K) * 3).astype(np.float32)
    ys = []
    for zg, zu in ((None, None), (eights(N, K), eights(N, K))):
        y = np.empty(N, dtype=np.float32)
        _check(lib, lib.nq_test_gemv_int4_mode(_u32p(qg), _u16p(sg), _u8p(zg), _u32p(qu), _u16p(su), _u8p(zu), N, K,
                                               g, _f32p(x), _f32p(w_norm), 1e-6, 2, _f32p(y)))
        ys.append(y)
    _same_as_layout_1(ys[0], ys[1], "gemv swiglu")
    # GEMM: every build
    for M, N, K in ((1, 4608, 3584), (20, 4608, 3584), (40, 4608, 3584), (100, 4608, 3584), (130, 512, 3584),
                    (512, 4608, 3584), (512, 3584, 18944), (2048, 3584, 3584)):
        u, q, s = random_int4(rng, N, K, g)
        A = rng.standard_normal((M, K)).astype(np.float32)
        Cs = []
        for z in (None, eights(N, K)):
            C = np.empty((M, N), dtype=np.float32)
            _check(lib, lib.nq_test_gemm_int4(_u32p(q), _u16p(s), _u8p(z), N, K, g, _f32p(A), M, _f32p(C)))
            Cs.append(C)
        assert np.isfinite(Cs[0]).all() and np.array_equal(Cs[0], Cs[1]), f"gemm M={M} N={N} K={K}"


def attention_ref(q, k, v, n_heads, n_kv, D):
    """q (n_heads*D), k/v (n_pos, n_kv, D) -> (n_heads*D), float64, K/V rounded to f16 like the cache."""
    G = n_heads // n_kv
    k = k.astype(np.float16).astype(np.float64)
    v = v.astype(np.float16).astype(np.float64)
    out = np.empty((n_heads, D))
    for h in range(n_heads):
        kh = h // G
        sc = k[:, kh, :] @ q[h * D:(h + 1) * D].astype(np.float64) / np.sqrt(D)
        p = np.exp(sc - sc.max())
        out[h] = (p / p.sum()) @ v[:, kh, :]
    return out.reshape(-1)


@pytest.mark.parametrize("n_heads,n_kv,D", [(14, 2, 64), (12, 2, 128), (28, 4, 128), (40, 8, 128), (8, 8, 64)])
@pytest.mark.parametrize("n_pos,kps", [(1, 64), (17, 64), (130, 64), (300, 64), (400, 64), (800, 128), (1000, 128),
                                       (2050, 64), (8200, 256), (17500, 576), (17500, 544), (33000, 1088)])
def test_attention_vs_numpy(lib, n_heads, n_kv, D, n_pos, kps):
    # ceil(n_pos / kps) + 1 splits (one spare), so both builds of attention.cu run: a launch of at most one block an
    # SM takes the 8-warp build (on 132 SMs: up to (3800, 256) every layout, (2050, 64) and (8200, 256) at n_kv 2),
    # a larger one the 4-warp build ((2050, 64) and (8200, 256) at n_kv 4 and 8: 136 / 272 blocks; the 17,500 and
    # 33,000-key cases at n_kv 8, (17500, 544) at n_kv 4). The entry point bounds the keys as a session's graphs do,
    # so the 8-warp build runs in clusters of C, the largest power of two <= 8 dividing the split count (sm_90): up to
    # 8 x attn_cluster_keys_per_block(D) keys (3,072 at D 128, 6,144 at D 64), where C x
    # attn_cluster_keys_per_block(D) >= n_pos, merging in distributed shared memory: (17, 64) 2 splits, one used (no
    # merge); (130, 64) 4 splits, a cluster of 4 whose last block has no keys; (300, 64) 6 splits, a cluster of 2;
    # (400, 64) and (800, 128) 8 splits, a cluster of 8 with 7 used; (1000, 128) 9 splits (no cluster), (2050, 64)
    # and (8200, 256) 34, (17500, 576) 32 (31 used), (17500, 544) 34 (33 used), (33000, 1088) 32 (31 used): plain
    # launches whose partials (poisoned before) attn_merge_kernel merges, a block a query head.
    rng = np.random.default_rng()
    q = (rng.standard_normal(n_heads * D) * 2).astype(np.float32)
    k = rng.standard_normal((n_pos, n_kv, D)).astype(np.float32)
    v = rng.standard_normal((n_pos, n_kv, D)).astype(np.float32)
    out = np.empty(n_heads * D, dtype=np.float32)
    _check(lib, lib.nq_test_attention(_f32p(q), _f32p(np.ascontiguousarray(k)), _f32p(np.ascontiguousarray(v)),
                                      n_heads, n_kv, D, n_pos, kps, _f32p(out)))
    assert np.isfinite(out).all()
    err = rel_err(out, attention_ref(q, k, v, n_heads, n_kv, D))
    # f16 K/V (in the reference too), f32 scores/softmax, output rounded to f16 (2^-12); with several splits each
    # split's partial O / l is stored in f16 too (2^-12 relative each; the merge takes a convex combination of them)
    assert err < 2e-3, f"relative error {err:.2e}"


# The batched decode step's attention kernel (attn_decode_kernel: tensor cores, one page of keys a tile): sequences of
# mixed lengths in one pool, the rows past each position NaN-poisoned, every split count the step may choose.
@pytest.mark.parametrize("n_heads,n_kv,D", [(14, 2, 64), (12, 2, 128), (28, 4, 128), (40, 8, 128), (8, 8, 64)])
@pytest.mark.parametrize("lens,n_split", [([1, 2, 16, 17, 33], 1), ([300, 1, 577, 64], 3), ([1000, 15, 2050], 16),
                                          ([577] * 32, 3), ([129, 4096], 128)])
def test_attention_batch_vs_numpy(lib, n_heads, n_kv, D, lens, n_split):
    rng = np.random.default_rng()
    R, P = len(lens), max(lens)
    q = (rng.standard_normal((R, n_heads * D)) * 2).astype(np.float32)
    k = rng.standard_normal((R, P, n_kv, D)).astype(np.float32)
    v = rng.standard_normal((R, P, n_kv, D)).astype(np.float32)
    n_pos = np.array(lens, dtype=np.int32)
    out = np.empty((R, n_heads * D), dtype=np.float32)
    _check(lib, lib.nq_test_attention_batch(_f32p(q), _f32p(k), _f32p(v), n_pos.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
                                            R, P, n_heads, n_kv, D, n_split, _f32p(out)))
    assert np.isfinite(out).all()
    for r, n in enumerate(lens):
        err = rel_err(out[r], attention_ref(q[r], k[r, :n], v[r, :n], n_heads, n_kv, D))
        # as the prefill kernel's test: f16 K/V (in the reference too); the tensor cores take q and P in f16 (2^-12
        # relative each: ~5e-4 relative on the output), f32 accumulation and softmax, split partials O / l and the
        # output rounded to f16: 2e-3
        assert err < 2e-3, f"sequence {r} ({n} keys): relative error {err:.2e}"


def attention_prefill_ref(q, k, v, n_heads, n_kv, D):
    """q (M, n_heads*D) for the last M of the n_pos positions, k/v (n_pos, n_kv, D) -> (M, n_heads*D), causal,
    float64, K/V rounded to f16 like the cache."""
    M, n_pos = q.shape[0], k.shape[0]
    return np.stack([attention_ref(q[t], k[:n_pos - M + t + 1], v[:n_pos - M + t + 1], n_heads, n_kv, D)
                     for t in range(M)])


@pytest.mark.parametrize("n_heads,n_kv,D", [(14, 2, 64), (12, 2, 128), (28, 4, 128), (40, 8, 128), (8, 8, 64),
                                            (16, 2, 128)])
@pytest.mark.parametrize("n_pos,M", [(2, 2), (17, 17), (45, 13), (300, 64), (700, 100), (600, 512), (1100, 700),
                                     (2100, 100), (2600, 512)])
def test_attention_prefill_vs_numpy(lib, n_heads, n_kv, D, n_pos, M):
    # M query tokens at positions n_pos-M .. n_pos-1 (a later prefill chunk when n_pos > M): blocks of (token, head)
    # rows, partial last block, pad rows, a partial last key tile, G = 1..8 heads per KV head. Two builds by
    # n_pos (attention.cu, kPrefillLongKeys 2048): below, 64-row blocks with 64-key tiles, no key split; from 2048,
    # 128-row blocks with 32-key tiles and the keys split over a cluster of 2 where the grid is under one block per
    # SM ((2100, 100): every head layout; (2600, 512): all but (40, 8), whose 168 row blocks exceed 132 SMs)
    rng = np.random.default_rng()
    q = (rng.standard_normal((M, n_heads * D)) * 2).astype(np.float32)
    k = rng.standard_normal((n_pos, n_kv, D)).astype(np.float32)
    v = rng.standard_normal((n_pos, n_kv, D)).astype(np.float32)
    out = np.empty((M, n_heads * D), dtype=np.float32)
    _check(lib, lib.nq_test_attention_prefill(_f32p(q), _f32p(k), _f32p(v), n_heads, n_kv, D, n_pos, M, 1,
                                              _f32p(out)))
    assert np.isfinite(out).all()  # the output was poisoned with NaN: every element written
    err = rel_err(out, attention_prefill_ref(q, k, v, n_heads, n_kv, D))
    # f16 K/V (in the reference too); the tensor cores also take q and the probabilities P in f16 (2^-12 relative
    # each: ~1e-3 absolute on scores of a few units in the log2 domain -> ~5e-4 relative on the output), f32
    # accumulation and softmax, output rounded to f16 (2^-12): ~1e-3 in all, under the 2e-3 of the decode kernel
    assert err < 2e-3, f"relative error {err:.2e}"


@pytest.mark.parametrize("n_heads,n_kv,D", [(14, 2, 64), (28, 4, 128), (40, 8, 128)])
@pytest.mark.parametrize("n_pos,M,n_split", [(2, 2, 64), (45, 13, 4), (700, 5, 12), (2005, 16, 4), (2005, 5, 25),
                                             (300, 3, 128)])
def test_attention_prefill_split_vs_numpy(lib, n_heads, n_kv, D, n_pos, M, n_split):
    """A few prompt tokens with the keys split (the decode kernel, session_prefill's path up to
    kSplitPrefillMaxTokens tokens): each token t attends to its own n_pos - M + t + 1 keys, the splits' partials
    (poisoned before) merged by the merge kernel, a block for each (token, query head). Splits past the used ones
    (n_pos 2, 300) return at once."""
    rng = np.random.default_rng()
    q = (rng.standard_normal((M, n_heads * D)) * 2).astype(np.float32)
    k = rng.standard_normal((n_pos, n_kv, D)).astype(np.float32)
    v = rng.standard_normal((n_pos, n_kv, D)).astype(np.float32)
    out = np.empty((M, n_heads * D), dtype=np.float32)
    _check(lib, lib.nq_test_attention_prefill(_f32p(q), _f32p(k), _f32p(v), n_heads, n_kv, D, n_pos, M, n_split,
                                              _f32p(out)))
    assert np.isfinite(out).all()  # the output was poisoned with NaN: every element written
    err = rel_err(out, attention_prefill_ref(q, k, v, n_heads, n_kv, D))
    # the decode kernel's arithmetic (f16 K/V, f32 q, scores, softmax and merge; output rounded to f16): the decode
    # test's 2e-3
    assert err < 2e-3, f"relative error {err:.2e}"


def _sample(lib, logits, temperature, top_k, top_p, seed, counter):
    from nanoqwen_rt.backends.cuda.abi import NqSampling
    sp = NqSampling(temperature, top_k, top_p, seed)
    out = ctypes.c_int32(-1)
    logits = np.ascontiguousarray(logits, dtype=np.float32)
    _check(lib, lib.nq_test_sample(_f32p(logits), logits.shape[0], ctypes.byref(sp), counter, ctypes.byref(out)))
    return out.value


def test_sampler_greedy_is_argmax_lowest_index(lib):
    rng = np.random.default_rng()
    for V in (7, 1000, QWEN25_SHAPES["7B"].vocab):
        x = rng.standard_normal(V).astype(np.float32)
        assert _sample(lib, x, 0.0, 0, 1.0, 0, 0) == int(np.argmax(x))
        i, j = sorted(rng.choice(V, 2, replace=False))
        x[i] = x[j] = x.max() + 1.0                     # a tie: the lower index wins
        assert _sample(lib, x, 0.0, 0, 1.0, 0, 0) == i
    # the kernel reads 16-byte groups of 4 logits where V % 4 == 0 and a scalar tail otherwise: ties inside one group,
    # in neighbouring groups and in the tail, and NaNs (which never win)
    for V in (1000, 1001, 1003):
        for i, j in ((4, 6), (5, 9), (V - 3, V - 1), (0, V - 1)):
            x = rng.standard_normal(V).astype(np.float32)
            x[rng.choice(V, 5, replace=False)] = np.nan
            x[i] = x[j] = np.nanmax(x) + 1.0
            x[j - 1] = np.nan if j - 1 != i else x[j - 1]
            assert _sample(lib, x, 0.0, 0, 1.0, 0, 0) == i, (V, i, j)


def test_sampler_edge_rows(lib):
    """Rows with no number (token 0), a tie between the row's ends (the lower index), and an all-negative row, where
    the maximum offsets the draw's exponentials (a wrong one overflows them: a tiny top_p or top_k 1 must still keep
    the argmax alone)."""
    rng = np.random.default_rng()
    V = QWEN25_SHAPES["7B"].vocab
    for bad in (np.nan, -np.inf):
        assert _sample(lib, np.full(V, bad, dtype=np.float32), 0.0, 0, 1.0, 0, 0) == 0
    x = rng.standard_normal(V).astype(np.float32)
    x[3] = x[V - 2] = x.max() + 1.0
    assert _sample(lib, x, 0.0, 0, 1.0, 0, 0) == 3
    x = (-np.abs(rng.standard_normal(V)) * 4 - 60.0).astype(np.float32)   # every logit negative, far from 0
    top = int(np.argmax(x))
    # a unique maximum: f32's spacing at 60 (2^-18) puts two of the 152,064 draws into the top value ~6 % of the time,
    # and a draw at temperature 1 may then take either (equal probabilities); only greedy promises the lower index
    x[top] += np.float32(1e-3)
    assert _sample(lib, x, 0.0, 0, 1.0, 0, 0) == top
    for c in range(4):
        assert _sample(lib, x, 1.0, 1, 1.0, 5, c) == top
        assert _sample(lib, x, 0.3, 0, 1e-6, 5, c) == top


def test_sampler_filters(lib):
    rng = np.random.default_rng()
    V = QWEN25_SHAPES["7B"].vocab
    x = (rng.standard_normal(V) * 2).astype(np.float32)
    top5 = set(np.argsort(-x)[:5].tolist())
    for c in range(20):
        assert _sample(lib, x, 1.0, 1, 1.0, 3, c) == int(np.argmax(x))      # top_k 1 = greedy
        assert _sample(lib, x, 0.7, 5, 1.0, 3, c) in top5
        assert _sample(lib, x, 1.0, 0, 1e-6, 3, c) == int(np.argmax(x))     # tiny top_p keeps one token


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 4, 1.0), (1.3, 0, 0.8), (1.0, 6, 0.9)])
def test_sampler_distribution(lib, temperature, top_k, top_p):
    from nanoqwen_rt.sampling import SamplingParams, sample_reference
    rng = np.random.default_rng()
    x = rng.standard_normal(10).astype(np.float32)
    ref = sample_reference(x, SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p))
    n = 4000
    counts = np.bincount([_sample(lib, x, temperature, top_k, top_p, 11, c) for c in range(n)], minlength=10)
    assert counts[ref == 0].sum() == 0, "sampled a filtered-out token"
    # multinomial: each frequency within 5 standard deviations (+ 1e-3) of its probability
    sd = np.sqrt(ref * (1 - ref) / n)
    assert np.all(np.abs(counts / n - ref) <= 5 * sd + 1e-3), (counts / n, ref)
