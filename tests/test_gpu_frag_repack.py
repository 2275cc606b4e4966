"""The device repack into the INT4 fragment order (csrc/src/int4_frag.cu, run by the loader on Hopper) bit for bit
against the numpy reference tests/fragment_order.py, single weights and the gate/up pair, on Qwen2.5 shapes (GPU
only; skips where the library does not use the order)."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from fragment_order import pair_fragment_order, to_fragment_order
from nq_testing_lib import check, require_fragment_order
from test_gpu_kernels import random_int4

pytestmark = pytest.mark.gpu

_U32P, _U16P = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint16)


@pytest.fixture(scope="module")
def lib():
    from nq_testing_lib import load_testing_library
    lib = load_testing_library()
    require_fragment_order(lib)   # the repack runs where the loader uses it
    return lib


def _p(a, t):
    return a.ctypes.data_as(t)


def _repack(lib, q, s, qu=None, su=None):
    N, K = q.shape[0], q.shape[1] * 8
    rows = 2 * N if qu is not None else N
    words = np.full(rows * K // 8, 0xDEADBEEF, dtype=np.uint32)           # poisoned: every word must be written
    scales = np.full(rows * s.shape[1], 0x7E00, dtype=np.uint16)       # f16 NaN
    g = K // s.shape[1]
    check(lib, lib.nq_test_frag_repack(_p(q, _U32P), _p(s.view(np.uint16), _U16P),
                                       None if qu is None else _p(qu, _U32P),
                                       None if su is None else _p(su.view(np.uint16), _U16P), N, K, g,
                                       _p(words, _U32P), _p(scales, _U16P)))
    return words, scales


# (N, K, group): the tiny model's shapes, 7B q/k/v, o, gate/up and down, every group size
CASES = [(128, 256, 32), (768, 256, 64), (512, 3584, 128), (3584, 3584, 128), (18944, 3584, 128),
         (3584, 18944, 128), (256, 512, 256)]


@pytest.mark.parametrize("N,K,g", CASES)
def test_repack_equals_the_reference(lib, N, K, g):
    rng = np.random.default_rng(N * 7 + K + g)
    _, q, s = random_int4(rng, N, K, g)
    words, scales = _repack(lib, q, s)
    ref_w, ref_s = to_fragment_order(q, s)
    assert np.array_equal(words, ref_w.reshape(-1))
    assert np.array_equal(scales, ref_s.view(np.uint16).reshape(-1))


@pytest.mark.parametrize("I,K,g", [(768, 256, 64), (18944, 3584, 128), (128, 512, 32)])
def test_pair_repack_equals_the_reference(lib, I, K, g):
    rng = np.random.default_rng(I + K * 3 + g)
    _, qg, sg = random_int4(rng, I, K, g)
    _, qu, su = random_int4(rng, I, K, g)
    words, scales = _repack(lib, qg, sg, qu, su)
    ref_w, ref_s = pair_fragment_order(qg, sg, qu, su)
    assert np.array_equal(words, ref_w.reshape(-1))
    assert np.array_equal(scales, ref_s.view(np.uint16).reshape(-1))


def test_a_shape_without_the_order_is_refused(lib):
    rng = np.random.default_rng(0)
    _, q, s = random_int4(rng, 96, 256, 32)                              # N % 64 != 0
    words = np.zeros(96 * 256 // 8, dtype=np.uint32)
    scales = np.zeros(96 * 256 // 32, dtype=np.uint16)
    rc = lib.nq_test_frag_repack(_p(q, _U32P), _p(s.view(np.uint16), _U16P), None, None, 96, 256, 32,
                                 _p(words, _U32P), _p(scales, _U16P))
    assert rc != 0 and b"no fragment order" in lib.nq_last_error()
