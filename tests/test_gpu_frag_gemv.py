"""The decode GEMV over INT4 weights in the fragment order (csrc/src/gemv_frag.cuh) vs float64 numpy references,
through libnanoqwen_testing's fragment-order twins of the GEMV entries (nq_test_gemv_int4_frag,
nq_test_gemv_int4_mode_frag, nq_test_gemv_int4_multi_frag): each takes layout-1 weights as the file stores them,
repacks them on the device as the loader does on Hopper (SWIGLU: gate and up as the interleaved pair) and runs the
product's gemv(). GPU only, and Hopper only: the order's kernels need sm_90 (thread-block clusters) and the library
refuses it elsewhere (test_refused_where_the_order_is_unavailable runs there; the rest skip).

Every call draws fresh random inputs; the entries poison their outputs (NaN), so an unwritten element fails the
finiteness check. Shapes: the embedded tiny-py model (hidden 256, intermediate 768, q/k/v 256/128/128), Qwen2.5-7B
(hidden 3584, intermediate 18944, q 3584, k/v 512), K = 128 (one 128-k chunk: three of a block's four warps idle),
groups 32/64/128/256 wherever K allows. On an H200 (132 SMs, gemv_frag.cuh frag_plan) they take every launch shape:
no cluster (7B gate/up at groups >= 64 and gate-sized STORE, K = 128), clusters of 2 and 4 (tiny, 0.5B and 1.5B
gate/up), 4 (7B q, o, q/k/v; 7B down with 8-warp blocks; 14B q/k/v and down split past 2 blocks an SM, 4-warp
blocks, 10 and 27 chunks a split), 8 (3B down: 4-warp blocks where 8 warps would hold 1-2 chunks), 16 (7B k/v: 8
tiles; a gate/up pair of 2 tiles), 2 (gate/up tiles past one wave: the 32B's 864 at K = 1024), uneven splits (7
chunks over 2 blocks, 28 over 16, 148 over 4, 86 over 8), warps without a chunk (K = 128, and 1-2 chunks a split
over 4 warps), and gate/up's 5-warp blocks at groups >= 64 (14B-gate, 8 chunks a warp; 3B-gate stays at 4 warps,
4 chunks each).
"""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from nq_testing_lib import check as _check, fragment_order_available, require_fragment_order
from test_gpu_kernels import (GEMV_F16_REL, GEMV_F16_WORST, _f32p, _u16p, _u32p, dequant, pack_fast, random_int4,
                              rel_err)

pytestmark = pytest.mark.gpu

NQ_E_UNSUPPORTED = -4
GROUPS = [32, 64, 128, 256]
# The accuracy bounds are test_gpu_kernels' for gemv_int4 (GEMV_F16_WORST: x rounded to f16 plus f16 partial sums of
# 16 products, gamma_9 ~ 9u of sum |w x|; GEMV_F16_REL: the typical relative error), and hold here with margin: the
# staged x is the same f16 (the RMSNorm prologue rounds as gemv_int4's; the tensor-core builds' x / 16 on the high
# pairs is exact above f16's subnormals) and the scale multiplies in f32. Groups 32 and 64 (CUDA cores) sum f16
# partials of 4 products (two steps of the pairs (2t, 2t + 1) and (2t + 8, 2t + 9)); groups 128 and 256 (tensor
# cores) sum exact products in f32 over a chunk, the codes' offsets (1032 x, 72 x) included and subtracted after:
# the subtraction costs ~2^-24 of 1032 sum |x| over 128 k, ~1e-5 of the result, far inside both bounds.
# SWIGLU: test_gpu_kernels' 8e-3 (two GEMV results, each within GEMV_F16_REL, their relative errors add through silu,
# then the f16 rounding of the output, 2^-11).
SWIGLU_REL = 8e-3

STORE_SHAPES = [("tiny-q", 256, 256), ("tiny-gate", 768, 256), ("tiny-down", 256, 768), ("k128", 256, 128),
                ("7B-q", 3584, 3584), ("7B-k", 512, 3584), ("7B-qkv", 4608, 3584), ("7B-gate", 18944, 3584),
                ("7B-down", 3584, 18944)]
# The 4-warp ADD builds of groups >= 128 keep 2 chunks a warp in flight (frag_depth): 7B-o's warps have at most 2
# chunks (both issued before the wait, no refill); 14B-o (4 splits: 2 or 3 chunks a warp) and five-a-warp (128 tiles,
# 2 splits: 5 a warp) refill the ring's slots and end on an odd chunk
ADD_SHAPES = [("tiny-o", 256, 256), ("tiny-down", 256, 768), ("k128", 256, 128), ("7B-o", 3584, 3584),
              ("7B-down", 3584, 18944), ("14B-o", 5120, 5120), ("five-a-warp", 8192, 5120),
              ("14B-down", 5120, 13824), ("3B-down", 2048, 11008)]
# frag_stage_x's RMSNorm paths: 7B-gate and 3B-gate take the whole-of-x pass (S = 1, K / 4 <= 8 float4s a thread; at
# group 32 the 7B's 592 tiles are past one wave and split in 2), and so does 14B-gate at groups >= 64 (5 warps: K / 4 =
# 1,280 = 8 x 160 threads), at group 32 (4 warps) the general one; 0.5B-gate, one-pair-tile, 1.5B-gate (groups >= 64:
# 280 tiles in 2 splits within one wave, 12 chunks as 2, 2, 1, 1 a warp; group 32: one block a tile, its 560 halves
# would pass 528 slots) and past-one-wave the one-unit-a-thread pass (S > 1)
SWIGLU_SHAPES = [("tiny-gate", 768, 256), ("k128", 256, 128), ("one-pair-tile", 64, 2048), ("0.5B-gate", 4864, 896),
                 ("1.5B-gate", 8960, 1536), ("3B-gate", 11008, 2048), ("7B-gate", 18944, 3584),
                 ("14B-gate", 13824, 5120), ("past-one-wave", 27648, 1024)]
QKV_SHAPES = [("tiny-qkv", (256, 128, 128), 256), ("7B-qkv", (3584, 512, 512), 3584),
              ("14B-qkv", (5120, 1024, 1024), 5120)]


@pytest.fixture(scope="module")
def lib():
    from nq_testing_lib import load_testing_library
    return load_testing_library()


def gemv_frag(lib, q, s, N, K, g, x, norm_w=None, eps=1e-6):
    """nq_test_gemv_int4_frag: (rc, y f32 (N))."""
    y = np.empty(N, dtype=np.float32)
    rc = lib.nq_test_gemv_int4_frag(_u32p(q), _u16p(s), N, K, g, _f32p(x), None if norm_w is None else _f32p(norm_w),
                                    eps, _f32p(y))
    return rc, y


@pytest.fixture(scope="module")
def order_available(lib):
    """Whether the library runs the fragment order here (nq_testing_lib.fragment_order_available)."""
    return fragment_order_available(lib)


@pytest.fixture(scope="module")
def frag(lib):
    require_fragment_order(lib)
    return lib


def rmsnorm_ref(x, w_norm, eps):
    x = x.astype(np.float64)
    return x / np.sqrt(np.mean(x ** 2) + eps) * w_norm


def _inputs(rng, K):
    x = rng.standard_normal(K).astype(np.float32) * 3.0
    w_norm = (1.0 + 0.3 * rng.standard_normal(K)).astype(np.float32)
    return x, w_norm


def _check_rows(y, r, bound, what, slack=None):
    """test_gemv_int4_vs_numpy's two checks: the per-row bound (slack: extra absolute error allowed per row) and the
    relative error over the rows."""
    assert np.isfinite(y).all(), f"{what}: unwritten (NaN-poisoned) outputs"
    d = np.abs(y.astype(np.float64) - r)
    if slack is not None:
        d = np.maximum(d - slack, 0.0)
    worst = float(np.max(d / bound))
    assert worst < GEMV_F16_WORST, f"{what}: error {worst:.2e} of sum |w x|"
    if len(y) >= 16:
        err = rel_err(y, r)
        assert err < GEMV_F16_REL, f"{what}: relative error {err:.2e}"


@pytest.mark.parametrize("g", GROUPS)
@pytest.mark.parametrize("name,N,K", STORE_SHAPES, ids=[s[0] for s in STORE_SHAPES])
def test_store_vs_numpy(frag, name, N, K, g):
    """y = W x' with x' = rmsnorm(x) * norm_w (the fused prologue) and with x' = x (f32 x rounded to f16)."""
    if K % g:
        pytest.skip(f"K={K} is not a multiple of the group {g}")
    rng = np.random.default_rng()
    u, q, s = random_int4(rng, N, K, g)
    x, w_norm = _inputs(rng, K)
    eps = 1e-6
    w = dequant(u, s, g)
    for with_norm in (True, False):
        rc, y = gemv_frag(frag, q, s, N, K, g, x, w_norm if with_norm else None, eps)
        _check(frag, rc)
        xin = rmsnorm_ref(x, w_norm, eps) if with_norm else x.astype(np.float64)
        _check_rows(y, w @ xin, np.abs(w) @ np.abs(xin), f"{name} g{g} norm {with_norm}")


@pytest.mark.parametrize("g", GROUPS)
@pytest.mark.parametrize("name,N,K", ADD_SHAPES, ids=[s[0] for s in ADD_SHAPES])
def test_add_vs_numpy(frag, name, N, K, g):
    """y += W f16(x) onto a random residual y (the o/down projections)."""
    if K % g:
        pytest.skip(f"K={K} is not a multiple of the group {g}")
    rng = np.random.default_rng()
    u, q, s = random_int4(rng, N, K, g)
    x = rng.standard_normal(K).astype(np.float32) * 2.0
    x16 = x.astype(np.float16).astype(np.float64)
    w = dequant(u, s, g)
    prod = w @ x16
    y0 = (rng.standard_normal(N) * np.std(prod)).astype(np.float32)   # residual of the same magnitude
    y = y0.copy()
    _check(frag, frag.nq_test_gemv_int4_mode_frag(_u32p(q), _u16p(s), None, None, N, K, g, _f32p(x), None, 1e-6, 1,
                                                  _f32p(y)))
    # the kernel's own error (as STORE's) plus the f32 rounding of y0 + (W x): 2^-24 |y| (slack)
    _check_rows(y.astype(np.float64) - y0, prod, np.abs(w) @ np.abs(x16), f"{name} g{g}",
                slack=np.abs(y.astype(np.float64)) * 2.0 ** -24)


@pytest.mark.parametrize("g", GROUPS)
@pytest.mark.parametrize("name,N,K", SWIGLU_SHAPES, ids=[s[0] for s in SWIGLU_SHAPES])
def test_swiglu_vs_numpy(frag, name, N, K, g):
    """h = silu(Wg x') * (Wu x') in f16, gate and up as the pair; x' = rmsnorm(x) * norm_w, and x' = x."""
    if K % g:
        pytest.skip(f"K={K} is not a multiple of the group {g}")
    rng = np.random.default_rng()
    ug, qg, sg = random_int4(rng, N, K, g)
    uu, qu, su = random_int4(rng, N, K, g)
    x, w_norm = _inputs(rng, K)
    eps = 1e-6
    wg, wu = dequant(ug, sg, g), dequant(uu, su, g)
    for with_norm in (True, False):
        xin = rmsnorm_ref(x, w_norm, eps) if with_norm else x.astype(np.float64)
        gate, up = wg @ xin, wu @ xin
        ref = gate / (1.0 + np.exp(-gate)) * up
        y = np.empty(N, dtype=np.float32)
        _check(frag, frag.nq_test_gemv_int4_mode_frag(_u32p(qg), _u16p(sg), _u32p(qu), _u16p(su), N, K, g, _f32p(x),
                                                      _f32p(w_norm) if with_norm else None, eps, 2, _f32p(y)))
        assert np.isfinite(y).all(), f"{name} g{g} norm {with_norm}: unwritten (NaN-poisoned) outputs"
        err = rel_err(y, ref)
        assert err < SWIGLU_REL, f"{name} g{g} norm {with_norm}: relative error {err:.2e}"


def run_multi(lib, segs, K, g, x, norm_w, eps, bias):
    """nq_test_gemv_int4_multi_frag: segs [(q, s)], bias [f32 (N) or None] -> (rc, y of the segments concatenated)."""
    n = len(segs)
    qs = [np.ascontiguousarray(q) for q, _ in segs]
    ss = [np.ascontiguousarray(s.view(np.uint16)) for _, s in segs]
    _F32P, _U32P, _U16P = (ctypes.POINTER(t) for t in (ctypes.c_float, ctypes.c_uint32, ctypes.c_uint16))
    qp = (_U32P * n)(*[q.ctypes.data_as(_U32P) for q in qs])
    sp = (_U16P * n)(*[s.ctypes.data_as(_U16P) for s in ss])
    Ns = (ctypes.c_int32 * n)(*[q.shape[0] for q in qs])
    bs = [None if b is None else np.ascontiguousarray(b, dtype=np.float32) for b in bias]
    bp = (_F32P * n)(*[ctypes.cast(None, _F32P) if b is None else b.ctypes.data_as(_F32P) for b in bs])
    y = np.empty(sum(q.shape[0] for q in qs), dtype=np.float32)
    rc = lib.nq_test_gemv_int4_multi_frag(n, qp, sp, Ns, K, g, _f32p(x), None if norm_w is None else _f32p(norm_w),
                                          eps, bp, _f32p(y))
    return rc, y


@pytest.mark.parametrize("g", GROUPS)
@pytest.mark.parametrize("name,Ns,K", QKV_SHAPES, ids=[s[0] for s in QKV_SHAPES])
def test_qkv_segments_vs_numpy(frag, name, Ns, K, g):
    """q/k/v as three segments of one STORE launch sharing x (RMSNorm on and off), each with its bias; and with k's
    bias absent (a null bias among set ones)."""
    if K % g:
        pytest.skip(f"K={K} is not a multiple of the group {g}")
    rng = np.random.default_rng()
    segs, ws = [], []
    for N in Ns:
        u, q, s = random_int4(rng, N, K, g)
        segs.append((q, s))
        ws.append(dequant(u, s, g))
    x, w_norm = _inputs(rng, K)
    eps = 1e-6
    for with_norm, drop in ((True, None), (False, None), (True, 1)):
        xin = rmsnorm_ref(x, w_norm, eps) if with_norm else x.astype(np.float64)
        bias = [None if i == drop else rng.standard_normal(N).astype(np.float32) for i, N in enumerate(Ns)]
        rc, y = run_multi(frag, segs, K, g, x, w_norm if with_norm else None, eps, bias)
        _check(frag, rc)
        r = np.concatenate([w @ xin + (0.0 if b is None else b.astype(np.float64)) for w, b in zip(ws, bias)])
        bound = np.concatenate([np.abs(w) @ np.abs(xin) for w in ws])
        # the bias is added in f32 after the sums: 2^-24 of |y| more
        _check_rows(y, r, bound, f"{name} g{g} norm {with_norm} bias-dropped {drop}",
                    slack=np.abs(y.astype(np.float64)) * 2.0 ** -24)


def test_results_are_deterministic(frag):
    """Each output's partial sums are added in a fixed order (warps in warp order, the cluster's splits in split
    order): two runs on the same inputs give identical bits, for clusters of 4 (7B q/k/v; 7B down with 8-warp blocks),
    16 (7B k) and none (7B gate/up)."""
    rng = np.random.default_rng()
    K, g = 3584, 128
    segs = [random_int4(rng, N, K, g)[1:] for N in (3584, 512, 512)]
    x, w_norm = _inputs(rng, K)
    bias = [rng.standard_normal(N).astype(np.float32) for N in (3584, 512, 512)]
    runs = [run_multi(frag, segs, K, g, x, w_norm, 1e-6, bias) for _ in range(2)]
    for rc, _ in runs:
        _check(frag, rc)
    assert np.array_equal(runs[0][1], runs[1][1]), "q/k/v: two runs differ"
    q, s = segs[1]
    ys = [gemv_frag(frag, q, s, 512, K, g, x, w_norm) for _ in range(2)]
    assert ys[0][0] == 0 and ys[1][0] == 0 and np.array_equal(ys[0][1], ys[1][1]), "k: two runs differ"
    _, q, s = random_int4(rng, 3584, 18944, g)
    x = rng.standard_normal(18944).astype(np.float32)
    y0 = rng.standard_normal(3584).astype(np.float32)
    outs = []
    for _ in range(2):
        y = y0.copy()
        _check(frag, frag.nq_test_gemv_int4_mode_frag(_u32p(q), _u16p(s), None, None, 3584, 18944, g, _f32p(x), None,
                                                      1e-6, 1, _f32p(y)))
        outs.append(y)
    assert np.array_equal(outs[0], outs[1]), "down (add): two runs differ"
    _, qg, sg = random_int4(rng, 18944, K, g)
    _, qu, su = random_int4(rng, 18944, K, g)
    x = rng.standard_normal(K).astype(np.float32)
    hs = []
    for _ in range(2):
        h = np.empty(18944, dtype=np.float32)
        _check(frag, frag.nq_test_gemv_int4_mode_frag(_u32p(qg), _u16p(sg), _u32p(qu), _u16p(su), 18944, K, g,
                                                      _f32p(x), _f32p(w_norm), 1e-6, 2, _f32p(h)))
        hs.append(h)
    assert np.array_equal(hs[0], hs[1]), "gate/up (swiglu): two runs differ"


@pytest.mark.parametrize("g", [64, 128])
def test_large_activations_stay_finite(frag, g):
    """test_gemv_int4_large_activations_stay_finite's input (4 channels at |x| = 6,000 in 4 different 32-k units,
    |u - 8| = 8 there) through the fragment order; STORE (a cluster of 16: 8 tiles) and ADD. Group 64 (CUDA cores): a
    product (u - 8) x is finite to |x| = 8,190, and an f16 partial holds 4 products of one 32-k unit (k 2t, 2t + 8 of
    two steps), so at most one large one. Group 128 (tensor cores): f32 sums of (1024 + u) x and (1024 + 16 u) x / 16,
    ~6.2e6 here, whose subtracted offsets leave ~1e-5 of the result."""
    rng = np.random.default_rng()
    N, K = 512, 3584
    u, _, s = random_int4(rng, N, K, g)
    ch = rng.choice(K // 32, size=4, replace=False) * 32 + rng.integers(0, 32, size=4)
    u[:, ch] = 0                                                              # u - 8 = -8 there
    q = pack_fast(u)
    x = rng.standard_normal(K).astype(np.float32)
    x[ch] = rng.choice([-6000.0, 6000.0], size=4)
    ref = dequant(u, s, g) @ x.astype(np.float16).astype(np.float64)
    rc, y = gemv_frag(frag, q, s, N, K, g, x)
    _check(frag, rc)
    assert np.isfinite(y).all(), "store: inf/NaN outputs"
    assert rel_err(y, ref) < GEMV_F16_REL, f"store: relative error {rel_err(y, ref):.2e}"
    y = np.zeros(N, dtype=np.float32)
    _check(frag, frag.nq_test_gemv_int4_mode_frag(_u32p(q), _u16p(s), None, None, N, K, g, _f32p(x), None, 1e-6, 1,
                                                  _f32p(y)))
    assert np.isfinite(y).all(), "add: inf/NaN outputs"
    assert rel_err(y, ref) < GEMV_F16_REL, f"add: relative error {rel_err(y, ref):.2e}"


def test_shape_without_fragment_order_refused(lib):
    """A shape the order does not cover (N % 64 != 0) is refused with NQ_E_UNSUPPORTED and a message, on any GPU, and
    the library keeps working (no sticky device error): the next file-order GEMV runs."""
    rng = np.random.default_rng()
    N, K, g = 96, 256, 64
    u, q, s = random_int4(rng, N, K, g)
    x = rng.standard_normal(K).astype(np.float32)
    rc, _ = gemv_frag(lib, q, s, N, K, g, x)
    assert rc == NQ_E_UNSUPPORTED, rc
    assert "fragment order" in lib.nq_last_error().decode()
    y = np.empty(N, dtype=np.float32)
    _check(lib, lib.nq_test_gemv_int4(_u32p(q), _u16p(s), None, N, K, g, _f32p(x), None, 1e-6, _f32p(y)))
    assert rel_err(y, dequant(u, s, g) @ x.astype(np.float16).astype(np.float64)) < GEMV_F16_REL


def test_refused_where_the_order_is_unavailable(lib, order_available):
    """Off Hopper (or without sm_90a code) gemv() refuses fragment-order weights with NQ_E_UNSUPPORTED and one line
    (the kernels there would trap), in every mode, and the library keeps working afterwards."""
    if order_available:
        pytest.skip("the fragment order runs on this GPU: nothing to refuse")
    rng = np.random.default_rng()
    N, K, g = 128, 256, 64
    u, q, s = random_int4(rng, N, K, g)
    _, qu, su = random_int4(rng, N, K, g)
    x = rng.standard_normal(K).astype(np.float32)
    y = np.zeros(N, dtype=np.float32)
    for rc in (gemv_frag(lib, q, s, N, K, g, x)[0],
               lib.nq_test_gemv_int4_mode_frag(_u32p(q), _u16p(s), None, None, N, K, g, _f32p(x), None, 1e-6, 1,
                                               _f32p(y)),
               lib.nq_test_gemv_int4_mode_frag(_u32p(q), _u16p(s), _u32p(qu), _u16p(su), N, K, g, _f32p(x), None,
                                               1e-6, 2, _f32p(y)),
               run_multi(lib, [(q, s), (qu, su)], K, g, x, None, 1e-6, [None, None])[0]):
        assert rc == NQ_E_UNSUPPORTED, rc
        assert "need a Hopper GPU" in lib.nq_last_error().decode()
    _check(lib, lib.nq_test_gemv_int4(_u32p(q), _u16p(s), None, N, K, g, _f32p(x), None, 1e-6, _f32p(y)))
    assert rel_err(y, dequant(u, s, g) @ x.astype(np.float16).astype(np.float64)) < GEMV_F16_REL


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_bench_entry_runs(frag, mode):
    """nq_bench_gemv_int4_frag (the timing twin of nq_bench_gemv_int4_mode) runs each mode: a positive time."""
    us = ctypes.c_float(0.0)
    _check(frag, frag.nq_bench_gemv_int4_frag(512, 3584, 128, mode, 3, ctypes.byref(us)))
    assert 0.0 < us.value < 1e6, us.value
