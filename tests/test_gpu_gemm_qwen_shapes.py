"""Every Qwen2.5 size's projections through the GEMM dispatch the prefill runs (issue 12's correctness list): q/k/v
(three segments with biases), o (residual add), gate/up (gemm_swiglu: the MLP's fused first half) and down (residual
add) of the 0.5B, 1.5B, 3B, 7B, 14B and 32B, at M = 1, 7, 64, 333, 512 and 2,048 tokens, against float64.

On a Hopper GPU with the sm_90a build the weights go through the fragment order as the loader leaves them
(nq_test_gemm_int4_multi_frag / nq_test_gemm_swiglu_frag: repack on the device, then the product dispatch: the
few-token fragment-order GEMM below 128 tokens or small grids, gemm_int4_wgmma's FRAG builds above); elsewhere the
file order (nq_test_gemm_int4_multi / nq_test_gemm_swiglu). INT4 layout 1, group 128 (the converter's default).

The float64 reference runs in torch on the GPU: the 32B down at 2,048 tokens is 0.58 TFLOP, minutes in numpy. Each
(size, projection) draws its weights once and runs every M on fresh activations. Tolerances: test_gpu_gemm's TOL_REL
and TOL_ELEM (check) and SWIGLU_TOL_REL, whose reasons hold at every K here (the f16 dequantisation error dominates;
f32 accumulation over K <= 27,648 random-sign products stays far below it).
"""
from __future__ import annotations

import numpy as np
import pytest

from nq_testing_lib import fragment_order_available
from test_gpu_frag_gemm import run_gemm_frag
from test_gpu_frag_prefill import run_swiglu
from test_gpu_gemm import SWIGLU_TOL_REL, check, lib, run_gemm  # noqa: F401  (lib: the module fixture)
from test_gpu_kernels import random_int4, rel_err

pytestmark = pytest.mark.gpu

# name: (hidden, intermediate, q rows = n_heads x head_dim, k (= v) rows = n_kv x head_dim): the published configs
SIZES = {
    "0.5B": (896, 4864, 896, 128),      # 14 heads, 2 KV heads, head_dim 64
    "1.5B": (1536, 8960, 1536, 256),    # 12, 2, 128
    "3B": (2048, 11008, 2048, 256),     # 16, 2, 128
    "7B": (3584, 18944, 3584, 512),     # 28, 4, 128
    "14B": (5120, 13824, 5120, 1024),   # 40, 8, 128
    "32B": (5120, 27648, 5120, 1024),   # 40, 8, 128
}
PROJECTIONS = ["qkv", "o", "gate_up", "down"]
M_LIST = [1, 7, 64, 333, 512, 2048]
GROUP = 128
CASES = [(s, p) for s in SIZES for p in PROJECTIONS]


@pytest.fixture(scope="module")
def torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("the float64 reference runs in torch on the GPU")
    return torch


def _dequant_t(torch, u, s):
    """float64 (N, K) on the GPU: (code - 8) x scale per group of GROUP (layout 1), as test_gpu_kernels.dequant."""
    uu = torch.from_numpy(u).cuda().to(torch.float64) - 8.0
    ss = torch.from_numpy(s.astype(np.float32)).cuda().to(torch.float64)
    return (uu.view(u.shape[0], -1, GROUP) * ss[:, :, None]).view(u.shape)


@pytest.mark.parametrize("size,proj", CASES, ids=[f"{s}-{p}" for s, p in CASES])
def test_qwen_projection_vs_float64(lib, torch_cuda, size, proj):
    torch = torch_cuda
    frag = fragment_order_available(lib)
    H, I, Nq, Nkv = SIZES[size]
    rng = np.random.default_rng()
    if proj == "gate_up":
        (ug, qg, sg), (uu, qu, su) = random_int4(rng, I, H, GROUP), random_int4(rng, I, H, GROUP)
        Wg, Wu = _dequant_t(torch, ug, sg), _dequant_t(torch, uu, su)
        for M in M_LIST:
            A = rng.standard_normal((M, H)).astype(np.float32)
            a16 = torch.from_numpy(A).cuda().half().double()
            g, u = a16 @ Wg.T, a16 @ Wu.T
            ref = (g / (1.0 + torch.exp(-g)) * u).cpu().numpy()
            h = run_swiglu(lib, frag, qg, sg, qu, su, I, H, GROUP, A).view(np.float16).astype(np.float64)
            assert np.isfinite(h).all(), f"{size} gate/up M={M}: unwritten (NaN) outputs"
            err = rel_err(h, ref)
            assert err < SWIGLU_TOL_REL, f"{size} gate/up M={M}: relative error {err:.2e}"
        return
    Ns, K, with_bias, add = {"qkv": ([Nq, Nkv, Nkv], H, True, False), "o": ([H], Nq, False, True),
                             "down": ([H], I, False, True)}[proj]
    drawn = [random_int4(rng, N, K, GROUP) for N in Ns]
    segs = [(q, s) for _, q, s in drawn]
    W = torch.cat([_dequant_t(torch, u, s) for u, _, s in drawn])          # (sum Ns, K)
    ldc = sum(Ns)
    for M in M_LIST:
        A = rng.standard_normal((M, K)).astype(np.float32)
        bias = [rng.standard_normal(N).astype(np.float32) if with_bias else None for N in Ns]
        C = rng.standard_normal((M, ldc)).astype(np.float32) if add else np.full((M, ldc), np.nan, np.float32)
        ref = torch.from_numpy(A).cuda().half().double() @ W.T
        if with_bias:
            ref += torch.from_numpy(np.concatenate(bias)).cuda().double()
        if add:
            ref += torch.from_numpy(C).cuda().double()
        ref = ref.cpu().numpy()
        run = run_gemm_frag if frag else run_gemm
        rc, out = run(lib, segs, A, K, GROUP, K, bias, C, ldc, add)
        assert rc == 0, lib.nq_last_error().decode()
        check(out, ref, C, ldc, f"{size} {proj} M={M}")
