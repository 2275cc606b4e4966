"""Spec §9.3 (the int4 quantization rule) transcribed as a scalar, per-group implementation, compared with the
quantizer's numpy reference (nanoqwen_quant.quantize.quantize_reference) on fresh random inputs: the spec and the
converter must agree byte for byte."""
import numpy as np
import pytest

from nanoqwen_format import unpack_int4_reference

quantize = pytest.importorskip("nanoqwen_quant.quantize")


def spec_quantize_group(w, mode):
    """w: float32 values of one group -> (f16 scale, list of codes u). Straight from spec §9.3 steps 1-6."""
    amax = np.float32(max(abs(x) for x in w))                               # step 1
    n_cand = 21 if mode == "mse" else 1                                     # step 2
    best = None
    for i in range(n_cand):
        r = np.float32(1.0 - 0.02 * i)
        s32 = np.float32(np.float32(r * amax) / np.float32(7))              # step 3
        s = np.float16(s32)
        assert np.isfinite(s)
        sf = np.float32(s)
        if sf == 0:                                                         # step 4
            q = [0] * len(w)
        else:
            q = [int(min(max(np.rint(np.float32(x / sf)), -8), 7)) for x in w]
        sse = 0.0                                                           # step 5 (float64, k order)
        for x, qq in zip(w, q):
            d = float(x) - float(sf) * float(qq)
            sse += d * d
        if best is None or sse < best[0]:                                   # ties keep the larger r
            best = (sse, s, [qq + 8 for qq in q])
    return best[1], best[2]                                                 # step 6


def spec_quantize(w, g, mode):
    n, k = w.shape
    scales = np.zeros((n, k // g), np.float16)
    codes = np.zeros((n, k), np.uint8)
    for r in range(n):
        for G in range(k // g):
            s, u = spec_quantize_group([np.float32(x) for x in w[r, G * g:(G + 1) * g]], mode)
            scales[r, G] = s
            codes[r, G * g:(G + 1) * g] = u
    return codes, scales


def _weights(seed, n, k, g):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    w[0, 3] = 0.9                       # an outlier: mse clipping matters in this group
    w[1, :g] = 0.0                      # an all-zero group: s = 0, u = 8
    w[2, :g] = rng.standard_normal(g).astype(np.float32) * np.float32(1e-9)   # scale underflows f16 -> 0
    w[3, g:2 * g] = np.float32(0.25)    # a constant group
    return w


@pytest.mark.parametrize("mode", ["rtn", "mse"])
@pytest.mark.parametrize("g", [32, 64])
def test_quantizer_reference_follows_spec(mode, g):
    w = _weights(g + (mode == "mse"), 6, 128, g)
    want_codes, want_scales = spec_quantize(w, g, mode)
    qweight, scales = quantize.quantize_reference(w, group_size=g, mode=mode)
    np.testing.assert_array_equal(scales.view(np.uint16), want_scales.view(np.uint16))
    np.testing.assert_array_equal(unpack_int4_reference(qweight), want_codes)
    assert (want_codes[1, :g] == 8).all() and want_scales[1, 0] == 0 and want_scales[2, 0] == 0
    if mode == "mse":  # the clipping search really picked r < 1 somewhere (else this would only test rtn)
        _, rtn_scales = spec_quantize(w, g, "rtn")
        assert (want_scales < rtn_scales).any()
