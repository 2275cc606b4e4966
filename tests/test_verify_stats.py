"""nanoqwen_quant.errstats numba kernels against their numpy references."""
import numpy as np
import pytest

from nanoqwen_quant import quantize as qz
from nanoqwen_quant.errstats import (stats_int4, stats_int4_reference, stats_plain, stats_plain_reference)


def _close(a, b):
    # sums differ only by summation order (float64, ~1e5 terms): 1e-9 relative; max and counts are exact
    np.testing.assert_allclose(a[:2], b[:2], rtol=1e-9)
    assert a[2] == b[2] and a[3] == b[3]


@pytest.mark.parametrize("seed", range(3))
def test_plain(seed):
    rng = np.random.default_rng(seed)
    ref = rng.standard_normal((57, 300)).astype(np.float32)
    got = ref.astype(np.float16).astype(np.float32)
    got[3, 7] += 0.5                                             # one element over the f16 bound
    got[5, 9] = np.nan                                           # NaN counts as a violation
    args = (2.0 ** -11, 2.0 ** -25)
    a, b = stats_plain(ref, got, *args), stats_plain_reference(ref, got, *args)
    assert b[3] == 2
    np.testing.assert_allclose(a[:2][0], b[0], rtol=1e-9)
    assert a[3] == b[3]


@pytest.mark.parametrize("mode", ["rtn", "mse"])
def test_int4(mode):
    rng = np.random.default_rng(4)
    g = 64
    ref = (0.05 * rng.standard_normal((33, 256))).astype(np.float32)
    ref[0, :g] = 0
    q, s = qz.quantize(ref, g, mode)
    got = qz.dequantize(q, s, g)
    args = (g, 2.0 ** -16, 2.0 ** -40, 4e-7)
    a = stats_int4(ref, got, s.astype(np.float32), *args)
    b = stats_int4_reference(ref, got, s.astype(np.float32), *args)
    _close(a, b)
    assert a[3] == 0
    got[2, 5] += 10 * float(s[2, 0])                             # push one element far over its bound
    a = stats_int4(ref, got, s.astype(np.float32), *args)
    b = stats_int4_reference(ref, got, s.astype(np.float32), *args)
    _close(a, b)
    assert a[3] == 1
