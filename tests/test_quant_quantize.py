"""The numba quantizer (quantize/dequantize) against the numpy reference and the format's layout-1 reference."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from nanoqwen_format.int4_layout import dequantize_int4_reference, unpack_int4_reference
from nanoqwen_quant.quantize import (MSE_RATIOS, QuantizationError, _round_to_f16, dequantize, quantize,
                                     quantize_reference, snr_db)


def _weights(rng, n, k, g):
    """Gaussian weights with the awkward cases mixed in: outliers, an all-zero group, a tiny group (subnormal f16
    scale), exact rounding ties (w = s * (q + 0.5)), negative-extreme groups."""
    w = (rng.standard_normal((n, k)) * rng.uniform(0.005, 0.2)).astype(np.float32)
    if n >= 4:
        w[0, :g] = 0.0                                                  # all-zero group
        w[1, rng.integers(0, k, 3)] *= 40.0                             # outliers
        w[2, :g] *= np.float32(1e-6)                                    # scale below f16 normal range
        s = np.float32(np.float16(0.01))
        w[3, :g] = s * (rng.integers(-7, 7, g) + np.float32(0.5))         # halfway cases
        w[3, 0] = 7 * s
    if n >= 6:
        w[5, g:2 * g] = -np.abs(w[5, g:2 * g])                          # amax from a negative value
    return w


def _same(a, b):
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1].view(np.uint16), b[1].view(np.uint16))   # bitwise, incl. -0 / subnormals


@pytest.mark.parametrize("mode", ["rtn", "mse"])
@pytest.mark.parametrize("g", [64, 128])
@pytest.mark.parametrize("seed", range(4))
def test_fast_equals_reference(mode, g, seed):
    rng = np.random.default_rng(1000 + seed)
    n = int(rng.integers(1, 50))
    k = g * int(rng.integers(1, 6))
    w = _weights(rng, n, k, g)
    fast = quantize(w, g, mode)
    ref = quantize_reference(w, g, mode)
    _same(fast, ref)
    assert fast[0].dtype == np.uint32 and fast[0].shape == (n, k // 8)
    assert fast[1].dtype == np.float16 and fast[1].shape == (n, k // g)
    deq = dequantize(*fast, g)
    np.testing.assert_array_equal(deq, dequantize_int4_reference(*fast, g))    # same float32 ops → exact


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), g=st.sampled_from([32, 64, 128, 256]), mode=st.sampled_from(["rtn", "mse"]),
       n=st.integers(1, 9), groups=st.integers(1, 4))
def test_fast_equals_reference_fuzz(seed, g, mode, n, groups):
    rng = np.random.default_rng(seed)
    w = _weights(rng, n, g * groups, g)
    _same(quantize(w, g, mode), quantize_reference(w, g, mode))


def test_round_to_f16_matches_numpy():
    rng = np.random.default_rng(7)
    x = np.concatenate([
        np.abs(rng.standard_normal(20000)).astype(np.float32) * np.float32(10.0) ** rng.integers(-9, 5, 20000),
        np.float16(rng.uniform(0, 60000, 2000)).astype(np.float32),               # exact f16 values
        # exact halfway points between neighbouring f16 values (ties to even), normal and subnormal
        (np.arange(1, 3000, dtype=np.float32) + np.float32(0.5)) * np.float32(2.0 ** -24),
        (np.arange(1024, 2048, dtype=np.float32) + np.float32(0.5)) * np.float32(2.0 ** -3),
        np.array([65504, 65519.99, 65520, 1e9, 2.0 ** -25, 2.0 ** -25 * 1.0001, 6.1e-5], dtype=np.float32),
    ]).astype(np.float32)
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).astype(np.float32)
    got = np.array([_round_to_f16(v) for v in x], dtype=np.float32)
    np.testing.assert_array_equal(got, want)


def test_codes_rule_directly():
    """Decode the packed bytes with the format's reference and check the spec's code rule per element."""
    rng = np.random.default_rng(3)
    g = 64
    w = _weights(rng, 8, 256, g)
    qw, sc = quantize(w, g, "rtn")
    u = unpack_int4_reference(qw).astype(np.int32)
    s = np.repeat(sc.astype(np.float32), g, axis=1)
    amax = np.abs(w.reshape(8, -1, g)).max(-1)
    np.testing.assert_array_equal(sc, (amax / np.float32(7)).astype(np.float16))
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(s == 0, 0, np.clip(np.rint(w / s), -8, 7))
    np.testing.assert_array_equal(u - 8, q)
    assert (u[0, :g] == 8).all() and (sc[0, 0] == 0)              # all-zero group → s = 0, u = 8


@pytest.mark.parametrize("g", [64, 128])
def test_error_bounds_and_mse_never_worse(g):
    rng = np.random.default_rng(11)
    w = _weights(rng, 32, 4 * g, g)
    qr, sr = quantize(w, g, "rtn")
    wr = dequantize(qr, sr, g)
    s = np.repeat(sr.astype(np.float32), g, axis=1)
    # rtn never clips (|w/s| ≤ 7·(1 + 2^-11) < 7.5), so the error is the rounding error ≤ s/2; the float32
    # division before rint can move w/s by 7.5·2^-24 ≈ 4.5e-7 steps, i.e. 9e-7 of s/2: 4e-6 relative slack.
    assert (np.abs(w - wr) <= 0.5 * s * (1 + 4e-6)).all()
    qm, sm = quantize(w, g, "mse")
    wm = dequantize(qm, sm, g)
    sse_r = ((w.astype(np.float64) - wr) ** 2).reshape(32, -1, g).sum(-1)
    sse_m = ((w.astype(np.float64) - wm) ** 2).reshape(32, -1, g).sum(-1)
    # mse searches a candidate set that contains rtn's scale; 1e-12 relative covers summation-order rounding
    assert (sse_m <= sse_r * (1 + 1e-12)).all()
    # mse scale is one of the candidates
    amax = np.abs(w.reshape(32, -1, g)).max(-1)
    cands = ((MSE_RATIOS[None, None, :] * amax[..., None]) / np.float32(7)).astype(np.float16)
    assert (cands == sm[..., None]).any(-1).all()


def test_gaussian_snr_matches_theory():
    """Uniform rounding noise s²/12 with s = E[amax]/7 over 128 Gaussian samples (E[amax] ≈ 2.9σ) gives
    SNR ≈ 10·log10(12·49/2.9²) ≈ 18.5 dB; ±1.5 dB covers the amax spread and clipping at -8."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((256, 1024)).astype(np.float32)
    rtn = snr_db(w, dequantize(*quantize(w, 128, "rtn"), 128))
    assert 17.0 < rtn < 20.0
    mse = snr_db(w, dequantize(*quantize(w, 128, "mse"), 128))
    assert mse > rtn


def test_out_arrays_and_row_blocks():
    rng = np.random.default_rng(9)
    w = _weights(rng, 40, 256, 128)
    qw = np.empty((40, 32), np.uint32)
    sc = np.empty((40, 2), np.float16)
    for a in range(0, 40, 16):
        quantize(w[a:a + 16], 128, "rtn", out=(qw[a:a + 16], sc[a:a + 16]))
    _same((qw, sc), quantize_reference(w, 128, "rtn"))


@pytest.mark.parametrize("bad, msg", [
    (lambda w: w.__setitem__((1, 3), np.nan), "NaN or Inf"),
    (lambda w: w.__setitem__((2, 5), np.inf), "NaN or Inf"),
    (lambda w: w.__setitem__((0, 0), 1e6), "overflows float16"),
])
@pytest.mark.parametrize("fn", [quantize, quantize_reference])
def test_bad_values_raise(bad, msg, fn):
    w = np.random.default_rng(0).standard_normal((4, 128)).astype(np.float32)
    bad(w)
    with pytest.raises(QuantizationError, match=msg):
        fn(w, 64, "rtn")


@pytest.mark.parametrize("shape, g, mode, msg", [
    ((4, 96), 64, "rtn", "multiple of the group size"),
    ((4, 128), 48, "rtn", "group_size must be one of"),
    ((128,), 64, "rtn", "2-D"),
    ((4, 128), 64, "awq", "mode"),
])
def test_bad_shapes_raise(shape, g, mode, msg):
    w = np.ones(shape, np.float32)
    for fn in (quantize, quantize_reference):
        with pytest.raises(QuantizationError, match=msg):
            fn(w, g, mode)


def test_snr_helper():
    a = np.array([3.0, 4.0])
    assert snr_db(a, a) == math.inf
    assert snr_db(a, np.array([3.0, 3.0])) == pytest.approx(10 * math.log10(25.0))
