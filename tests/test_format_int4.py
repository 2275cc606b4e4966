"""INT4 layout 1 reference (nanoqwen_format.int4_layout) against scalar decoders written from the spec text, the
GPU-facing pair property of INT4_PERM, and CRC32C fast path vs bitwise reference."""
import numpy as np
import pytest

from nanoqwen_format import (DType, dequantize_int4_reference, open_file, pack_int4_reference,
                             unpack_int4_reference)
from nanoqwen_format.constants import INT4_PERM
from nanoqwen_format.crc import crc32c, crc32c_reference

from format_helpers import make_random_file


def scalar_code(qweight, n, k):
    """Spec §9.2, one value: word j = k // 8 of row n; nibble i with INT4_PERM[i] == k % 8."""
    word = int(qweight[n, k // 8])
    i = INT4_PERM.index(k % 8)
    return (word >> (4 * i)) & 0xF


@pytest.mark.parametrize("shape", [(1, 8), (3, 32), (7, 64), (16, 256)])
def test_pack_unpack_roundtrip_and_scalar_decode(shape):
    rng = np.random.default_rng(shape[0] * 1000 + shape[1])
    u = rng.integers(0, 16, size=shape, dtype=np.uint8)
    q = pack_int4_reference(u)
    assert q.dtype == np.uint32 and q.shape == (shape[0], shape[1] // 8)
    np.testing.assert_array_equal(unpack_int4_reference(q), u)
    for n in range(shape[0]):
        for k in range(shape[1]):
            assert scalar_code(q, n, k) == u[n, k]


def test_word_bit_layout_explicit():
    """Codes k = 0..7 = 1..8 (mod 16): nibble i holds code of k = PERM[i]; check the exact word."""
    u = np.array([[1, 2, 3, 4, 5, 6, 7, 8]], dtype=np.uint8)
    want = sum(int(u[0, INT4_PERM[i]]) << (4 * i) for i in range(8))
    assert want == 0x86427531
    assert int(pack_int4_reference(u)[0, 0]) == want


def test_pairs_come_out_in_k_order():
    """Spec §9.2 rationale: (word >> 4m) & 0x000F000F holds codes (8j+2m, 8j+2m+1) in its low/high 16-bit halves."""
    rng = np.random.default_rng(7)
    u = rng.integers(0, 16, size=(5, 64), dtype=np.uint8)
    q = pack_int4_reference(u)
    for n in range(5):
        for j in range(8):
            w = int(q[n, j])
            for m in range(4):
                pair = (w >> (4 * m)) & 0x000F000F
                assert pair & 0xFFFF == u[n, 8 * j + 2 * m]
                assert pair >> 16 == u[n, 8 * j + 2 * m + 1]
                # OR with 0x64006400 gives the f16 values 1024 + u (the lop3 trick)
                halves = np.array([(pair | 0x64006400) & 0xFFFF, (pair | 0x64006400) >> 16], dtype=np.uint16)
                np.testing.assert_array_equal(halves.view(np.float16).astype(np.float32),
                                              1024.0 + u[n, 8 * j + 2 * m: 8 * j + 2 * m + 2])


@pytest.mark.parametrize("g", [32, 64, 128])
def test_dequantize_matches_scalar_rule(g):
    rng = np.random.default_rng(g)
    n, k = 6, 256
    u = rng.integers(0, 16, size=(n, k), dtype=np.uint8)
    s = rng.uniform(1e-3, 0.2, size=(n, k // g)).astype(np.float16)
    w = dequantize_int4_reference(pack_int4_reference(u), s, g)
    assert w.dtype == np.float32 and w.shape == (n, k)
    for i in range(n):
        for kk in range(0, k, 5):
            assert w[i, kk] == np.float32(s[i, kk // g]) * np.float32(int(u[i, kk]) - 8)  # one f32 multiply: exact


def test_reference_rejects_bad_input():
    with pytest.raises(ValueError):
        pack_int4_reference(np.full((2, 8), 16, dtype=np.uint8))
    with pytest.raises(ValueError):
        pack_int4_reference(np.zeros((2, 12), dtype=np.uint8) + 3)
    with pytest.raises(ValueError):
        unpack_int4_reference(np.ones((2, 2), dtype=np.int64))
    with pytest.raises(ValueError):
        dequantize_int4_reference(np.ones((2, 4), np.uint32), np.ones((2, 2), np.float32), 16)


def test_crc32c_fast_matches_reference():
    rng = np.random.default_rng(3)
    assert crc32c(b"") == crc32c_reference(b"") == 0
    for size in (1, 3, 8, 63, 64, 65, 1000):
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        assert crc32c(data) == crc32c_reference(data)
        cut = size // 3
        assert crc32c(data[cut:], crc32c(data[:cut])) == crc32c(data)


def test_reader_views_are_zero_copy(tmp_path):
    path = tmp_path / "m.nanoqwen"
    specs, payloads = make_random_file(path, seed=9)
    with open_file(path) as f:
        for s in specs:
            if s.dtype == DType.INT4G:
                q, sc = f.int4(s.name)
                arrays = (q, sc)
            else:
                arrays = (f.array(s.name),)
            for a in arrays:
                assert not a.flags.owndata and not a.flags.writeable
                assert a.ctypes.data % 4 == 0
        # float32() is a copy
        for s in specs:
            c = f.float32(s.name)
            assert c.flags.writeable and c.dtype == np.float32
            if s.dtype != DType.INT4G:
                assert not np.shares_memory(c, f.array(s.name))
