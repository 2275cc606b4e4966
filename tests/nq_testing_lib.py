"""Loader of libnanoqwen_testing (csrc/include/nanoqwen_testing.h): the kernel test and benchmark entry points,
built by scripts/build_native.sh into build/lib/ beside the product library. Used by the GPU kernel tests and the
kernel benchmarks (bench/gpu_kernels_bench.py, bench/attn_bench.py add tests/ to sys.path for it)."""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

from nanoqwen_rt.backends.cuda.abi import NqSampling

ROOT = Path(__file__).resolve().parent.parent

_I32, _F32 = ctypes.c_int32, ctypes.c_float
_I32P, _F32P, _U32P, _U16P, _U8P = map(ctypes.POINTER, (ctypes.c_int32, ctypes.c_float, ctypes.c_uint32, ctypes.c_uint16,
                                                       ctypes.c_uint8))

# name -> (restype, argtypes), as declared in nanoqwen_testing.h
SIGNATURES = {
    "nq_last_error": (ctypes.c_char_p, []),
    # the int4 entry points take zeros (uint8 (N, K/g) or None: layout 1) after each weight's scales
    "nq_test_gemv_int4": (ctypes.c_int, [_U32P, _U16P, _U8P, _I32, _I32, _I32, _F32P, _F32P, _F32, _F32P]),
    "nq_test_gemv_int4_mode": (ctypes.c_int, [_U32P, _U16P, _U8P, _U32P, _U16P, _U8P, _I32, _I32, _I32, _F32P, _F32P,
                                              _F32, _I32, _F32P]),
    "nq_test_gemv_dense": (ctypes.c_int, [_U16P, _I32, _I32, _I32, _F32P, _F32P]),
    "nq_test_gemm_int4": (ctypes.c_int, [_U32P, _U16P, _U8P, _I32, _I32, _I32, _F32P, _I32, _F32P]),
    "nq_test_gemm_dense": (ctypes.c_int, [_U16P, _I32, _I32, _I32, _F32P, _I32, _I32, _F32P]),
    "nq_test_gemm_int4_multi": (ctypes.c_int, [_I32, ctypes.POINTER(_U32P), ctypes.POINTER(_U16P), ctypes.POINTER(_U8P),
                                               _I32P, _I32, _I32, _F32P, _I32, _I32, ctypes.POINTER(_F32P), _F32P,
                                               _I32, _I32]),
    "nq_test_gemm_swiglu": (ctypes.c_int, [_U32P, _U16P, _U8P, _U32P, _U16P, _U8P, _I32, _I32, _I32, _F32P, _I32,
                                           _I32, _U16P]),
    # the same over the fragment order (repacked on the device): no zeros arguments (layout 1 only)
    "nq_test_gemv_int4_frag": (ctypes.c_int, [_U32P, _U16P, _I32, _I32, _I32, _F32P, _F32P, _F32, _F32P]),
    "nq_test_gemv_int4_mode_frag": (ctypes.c_int, [_U32P, _U16P, _U32P, _U16P, _I32, _I32, _I32, _F32P, _F32P, _F32,
                                                   _I32, _F32P]),
    "nq_test_gemv_int4_multi_frag": (ctypes.c_int, [_I32, ctypes.POINTER(_U32P), ctypes.POINTER(_U16P), _I32P, _I32,
                                                    _I32, _F32P, _F32P, _F32, ctypes.POINTER(_F32P), _F32P]),
    "nq_test_gemm_int4_multi_frag": (ctypes.c_int, [_I32, ctypes.POINTER(_U32P), ctypes.POINTER(_U16P), _I32P, _I32,
                                                    _I32, _F32P, _I32, _I32, ctypes.POINTER(_F32P), _F32P, _I32,
                                                    _I32]),
    "nq_test_gemm_swiglu_frag": (ctypes.c_int, [_U32P, _U16P, _U32P, _U16P, _I32, _I32, _I32, _F32P, _I32, _U16P]),
    "nq_test_fragment_order_available": (ctypes.c_int, []),
    "nq_test_frag_repack": (ctypes.c_int, [_U32P, _U16P, _U32P, _U16P, _I32, _I32, _I32, _U32P, _U16P]),
    "nq_test_attention": (ctypes.c_int, [_F32P, _F32P, _F32P] + [_I32] * 5 + [_F32P]),
    "nq_test_attention_prefill": (ctypes.c_int, [_F32P, _F32P, _F32P] + [_I32] * 6 + [_F32P]),
    "nq_test_attention_batch": (ctypes.c_int, [_F32P, _F32P, _F32P, _I32P] + [_I32] * 6 + [_F32P]),
    "nq_test_sample": (ctypes.c_int, [_F32P, _I32, ctypes.POINTER(NqSampling), ctypes.c_uint64, _I32P]),
    "nq_test_check_pages": (ctypes.c_int, [_I32, _I32, _I32, _I32P, _I32, _I32]),
    "nq_test_frag_plan": (ctypes.c_int, [_I32] * 5 + [_I32P]),
    "nq_bench_gemv_int4": (ctypes.c_int, [_I32] * 4 + [_F32P]),
    "nq_bench_gemv_int4_mode": (ctypes.c_int, [_I32] * 5 + [_F32P]),
    "nq_bench_gemv_int4_layout": (ctypes.c_int, [_I32] * 6 + [_F32P]),
    "nq_bench_gemv_int4_frag": (ctypes.c_int, [_I32] * 5 + [_F32P]),   # microseconds (nq_bench_gemv_int4_mode: ms)
    "nq_bench_gemm_int4": (ctypes.c_int, [_I32] * 5 + [_F32P]),
    "nq_bench_gemm_int4_multi": (ctypes.c_int, [_I32] * 6 + [_F32P]),
    "nq_bench_gemm_int4_layout": (ctypes.c_int, [_I32] * 7 + [_F32P]),
    "nq_bench_gemm_int4_frag": (ctypes.c_int, [_I32] * 5 + [_F32P]),
    "nq_bench_gemm_int4_frag_layer": (ctypes.c_int, [_I32] * 3 + [_F32P, _F32P]),
    "nq_bench_gemm_int4_frag_plans": (ctypes.c_int, [_I32] * 4 + [_F32P]),
    "nq_bench_gemv_int4_frag_plans": (ctypes.c_int, [_I32] * 4 + [_F32P]),
    "nq_bench_mma_peak": (ctypes.c_int, [_I32, _I32, _F32P]),
    "nq_bench_attention": (ctypes.c_int, [_I32] * 8 + [_F32P]),
    "nq_bench_attention_batch": (ctypes.c_int, [_I32] * 8 + [_F32P]),
    "nq_bench_read_bandwidth": (ctypes.c_int, [ctypes.c_uint64, _I32, _F32P]),
}


def testing_library_path() -> Path:
    env = os.environ.get("NANOQWEN_TESTING_LIB")
    return Path(env) if env else ROOT / "build" / "lib" / "libnanoqwen_testing.so"


def load_testing_library():
    """The testing library as a CDLL with every entry point's signature set; OSError / AttributeError when it is
    missing or lacks an entry point (build it with scripts/build_native.sh)."""
    lib = ctypes.CDLL(str(testing_library_path()))
    for name, (res, args) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    return lib


def _kernels_h_constants(*names) -> dict:
    """The integer constants `names` of csrc/src/kernels.h ("constexpr int NAME = A;" or "= A * B;"); RuntimeError
    where one is missing"""
    import re
    text = (ROOT / "csrc" / "src" / "kernels.h").read_text()
    out = {}
    for name in names:
        m = re.search(rf"constexpr int {name} = (\d+)(?: \* (\d+))?;", text)
        if not m:
            raise RuntimeError(f"{name} not found in csrc/src/kernels.h")
        out[name] = int(m.group(1)) * (int(m.group(2)) if m.group(2) else 1)
    return out


def short_context_keys(head_dim: int) -> int:
    """kAttnMaxCluster x attn_cluster_keys_per_block(head_dim) (= kAttnClusterKeyDimsPerBlock / head_dim), read from
    csrc/src/kernels.h (the one place they are defined): the most keys a decode step of a session's short-context
    graphs has for that head size (session.cu; attention in clusters on sm_90)"""
    k = _kernels_h_constants("kAttnMaxCluster", "kAttnClusterKeyDimsPerBlock")
    return k["kAttnMaxCluster"] * (k["kAttnClusterKeyDimsPerBlock"] // head_dim)


def _driver_attributes(*attrs):
    """Device 0's CUdevice_attribute values `attrs` through the driver API (libcuda), or None where they cannot be
    read."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    dev = ctypes.c_int()
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGet(ctypes.byref(dev), 0) != 0:
        return None
    out = []
    for attr in attrs:
        v = ctypes.c_int()
        if cuda.cuDeviceGetAttribute(ctypes.byref(v), attr, dev) != 0:
            return None
        out.append(v.value)
    return tuple(out)


def driver_compute_capability():
    """(major, minor) of device 0 through the driver API (libcuda), or None where it cannot be read."""
    return _driver_attributes(75, 76)   # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR


def driver_sm_count():
    """Device 0's multiprocessor count through the driver API (libcuda), or None where it cannot be read."""
    got = _driver_attributes(16)   # CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
    return got[0] if got else None


def fragment_order_available(lib) -> bool:
    """Whether the library uses the INT4 fragment order here (nq_test_fragment_order_available: Hopper with the sm_90a
    build). On a GPU of compute capability 9.x it must: a shipped build has sm_90a code, so a refusal there fails."""
    available = bool(lib.nq_test_fragment_order_available())
    cc = driver_compute_capability()
    assert available or cc is None or cc[0] != 9, f"compute capability {cc}, yet the library has no fragment order"
    return available


def require_fragment_order(lib) -> None:
    """Skip the calling test where the library does not use the INT4 fragment order (fragment_order_available): the
    *_frag entry points run only where the loader repacks."""
    import pytest
    if not fragment_order_available(lib):
        pytest.skip("the INT4 fragment order runs on Hopper GPUs with the sm_90a build only")


def check(lib, rc: int) -> None:
    """Assert a testing-library call succeeded, with its message (read on this thread: it is thread-local)."""
    assert rc == 0, lib.nq_last_error().decode()
