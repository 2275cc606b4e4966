#!/usr/bin/env python3
"""A short CUDA-backend workload for compute-sanitizer: a tiny synthetic int4 model (or FILE if given);
prefill, decodes, logits_all, greedy and sampled generation.

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
        with CudaBackend(path, max_context=96) as be:
            ids = np.arange(3, 40, dtype=np.int32) % be.config.vocab_rows
            be.prefill(ids)
            for t in range(5):
                be.decode(t)
            be.logits_all(ids)
            g = list(be.generate_ids(ids, SamplingParams(temperature=0.0), 16))
            s = list(be.generate_ids(ids, SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=1), 16))
            print("greedy", g[:8], "sampled", s[:8])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
