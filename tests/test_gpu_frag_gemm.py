"""The few-token INT4 GEMM over weights in the fragment order (gemm_int4_frag, csrc/src/gemm_frag.cuh; dispatch in
csrc/src/gemm.cu) vs float64 numpy references, through libnanoqwen_testing's nq_test_gemm_int4_multi_frag and
nq_test_gemm_swiglu_frag (file-order weights repacked on the device as the loader does on Hopper, then the product's
gemm_multi / gemm_swiglu). GPU only; skips where the library does not use the fragment order (not Hopper, or no
sm_90a build).

Below 128 tokens gemm_multi / gemm_swiglu run gemm_int4_frag: 1-64 tokens a launch with 1 / 2 / 4 m16-tiles (M <= 16 /
32 / 64), more in 64-token pieces (M 65, 100, 127: a full piece and a short one), split-K over a thread-block cluster
(S = the largest power of two <= 2 SMs / column blocks, <= 16, <= K / 128, doubled while the staged A would keep two
blocks off an SM; with 132 SMs: 7B q/k/v S 8, o and down S 16, gate/up S 1 at <= 16 tokens and 2 / 4 above; the 0.5B
and tiny shapes S 2-4). The cases cover the segment walk (q/k/v as 3 segments with their biases; segments whose last
column block has idle warps), the residual add (o, down), row strides wider than the data (A's extra columns NaN, C's
unowned columns kept), every group size (32 / 64 / 128 / 256) and the SwiGLU epilogue over the gate/up pair. 128 and
512 tokens (the FRAG wgmma builds) are tests/test_gpu_frag_prefill.py's.
"""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from nq_testing_lib import require_fragment_order
from test_gpu_gemm import SWIGLU_PATHS_REL, SWIGLU_TOL_REL, _silu_mul, make_case
from test_gpu_gemm import check as check_gemm
from test_gpu_kernels import dequant, random_int4, rel_err

pytestmark = pytest.mark.gpu

_F32P, _U32P, _U16P = (ctypes.POINTER(t) for t in (ctypes.c_float, ctypes.c_uint32, ctypes.c_uint16))


@pytest.fixture(scope="module")
def lib():
    from nq_testing_lib import load_testing_library
    lib = load_testing_library()
    require_fragment_order(lib)
    return lib


def run_gemm_frag(lib, segs, A, K, g, lda, bias, C, ldc, add):
    """test_gpu_gemm.run_gemm through nq_test_gemm_int4_multi_frag (layout 1: segs [(q, s[, None])])."""
    n = len(segs)
    qs = [np.ascontiguousarray(seg[0]) for seg in segs]
    ss = [np.ascontiguousarray(seg[1].view(np.uint16)) for seg in segs]
    assert all(len(seg) < 3 or seg[2] is None for seg in segs), "the fragment order takes layout 1 only"
    qp = (_U32P * n)(*[q.ctypes.data_as(_U32P) for q in qs])
    sp = (_U16P * n)(*[s.ctypes.data_as(_U16P) for s in ss])
    Ns = (ctypes.c_int32 * n)(*[q.shape[0] for q in qs])
    bs = [None if b is None else np.ascontiguousarray(b, dtype=np.float32) for b in bias]
    bp = (_F32P * n)(*[ctypes.cast(None, _F32P) if b is None else b.ctypes.data_as(_F32P) for b in bs])
    A = np.ascontiguousarray(A, dtype=np.float32)
    out = np.ascontiguousarray(C, dtype=np.float32).copy()
    rc = lib.nq_test_gemm_int4_multi_frag(n, qp, sp, Ns, K, g, A.ctypes.data_as(_F32P), A.shape[0], lda, bp,
                                          out.ctypes.data_as(_F32P), ldc, 1 if add else 0)
    return rc, out


M_ALL = [1, 2, 5, 16, 17, 32, 33, 64, 65, 100, 127]
M_FEW = [1, 17, 64, 100]   # the largest shapes (68 MB of weights a case): one M per build and the pieces

SHAPES = {  # name: ([N per segment], K, group, lda pad, ldc pad, bias, add)
    "qkv-7B": ([3584, 512, 512], 3584, 128, 0, 0, True, False),
    "qkv-0.5B": ([896, 128, 128], 896, 64, 8, 4, True, False),   # strides wider than the data
    "qkv-tiny": ([256, 128, 128], 256, 32, 0, 0, True, False),   # segments of 1-4 tiles: idle warps in each block
    "o-7B": ([3584], 3584, 64, 0, 0, False, True),
    "o-tiny": ([256], 256, 256, 0, 2, False, True),
    "down-tiny": ([256], 768, 32, 0, 0, False, True),
    "down-7B": ([3584], 18944, 256, 0, 0, False, True),          # 148 chunks: S 16, the longest staged A
}
GEMM_CASES = [(name, M) for name in SHAPES for M in (M_FEW if name == "down-7B" else M_ALL)]


@pytest.mark.parametrize("name,M", GEMM_CASES, ids=[f"{n}-M{m}" for n, m in GEMM_CASES])
def test_gemm_frag_vs_numpy(lib, name, M):
    Ns, K, g, lda_pad, ldc_pad, with_bias, add = SHAPES[name]
    rng = np.random.default_rng()
    segs, A, lda, bias, C, ldc, ref, owned = make_case(rng, M, Ns, K, g, lda_pad, ldc_pad, with_bias, add)
    rc, out = run_gemm_frag(lib, segs, A, K, g, lda, bias, C, ldc, add)
    assert rc == 0, lib.nq_last_error().decode()
    check_gemm(out, ref, C, owned, f"gemm_frag {name} M={M}")


@pytest.mark.parametrize("M", [5, 17, 100])
def test_gemm_frag_split_k_is_deterministic(lib, M):
    """The cluster split-K sums the splits' partials in split order (whichever block reduces): two runs of the 7B
    down projection (16 splits) with residual add give the same bits."""
    rng = np.random.default_rng()
    segs, A, lda, bias, C, ldc, ref, owned = make_case(rng, M, [3584], 18944, 128, 0, 0, False, True)
    outs = []
    for _ in range(2):
        rc, out = run_gemm_frag(lib, segs, A, 18944, 128, lda, bias, C, ldc, True)
        assert rc == 0, lib.nq_last_error().decode()
        outs.append(out)
    check_gemm(outs[0], ref, C, owned, "gemm_frag down")
    assert np.array_equal(outs[0], outs[1]), "two runs of the same GEMM differ"


def test_gemm_frag_rows_do_not_depend_on_m(lib):
    """A token's outputs do not depend on how many tokens share the launch: the weights are rounded alike at every M
    (f16(q s), no scale-on-the-sums build; NOTES Session 12 §3: a prefix-cache hit against its cold run), and a row's
    MMAs see the same k order whatever the m-tiles. 7B q/k/v (18 column blocks: 8 splits at 1, 2 and 4 m-tiles, the
    staged A within frag_splits' bound in each; a shape whose split count changes with the m-tiles, e.g. the gate/up
    pair, gets other f32 sums: not covered here), 13 tokens inside launches of 13, 30, 45 and 77 (a 64-token piece
    and a 13-token one): bit for bit."""
    rng = np.random.default_rng()
    Ns, K = [3584, 512, 512], 3584
    segs, A, lda, bias, C, ldc, ref, owned = make_case(rng, 77, Ns, K, 128, 0, 0, True, False)
    rows = {}
    for M in (13, 30, 45, 77):
        rc, out = run_gemm_frag(lib, segs, A[:M], K, 128, lda, bias, C[:M], ldc, False)
        assert rc == 0, lib.nq_last_error().decode()
        check_gemm(out, ref[:M], C[:M], owned, f"gemm_frag q/k/v M={M}")
        rows[M] = out
    for M in (30, 45):
        assert np.array_equal(rows[M][:13], rows[13]), f"the first 13 rows differ between M=13 and M={M}"
    # launch 77 = tokens 0-63 (4 m-tiles) + 64-76 (1 m-tile, the same build as M=13 on other rows)
    assert np.array_equal(rows[77][:45], rows[45][:45]), "tokens 0-44 differ between M=45 and the 64-token piece of 77"


# gemm_swiglu over the pair (both ORDER_FRAG_PAIR): below 128 tokens gemm_int4_frag with the SwiGLU epilogue. Bounds
# as test_gpu_gemm's (SWIGLU_TOL_REL: g and u each with the GEMM's error, the f16 store; SWIGLU_PATHS_REL: two paths
# over the same f16 weights differ by f32 summation order, then at most one f16 unit after the rounding).
SWIGLU_SHAPES = {  # name: (I, K, group)
    "gate-up-7B": (18944, 3584, 128),    # 148 column blocks
    "gate-up-0.5B": (4864, 896, 64),
    "gate-up-tiny": (768, 256, 32),
    "gate-up-192": (192, 512, 256),      # 6 pair tiles: the second block has 2 idle warps
}
SWIGLU_CASES = [(name, M) for name in SWIGLU_SHAPES for M in (M_FEW if name == "gate-up-7B" else M_ALL)]


def _swiglu(lib, entry, qg, sg, qu, su, I, K, g, A, M):
    H = np.full((M, I), 0x7E00, dtype=np.uint16)        # poison (f16 NaN) on the host side too
    arrays = [np.ascontiguousarray(a) for a in (qg, sg.view(np.uint16), qu, su.view(np.uint16))]
    gate = [arrays[0].ctypes.data_as(_U32P), arrays[1].ctypes.data_as(_U16P)]
    up = [arrays[2].ctypes.data_as(_U32P), arrays[3].ctypes.data_as(_U16P)]
    zeros = [None] if entry == "file" else []   # the file-order entry's zero points: layout 1
    args = gate + zeros + up + zeros
    args += [I, K, g, A.ctypes.data_as(_F32P), M]
    if entry == "file":
        rc = lib.nq_test_gemm_swiglu(*args, 0, H.ctypes.data_as(_U16P))
    else:
        rc = lib.nq_test_gemm_swiglu_frag(*args, H.ctypes.data_as(_U16P))
    assert rc == 0, lib.nq_last_error().decode()
    return H.view(np.float16).astype(np.float64)


@pytest.mark.parametrize("name,M", SWIGLU_CASES, ids=[f"{n}-M{m}" for n, m in SWIGLU_CASES])
def test_gemm_swiglu_frag_vs_numpy(lib, name, M):
    I, K, g = SWIGLU_SHAPES[name]
    rng = np.random.default_rng()
    ug, qg, sg = random_int4(rng, I, K, g)
    uu, qu, su = random_int4(rng, I, K, g)
    A = rng.standard_normal((M, K)).astype(np.float32)
    a16 = A.astype(np.float16).astype(np.float64)
    ref = _silu_mul(a16 @ dequant(ug, sg, g).T, a16 @ dequant(uu, su, g).T)
    h = _swiglu(lib, "frag", qg, sg, qu, su, I, K, g, A, M)
    assert np.isfinite(h).all(), f"{name} M={M}: unwritten (NaN) outputs"
    err = rel_err(h, ref)
    assert err < SWIGLU_TOL_REL, f"{name} M={M}: relative error {err:.2e}"
    if name != "gate-up-7B":   # the file order's path on the same weights (few-token builds + f32 G, U, swiglu_rows)
        h_file = _swiglu(lib, "file", qg, sg, qu, su, I, K, g, A, M)
        d = rel_err(h, h_file)
        assert d <= SWIGLU_PATHS_REL, f"{name} M={M}: fragment order vs file order {d:.2e} relative"

