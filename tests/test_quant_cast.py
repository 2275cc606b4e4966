"""nanoqwen_quant.cast (numba) equals numpy's casts bit for bit, including every bf16 bit pattern."""
import numpy as np

from nanoqwen_quant.cast import bf16_to_f32, to_f16_bits


def _numpy_f16(x_f32):
    with np.errstate(over="ignore", invalid="ignore"):
        return x_f32.astype(np.float16).view(np.uint16)


def test_every_bf16_pattern():
    raw = np.arange(65536, dtype=np.uint32).astype(np.uint16)            # all 2^16 bf16 bit patterns
    f32 = (raw.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(bf16_to_f32(raw).view(np.uint32), f32.view(np.uint32))
    h, bad = to_f16_bits(raw)
    ok = np.isfinite(f32) & (np.abs(f32) < 65520)
    np.testing.assert_array_equal(h[ok], _numpy_f16(f32)[ok])
    assert bad == int((~ok).sum()) > 0


def test_random_f32_all_ranges():
    rng = np.random.default_rng(0)
    n = 300_000
    x = (rng.standard_normal(n) * 2.0 ** rng.integers(-30, 17, n)).astype(np.float32)
    # exact ties between f16 neighbours, normal and subnormal, and the overflow edge
    ties = np.concatenate([(np.arange(1, 2000) + 0.5) * 2.0 ** -24, (np.arange(1024, 3000) + 0.5) * 2.0 ** -10,
                           [65504.0, 65519.996, 65520.0, 2.0 ** -25, 2.0 ** -26, 1e-45]]).astype(np.float32)
    x = np.concatenate([x, ties, -ties])
    h, bad = to_f16_bits(x)
    ok = np.abs(x) < 65520
    np.testing.assert_array_equal(h[ok], _numpy_f16(x)[ok])
    assert bad == int((~ok).sum())


def test_out_argument_and_shapes():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((37, 129)).astype(np.float32)
    out = np.empty((37, 129), np.uint16)
    h, bad = to_f16_bits(x, out=out)
    assert h is out and bad == 0
    np.testing.assert_array_equal(out, _numpy_f16(x))
