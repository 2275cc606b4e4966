"""GPTQ (nanoqwen_quant.gptq): blocked fast path vs the column-by-column reference, the calibration objective
against rtn / mse with the same scales, and the layout of what it writes."""
import numpy as np
import pytest

from nanoqwen_format.int4_layout import dequantize_int4_reference, unpack_int4_reference
from nanoqwen_quant.gptq import (act_order, gptq_codes, gptq_codes_reference, gptq_objective, gptq_prepare,
                                 gptq_quantize, hessian, inverse_cholesky)
from nanoqwen_quant.quantize import QuantizationError, quantize


def _calibration(rng, t, k):
    """Correlated inputs like a real layer's: a random mixing of independent channels with unequal energy,
    plus one dead channel (never active)."""
    z = rng.standard_normal((t, k)) * rng.uniform(0.2, 3.0, k)
    x = z @ (np.eye(k) + 0.3 * rng.standard_normal((k, k)) / np.sqrt(k))
    x[:, rng.integers(0, k)] = 0.0
    return x


def _codes(qweight):
    return unpack_int4_reference(qweight).astype(np.int8) - 8


@pytest.mark.parametrize("g", [32, 64, 128])
@pytest.mark.parametrize("seed", range(3))
def test_blocked_equals_reference(g, seed):
    rng = np.random.default_rng(500 + seed)
    n, k = int(rng.integers(3, 40)), g * int(rng.integers(1, 4)) + (g if g == 32 else 0)
    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    h = hessian(_calibration(rng, 3 * k, k))
    u = inverse_cholesky(h)
    _, scales = quantize(w, g, "mse")
    ref = gptq_codes_reference(w, u, scales, g)
    for block in (8, 128):                          # blocks smaller and larger than a group
        np.testing.assert_array_equal(gptq_codes(w, u, scales, g, block=block), ref)
    for order in (act_order(h), rng.permutation(k)):          # act-order, and any other processing order
        uo = inverse_cholesky(h[np.ix_(order, order)])
        ref = gptq_codes_reference(w, uo, scales, g, order=order)
        for block in (8, 128):
            np.testing.assert_array_equal(gptq_codes(w, uo, scales, g, block=block, order=order), ref)


def test_act_order_is_descending_hessian_diagonal_and_checked():
    h = np.diag([1.0, 5.0, 3.0, 5.0])
    np.testing.assert_array_equal(act_order(h), [1, 3, 2, 0])           # ties keep their column order
    w = np.ones((2, 64), np.float32)
    with pytest.raises(QuantizationError, match="permutation"):
        gptq_codes(w, np.eye(64), np.ones((2, 2), np.float16), 32, order=np.zeros(64, np.int64))


# Act-order against left-to-right on the calibration objective, summed over fixed seeds. On these synthetic
# layers (unequal channel energy) it measured 15-22 % lower per seed; asked for: at least ACT_ORDER_MIN_GAIN lower
# in total (act-order is a heuristic, not a guarantee per instance, so the margin is generous).
ACT_ORDER_MIN_GAIN = 0.05


def test_act_order_lowers_the_objective_in_total():
    e_nat = e_act = 0.0
    for seed in range(4):
        rng = np.random.default_rng(900 + seed)
        n, k, g = 48, 256, 64
        w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
        h = hessian(_calibration(rng, 3 * k, k))
        _, scales = quantize(w, g, "mse")
        q_nat = gptq_codes(w, inverse_cholesky(h), scales, g)
        order, u = gptq_prepare(h)
        q_act = gptq_codes(w, u, scales, g, order=order)
        e_nat += gptq_objective(w, q_nat, scales, g, h)
        e_act += gptq_objective(w, q_act, scales, g, h)
    assert e_act < (1 - ACT_ORDER_MIN_GAIN) * e_nat, (e_act, e_nat)


@pytest.mark.parametrize("scale_mode", ["rtn", "mse"])
@pytest.mark.parametrize("g", [32, 128])
def test_objective_not_worse_than_plain_rounding(scale_mode, g):
    """With the same fixed scales, GPTQ's codes give a calibration error no larger than rounding each weight
    alone (fresh seeds every run; the seed is in the message)."""
    seed = int(np.random.SeedSequence().entropy % 2**32)
    rng = np.random.default_rng(seed)
    for _ in range(3):
        n, k = int(rng.integers(16, 96)), g * int(rng.integers(2, 5))
        w = (rng.standard_normal((n, k)) * rng.uniform(0.01, 0.1)).astype(np.float32)
        h = hessian(_calibration(rng, 4 * k, k))
        qw_plain, s_plain = quantize(w, g, scale_mode)
        qw, s = gptq_quantize(w, h, g, scale_mode)
        np.testing.assert_array_equal(s.view(np.uint16), s_plain.view(np.uint16))     # scales held fixed
        e_plain = gptq_objective(w, _codes(qw_plain), s, g, h)
        e_gptq = gptq_objective(w, _codes(qw), s, g, h)
        assert e_gptq <= e_plain, f"seed {seed}: gptq {e_gptq} > {scale_mode} {e_plain}"
        assert e_gptq < 0.9 * e_plain, f"seed {seed}: gptq gains under 10 % ({e_gptq} vs {e_plain})"


def test_identity_hessian_is_plain_rounding():
    """H = I (uncorrelated, equal-energy inputs): the feedback terms vanish and GPTQ is exactly rtn/mse."""
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((20, 256)) * 0.03).astype(np.float32)
    for mode in ("rtn", "mse"):
        np.testing.assert_array_equal(gptq_quantize(w, np.eye(256), 64, mode, damp_rel=0.0)[0],
                                      quantize(w, 64, mode)[0])


def test_layout_and_dequantize():
    rng = np.random.default_rng(8)
    w = (rng.standard_normal((12, 128)) * 0.05).astype(np.float32)
    h = hessian(_calibration(rng, 400, 128))
    qw, s = gptq_quantize(w, h, 32)
    assert qw.dtype == np.uint32 and qw.shape == (12, 16) and s.dtype == np.float16 and s.shape == (12, 4)
    deq = dequantize_int4_reference(qw, s, 32)
    np.testing.assert_array_equal(deq, np.repeat(s.astype(np.float32), 32, axis=1) * _codes(qw))
    assert 0 < np.mean(np.abs(deq - w)) < float(np.max(s))          # near w, on the group grid, not all zero


def test_bad_inputs():
    w = np.ones((4, 64), np.float32)
    with pytest.raises(QuantizationError, match="hessian shape"):
        gptq_quantize(w, np.eye(32), 32)
    with pytest.raises(QuantizationError, match="finite"):
        gptq_quantize(w, np.full((64, 64), np.nan), 32)
    with pytest.raises(QuantizationError, match="scale_mode"):
        gptq_quantize(w, np.eye(64), 32, "gptq")
    w[0, 0] = np.inf
    with pytest.raises(QuantizationError, match="NaN or Inf"):
        gptq_quantize(w, np.eye(64), 32)
