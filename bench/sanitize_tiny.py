#!/usr/bin/env python3
"""A short CUDA-backend workload for compute-sanitizer: a tiny synthetic int4 model (or FILE if given);
prefill, decodes, logits_all, greedy and sampled generation, batched decode steps (plain and pipelined).

    compute-sanitizer --tool memcheck python3 bench/sanitize_tiny.py [FILE]
"""
from __future__ import annotations

import os
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))


def main() -> int:
    from nanoqwen_rt.backends.cuda import CudaBackend
    from nanoqwen_rt.sampling import SamplingParams
    with tempfile.TemporaryDirectory() as d:
        if len(sys.argv) > 1:
            path = sys.argv[1]
        else:
            from synth import make_checkpoint
            from nanoqwen_quant.convert import convert_checkpoint
            make_checkpoint(os.path.join(d, "hf"), dtype="bf16", n_layers=2, hidden=128, intermediate=256,
                            n_heads=2, n_kv_heads=1, vocab=384, seed=4)
            path = convert_checkpoint(os.path.join(d, "hf"), os.path.join(d, "m.nanoqwen"), quant="int4",
                                      group_size=64)
        # 256 positions: 4 decode splits, launched as one cluster of 4 (sm_90); a 97-token prompt spreads its keys
        # over 2 of them, so the decode steps merge in distributed shared memory (attention.cu)
        with CudaBackend(path, max_context=256) as be:
            ids = np.arange(3, 100, dtype=np.int32) % be.config.vocab_rows
            be.prefill(ids)
            for t in range(5):
                be.decode(t)
            be.logits_all(ids)
            g = list(be.generate_ids(ids, SamplingParams(temperature=0.0), 16))
            s = list(be.generate_ids(ids, SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=1), 16))
            print("greedy", g[:8], "sampled", s[:8])
            # the batched step (attn_decode_kernel, the few-token GEMMs, the dense lm_head GEMM where it is f16):
            # 5 sessions at different positions, 3 steps (run as is, captured, replayed), then 2 pipelined steps
            import ctypes
            from nanoqwen_rt.backends.cuda.abi import check
            be.reset()
            sessions = [be.session] + [be.new_session(96) for _ in range(4)]
            try:
                for i, sess in enumerate(sessions):
                    p = np.ascontiguousarray(ids[:5 + 7 * i], dtype=np.int32)
                    check(be._lib, "nq_prefill", sess, p.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), p.shape[0],
                          what="prefill")
                toks = np.arange(len(sessions), dtype=np.int32)
                for _ in range(3):
                    toks, _ = be.decode_batch(sessions, toks)
                be.decode_batch_launch(sessions, toks)
                be.decode_batch_launch(sessions, toks, np.arange(len(sessions), dtype=np.int32))
                a, b = be.decode_batch_wait(len(sessions)), be.decode_batch_wait(len(sessions))
                print("batched", toks.tolist(), a.tolist(), b.tolist())
            finally:
                for sess in sessions[1:]:
                    be.free_session(sess)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
