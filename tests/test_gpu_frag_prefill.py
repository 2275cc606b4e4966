"""The prefill GEMM over the INT4 fragment order (gemm_int4_wgmma's FRAG builds, csrc/src/gemm_wgmma.cuh, from 128
tokens on Hopper; gemm.cu's dispatch sends grids too small for the GPU to the few-token fragment-order GEMM instead)
against a float64 numpy reference, through libnanoqwen_testing's nq_test_gemm_int4_multi_frag and
nq_test_gemm_swiglu_frag (layout-1 weights repacked into the fragment order on the device, then the product
dispatch). GPU only; skips where the library does not use the order (not Hopper, or no sm_90a build).

Covers M = 128, 200, 512, 1000 (token tails), q/k/v segments with biases, o and down with the residual add, gate/up
through the paired SwiGLU epilogue (ORDER_FRAG_PAIR), 7B and tiny shapes, groups 32/64/128/256, strides wider than
the data, and each FRAG build (gemm.cu choose_wgmma at 132 SMs): 192 x 128 (M512 q/k/v, M128-N18944, M512-N4864 whose
last block has 1 real 64-row tile of 3, M200-N4864+4864), 128 x 128 (M200 q/k/v, M512 o and down, M1000-N896+128+128,
M1000-N768+768), 128 x 256 (M1000 o and gate, M1000-N9024+4096 with a half-empty last block); M128 q/k/v, M200 down and
the tiny shapes below M1000 take the small-grid path. SwiGLU: the gate/up boundary of the pair P falls inside a
192-row block at M200-I4864 (tiles 75 | 76, 77 of block 25) and between blocks at M128-I4864.

Where the FRAG build and the file-order build run at the same M, they multiply the same f16 weights (the fragment
order's exact codes times the scale in one HMUL2 round exactly as dq_pair's (code - 8) * scale) in the same wgmma
order, so their outputs are equal bit for bit: checked at M = 512 against nq_test_gemm_int4_multi / nq_test_gemm_swiglu.
"""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from test_gpu_frag_gemm import lib, run_gemm_frag  # noqa: F401  (lib: the module fixture, skipping off Hopper)
from test_gpu_gemm import SWIGLU_TOL_REL, _silu_mul, check, make_case, run_gemm
from test_gpu_kernels import dequant, random_int4, rel_err

pytestmark = pytest.mark.gpu

_F32P = ctypes.POINTER(ctypes.c_float)
_U32P, _U16P = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint16)


CASES = [  # (M, [N per segment], K, group, lda pad, ldc pad, bias, add); N % 64 == 0, K % 128 == 0 (the order's rule)
    # 7B q/k/v (3584 + 512 + 512, K 3584) with biases
    (128, [3584, 512, 512], 3584, 128, 0, 0, True, False),   # 36 blocks: the small-grid path
    (200, [3584, 512, 512], 3584, 32, 8, 4, True, False),    # 128 x 128, a token tail, strides wider than the data
    (512, [3584, 512, 512], 3584, 128, 0, 0, True, False),   # 192 x 128: k and v each 2 real tiles of 3
    (1000, [3584, 512, 512], 3584, 64, 0, 0, True, False),
    # 7B o (K 3584) and down (K 18944) with the residual add
    (512, [3584], 3584, 64, 0, 0, True, True),               # 128 x 128
    (1000, [3584], 3584, 256, 8, 0, False, True),            # 128 x 256, group 256
    (200, [3584], 18944, 128, 0, 0, False, True),            # the small-grid path
    (512, [3584], 18944, 256, 0, 0, False, True),            # 128 x 128
    # 7B gate-shaped rows (N 18944)
    (128, [18944], 3584, 64, 0, 0, False, False),            # 192 x 128 at the smallest M
    (1000, [18944], 3584, 128, 0, 0, False, False),          # 128 x 256, 1000 = 3 x 256 + 232
    # 0.5B shapes: segment tails inside a block
    (512, [4864], 896, 64, 0, 0, True, False),               # 192 x 128: 76 tiles, the last block 1 real of 3
    (200, [4864, 4864], 896, 32, 0, 0, False, True),         # 192 x 128, two segments with tails
    (1000, [896, 128, 128], 896, 32, 0, 0, True, False),     # 128 x 128: q/k/v of the 0.5B
    (1000, [9024, 4096], 512, 64, 0, 0, True, True),         # 128 x 256: 9024 = 70.5 blocks of 128 rows
    # the tiny model (hidden 256, intermediate 768, q/k/v 512 + 128 + 128)
    (128, [512, 128, 128], 256, 32, 0, 0, True, False),
    (200, [768], 256, 64, 16, 2, True, True),
    (512, [256], 768, 256, 0, 0, True, True),                # down-shaped, 3 groups of 256
    (1000, [768, 768], 256, 128, 0, 0, False, False),        # 128 x 128 (96 blocks)
]


@pytest.mark.parametrize("case", CASES, ids=[f"M{c[0]}-N{'+'.join(map(str, c[1]))}-K{c[2]}-g{c[3]}"
                                              f"{'-bias' if c[6] else ''}{'-add' if c[7] else ''}" for c in CASES])
def test_gemm_frag_vs_numpy(lib, case):
    M, Ns, K, g, lda_pad, ldc_pad, with_bias, add = case
    rng = np.random.default_rng()
    segs, A, lda, bias, C, ldc, ref, owned = make_case(rng, M, Ns, K, g, lda_pad, ldc_pad, with_bias, add)
    rc, out = run_gemm_frag(lib, segs, A, K, g, lda, bias, C, ldc, add)
    assert rc == 0, lib.nq_last_error().decode()
    check(out, ref, C, owned, "gemm (fragment order)")


def run_swiglu(lib, frag, qg, sg, qu, su, N, K, g, A):
    """H (M, N) f16 of gemm_swiglu: fused over the pair (frag) or the file order's fused path."""
    M = A.shape[0]
    H = np.full((M, N), 0x7e00, dtype=np.uint16)        # poison (f16 NaN)
    p = lambda a, t: np.ascontiguousarray(a).ctypes.data_as(t)  # noqa: E731
    args_w = (p(qg, _U32P), p(sg.view(np.uint16), _U16P))
    args_u = (p(qu, _U32P), p(su.view(np.uint16), _U16P))
    Ap, Hp = A.ctypes.data_as(_F32P), H.ctypes.data_as(_U16P)
    if frag:
        rc = lib.nq_test_gemm_swiglu_frag(*args_w, *args_u, N, K, g, Ap, M, Hp)
    else:
        rc = lib.nq_test_gemm_swiglu(*args_w, None, *args_u, None, N, K, g, Ap, M, 0, Hp)
    assert rc == 0, lib.nq_last_error().decode()
    return H


SWIGLU_CASES = [  # (M, I, K, group); I % 64 == 0
    (512, 18944, 3584, 128),   # 7B gate/up at the TTFT prompt: 128 x 256
    (1000, 18944, 3584, 64),
    (128, 4864, 896, 32),      # 0.5B: 128 x 128, 76 blocks, the gate/up boundary of P between blocks 37 and 38
    (200, 4864, 896, 64),      # 192 x 128: block 25 = P tiles 75 (gate's bytes) | 76, 77 (up's); the last 2 real of 3
    (512, 4864, 896, 128),
    (1000, 768, 256, 32),      # the tiny model: 128 x 128
    (128, 768, 256, 256),      # the tiny model: the small-grid path
]


@pytest.mark.parametrize("M,N,K,g", SWIGLU_CASES, ids=[f"M{c[0]}-I{c[1]}-K{c[2]}-g{c[3]}" for c in SWIGLU_CASES])
def test_gemm_swiglu_frag_vs_numpy(lib, M, N, K, g):
    rng = np.random.default_rng()
    ug, qg, sg = random_int4(rng, N, K, g)
    uu, qu, su = random_int4(rng, N, K, g)
    A = rng.standard_normal((M, K)).astype(np.float32)
    a16 = A.astype(np.float16).astype(np.float64)
    ref = _silu_mul(a16 @ dequant(ug, sg, g).T, a16 @ dequant(uu, su, g).T)
    h = run_swiglu(lib, True, qg, sg, qu, su, N, K, g, A).view(np.float16).astype(np.float64)
    assert np.isfinite(h).all(), "unwritten (NaN) outputs"
    err = rel_err(h, ref)
    assert err < SWIGLU_TOL_REL, f"relative error {err:.2e}"


# M = 512, shapes whose grids take gemm_int4_wgmma in both orders (the same build: choose_wgmma sees the same shapes)
SAME_BITS_CASES = [  # (Ns, K, group, bias, add)
    ([3584, 512, 512], 3584, 128, True, False),    # 192 x 128
    ([3584], 18944, 128, False, True),             # 128 x 128
    ([18944, 18944], 3584, 64, False, False),      # 128 x 256
    ([4864], 896, 32, True, True),                 # 192 x 128, the last block 1 real tile of 3
]


@pytest.mark.parametrize("Ns,K,g,with_bias,add", SAME_BITS_CASES,
                         ids=[f"N{'+'.join(map(str, c[0]))}-K{c[1]}-g{c[2]}" for c in SAME_BITS_CASES])
def test_gemm_frag_equals_file_order_bit_for_bit(lib, Ns, K, g, with_bias, add):
    rng = np.random.default_rng()
    segs, A, lda, bias, C, ldc, ref, owned = make_case(rng, 512, Ns, K, g, 0, 0, with_bias, add)
    rc, out_file = run_gemm(lib, segs, A, K, g, lda, bias, C, ldc, add)
    assert rc == 0, lib.nq_last_error().decode()
    rc, out_frag = run_gemm_frag(lib, segs, A, K, g, lda, bias, C, ldc, add)
    assert rc == 0, lib.nq_last_error().decode()
    check(out_frag, ref, C, owned, "gemm (fragment order)")
    diff = out_frag.view(np.uint32) != out_file.view(np.uint32)
    assert not diff.any(), (f"{int(diff.sum())} of {diff.size} outputs differ from the file order's, first at "
                            f"{tuple(int(i) for i in np.argwhere(diff)[0])}")


@pytest.mark.parametrize("N,K,g", [(18944, 3584, 128), (4864, 896, 64)])
def test_gemm_swiglu_frag_equals_file_order_bit_for_bit(lib, N, K, g):
    """M = 512: the fused SwiGLU over the pair P against the file order's fused path (the same gate/up rows in each
    thread's fragment rows gid and gid + 8, the same f16 weights): equal f16 outputs."""
    rng = np.random.default_rng()
    _, qg, sg = random_int4(rng, N, K, g)
    _, qu, su = random_int4(rng, N, K, g)
    A = rng.standard_normal((512, K)).astype(np.float32)
    h_file = run_swiglu(lib, False, qg, sg, qu, su, N, K, g, A)
    h_frag = run_swiglu(lib, True, qg, sg, qu, su, N, K, g, A)
    assert np.isfinite(h_frag.view(np.float16)).all(), "unwritten (NaN) outputs"
    diff = h_frag != h_file
    assert not diff.any(), f"{int(diff.sum())} of {diff.size} outputs differ from the file order's"
