"""The numpy reference of the INT4 fragment order (tests/fragment_order.py) against the statements of its
specification (csrc/src/int4_frag.cuh), on the CPU. The GPU repack is compared with this reference bit for bit in
tests/test_gpu_frag_repack.py."""
from __future__ import annotations

import numpy as np
import pytest

from fragment_order import (codes_of, from_fragment_order, interleave_pair, pair_fragment_order, split_pair,
                            to_fragment_order, unpack_word)
from nanoqwen_format.int4_layout import pack_int4_reference


def _weight(rng, N, K, g):
    u = rng.integers(0, 16, size=(N, K), dtype=np.uint8)
    s = rng.standard_normal((N, K // g)).astype(np.float16)
    return u, s


def _pack(u):
    return np.asarray(pack_int4_reference(u), dtype=np.uint32).reshape(u.shape[0], u.shape[1] // 8)


def test_codes_of_inverts_the_spec_packer():
    rng = np.random.default_rng(1)
    u, _ = _weight(rng, 8, 64, 32)
    assert np.array_equal(codes_of(_pack(u)), u)


@pytest.mark.parametrize("N,K,g", [(64, 128, 32), (192, 256, 128), (128, 512, 256)])
def test_every_code_sits_where_the_header_says(N, K, g):
    """Word (nb, kb, lane, w), nibble i: row 64 nb + 16 w + 8 ((i >> 1) & 1) + lane / 4, k 16 kb + 2 (lane % 4) +
    (i >> 2) + 8 (i & 1) -- checked by loops written from the header's table, not from the reference's indexing."""
    rng = np.random.default_rng(N + K)
    u, s = _weight(rng, N, K, g)
    words, fs = to_fragment_order(_pack(u), s)
    assert words.shape == (N // 64, K // 16, 32, 4) and fs.shape == (N // 64, K // g, 8, 8)
    table = {0: (0, 0), 4: (0, 1), 1: (0, 8), 5: (0, 9), 2: (8, 0), 6: (8, 1), 3: (8, 8), 7: (8, 9)}  # i: (row+, k+)
    for nb in range(N // 64):
        for kb in (0, K // 16 - 1):
            for lane in range(32):
                g8, t = divmod(lane, 4)
                for w in range(4):
                    for i, (dr, dk) in table.items():
                        code = (int(words[nb, kb, lane, w]) >> (4 * i)) & 15
                        assert code == u[64 * nb + 16 * w + dr + g8, 16 * kb + 2 * t + dk]
    for nb in range(N // 64):
        for gi in range(K // g):
            for g8 in range(8):
                for j in range(8):
                    assert fs[nb, gi, g8, j] == s[64 * nb + 8 * j + g8, gi]


def test_the_order_round_trips():
    rng = np.random.default_rng(7)
    u, s = _weight(rng, 256, 384, 64)
    codes, s2 = from_fragment_order(*to_fragment_order(_pack(u), s))
    assert np.array_equal(codes, u) and np.array_equal(s2, s)


def test_unpack_word_gives_the_mma_fragments():
    """The kernels' masks (0x000F000F, 0x00F000F0, the same after >> 8) give, in order, the B fragments (b0, b1) of
    n8-tile 2w and of n8-tile 2w + 1: code pairs (k 2t, 2t+1), (2t+8, 2t+9) of row 16w + g, then of 16w + 8 + g."""
    rng = np.random.default_rng(3)
    u, s = _weight(rng, 64, 128, 32)
    words, _ = to_fragment_order(_pack(u), s)
    for lane in (0, 5, 31):
        g8, t = divmod(lane, 4)
        for w in range(4):
            pairs = unpack_word(int(words[0, 1, lane, w]))
            want = [(16 * w + g8, 0), (16 * w + g8, 8), (16 * w + 8 + g8, 0), (16 * w + 8 + g8, 8)]
            for (a, b), (row, dk) in zip(pairs, want):
                k = 16 + 2 * t + dk
                assert (a, b) == (u[row, k], u[row, k + 1])


def test_pair_interleaves_gate_and_up_in_8_row_blocks():
    I = 128
    gate = np.arange(I)[:, None] * 10
    up = gate + 1
    P = interleave_pair(gate, up)
    for T in range(I // 32):
        for q in range(4):
            for h in range(2):
                for g8 in range(8):
                    want = (up if h else gate)[32 * T + 8 * q + g8, 0]
                    assert P[64 * T + 16 * q + 8 * h + g8, 0] == want
    g2, u2 = split_pair(P)
    assert np.array_equal(g2, gate) and np.array_equal(u2, up)


def test_pair_words_hold_a_gate_row_and_the_same_up_row():
    """In P's order word w of lane (g, t) of tile T carries gate row 32 T + 8 w + g (n8-tile 2w) and the up row of
    the same output (n8-tile 2w + 1): what the SwiGLU epilogues rely on."""
    rng = np.random.default_rng(5)
    I, K, g = 128, 128, 64
    ug, sg = _weight(rng, I, K, g)
    uu, su = _weight(rng, I, K, g)
    words, _ = pair_fragment_order(_pack(ug), sg, _pack(uu), su)
    assert words.shape == (2 * I // 64, K // 16, 32, 4)
    for T in range(2 * I // 64):
        for lane in (0, 13, 30):
            g8, t = divmod(lane, 4)
            for w in range(4):
                p = unpack_word(int(words[T, 0, lane, w]))
                out = 32 * T + 8 * w + g8
                assert p[0] == (ug[out, 2 * t], ug[out, 2 * t + 1])
                assert p[2] == (uu[out, 2 * t], uu[out, 2 * t + 1])


def test_shapes_without_the_order_are_refused():
    rng = np.random.default_rng(0)
    u, s = _weight(rng, 96, 128, 32)
    with pytest.raises(ValueError, match="no fragment order"):
        to_fragment_order(_pack(u), s)
    with pytest.raises(ValueError, match="no pair order"):
        interleave_pair(np.zeros((96, 4)), np.zeros((96, 4)))
