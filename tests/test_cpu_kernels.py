"""numba kernels of the CPU backend vs their slow numpy references, on fresh random inputs."""
import numpy as np
import pytest

from nanoqwen_rt.backends.cpu.kernels import (BF16_LUT, F16_LUT, PERM, _int4_parallel, _int4_serial, _u16_parallel,
                                     _u16_serial, matmul_int4, matmul_int4_reference, matmul_u16,
                                     matmul_u16_reference, rows_u16)

# every kernel has a serial and a parallel (prange) variant; the public wrapper picks by size: test all three
INT4_IMPLS = {"serial": _int4_serial, "parallel": _int4_parallel, "wrapper": matmul_int4}
U16_IMPLS = {"serial": _u16_serial, "parallel": _u16_parallel, "wrapper": matmul_u16}

# float32 accumulation over K terms vs a float64 reference: the error grows ~ sqrt(K) * eps32 * sum|w*x|.
# rtol/atol below leave a margin of ~10x over that for K ≤ 512 with unit-scale data.
RTOL, ATOL = 1e-5, 1e-4


def _pack(u: np.ndarray) -> np.ndarray:
    """Independent packer for the test: nibble i of word j ← u[:, 8j + PERM[i]]."""
    N, K = u.shape
    out = np.zeros((N, K // 8), dtype=np.uint32)
    for i in range(8):
        out |= (u[:, PERM[i]::8].astype(np.uint32) << np.uint32(4 * i))
    return out


def test_luts_exact():
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    f = bits.view(np.float16).astype(np.float32)
    fin = np.isfinite(f)
    assert np.array_equal(F16_LUT[fin], f[fin]) and np.isnan(F16_LUT[~fin & np.isnan(f)]).all()
    b = (bits.astype(np.uint32) << 16).view(np.float32)
    fin = np.isfinite(b)
    assert np.array_equal(BF16_LUT[fin], b[fin])


@pytest.mark.parametrize("impl", sorted(INT4_IMPLS))
@pytest.mark.parametrize("T,N,K,g", [(1, 48, 256, 128), (5, 33, 128, 64), (3, 17, 512, 32), (1, 7, 64, 64),
                                     (1, 130, 256, 32), (2, 130, 128, 128)])
def test_matmul_int4_matches_reference(impl, T, N, K, g):
    rng = np.random.default_rng(T * 1000 + N + K + g)
    u = rng.integers(0, 16, size=(N, K), dtype=np.uint8)
    qw = _pack(u)
    scales = (rng.random((N, K // g)) * 0.1 + 0.01).astype(np.float16)
    x = rng.standard_normal((T, K)).astype(np.float32)
    out = np.full((T, N), np.nan, dtype=np.float32)
    INT4_IMPLS[impl](x, qw, scales.view(np.uint16), F16_LUT, g, out)
    ref = matmul_int4_reference(x, qw, scales, g)
    # reference built independently: dense dequant from u (not from the packed words)
    dense = np.repeat(scales.astype(np.float64), g, axis=1) * (u.astype(np.float64) - 8)
    np.testing.assert_allclose(ref, x.astype(np.float64) @ dense.T, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out, ref, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("impl", sorted(U16_IMPLS))
@pytest.mark.parametrize("kind", ["f16", "bf16"])
@pytest.mark.parametrize("T,N,K", [(1, 40, 96), (6, 19, 200), (1, 150, 64)])
def test_matmul_u16_matches_reference(impl, kind, T, N, K):
    rng = np.random.default_rng(N + K + T)
    wf = rng.standard_normal((N, K)).astype(np.float32) * 0.1
    if kind == "f16":
        w = wf.astype(np.float16)
        bits, lut = w.view(np.uint16), F16_LUT
    else:
        bits = (wf.view(np.uint32) >> 16).astype(np.uint16)
        w, lut = bits, BF16_LUT
    x = rng.standard_normal((T, K)).astype(np.float32)
    out = np.full((T, N), np.nan, dtype=np.float32)
    U16_IMPLS[impl](x, bits, lut, out)
    np.testing.assert_allclose(out, matmul_u16_reference(x, w), rtol=RTOL, atol=ATOL)


def test_rows_u16_gather():
    rng = np.random.default_rng(7)
    w = rng.standard_normal((50, 24)).astype(np.float16)
    ids = rng.integers(0, 50, size=9).astype(np.int32)
    out = np.full((9, 24), np.nan, dtype=np.float32)
    rows_u16(w.view(np.uint16), ids, F16_LUT, out)
    assert np.array_equal(out, w[ids].astype(np.float32))
    bf = (rng.standard_normal((50, 24)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    rows_u16(bf, ids, BF16_LUT, out)
    assert np.array_equal(out, (bf[ids].astype(np.uint32) << 16).view(np.float32))
