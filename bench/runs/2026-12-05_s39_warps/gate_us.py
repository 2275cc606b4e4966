#!/usr/bin/env python3
"""The decode gate/up GEMV (SwiGLU) of one Qwen2.5 size alone, through the product's gemv() and so frag_plan (with the
warps39 variant, NQ_FRAG_PLAN picks the plan), in microseconds; the same timing as bench/frag_bench.py's "product"
column (nq_bench_gemv_int4_frag: back-to-back launches over rotating copies of the weights).

    NANOQWEN_TESTING_LIB=.v/warps39/libnanoqwen_testing.so NQ_FRAG_PLAN=2:432:5120=w5s1 python3 gate_us.py 14B LABEL
"""
import ctypes
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "tests"), os.path.join(_ROOT, "bench")]

from frag_bench import MODES, gemv_rows  # noqa: E402
from nq_testing_lib import load_testing_library  # noqa: E402

shape, label = sys.argv[1], sys.argv[2]
N, K = gemv_rows(shape)["gate"]
lib = load_testing_library()
us = ctypes.c_float()
if lib.nq_bench_gemv_int4_frag(N, K, 128, MODES["gate"], 200, ctypes.byref(us)) != 0:
    sys.exit(f"gate_us: {lib.nq_last_error().decode()}")
print(f"gate {shape} {label} ({os.environ.get('NQ_FRAG_PLAN', '') or 'rule'}): {us.value:.2f} us")
