#!/usr/bin/env python3
"""Per-token cost of steered generation on the CUDA backend (issue: logprobs at N = 5 ≤ 5 % of decode time).

    python3 bench/steer_bench.py FILE [--tokens 128] [--json out.json]

Times, at batch 1 on FILE (a Qwen2.5-shaped .nanoqwen; its tokenizer is used for the grammar):
  plain      Engine.generate (device sampler, decode+sample graph, 8 steps ahead of the host)
  decode     nq_decode per token (the decode-only graph, one host round trip per token), no sampling: the floor
             of any step-by-step loop
  logprobs5  decode + nq_sample_steered with top_n 5 (device: log-softmax + top-5, token and 6 values copied back)
  steer5     the same + 64 logit_bias entries + penalties
  json       decode + the llguidance mask (host) + nq_sample_steered with the mask (json_object grammar)
  host5      the host path (logits copied out, numpy pipeline, host sampler), for comparison
Each: ms/token over --tokens greedy tokens (ignore_eos), after one warm-up run; and the logprobs cost as
(logprobs5 - decode) / decode.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> int:
    import numpy as np
    from nanoqwen_rt import Engine
    from nanoqwen_rt.backends.base import Backend
    from nanoqwen_rt.logits import LogitsPipeline, LogitsSettings
    from nanoqwen_rt.sampling import SamplingParams

    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    n = a.tokens
    out = {}
    with Engine(a.file, device="cuda", max_context=1024) as eng:
        be = eng.backend
        V = eng.config.vocab_rows
        prompt = np.array(eng.tokenizer.encode("def quicksort(xs):\n"), dtype=np.int32)

        def timed(fn):
            fn()
            t = time.perf_counter()
            k = fn()
            return (time.perf_counter() - t) * 1e3 / k

        def plain():
            return sum(1 for _ in be.generate_ids(prompt, SamplingParams(), n, ()))

        from nanoqwen_rt.backends.cuda.abi import check

        def decode_only():
            be.reset()
            be._prefill(prompt)
            for i in range(n):
                check(be._lib, "nq_decode", be._live(), 17 + i, what="decode")
            return n

        def steered(settings, constraint=None, host=False):
            def run():
                c = constraint() if constraint else None
                gen = (Backend._generate_steered(be, prompt, SamplingParams(), n, set(), LogitsPipeline(settings, c))
                       if host else be._generate_steered(prompt, SamplingParams(), n, set(),
                                                         LogitsPipeline(settings, c)))
                return sum(1 for _ in gen)
            return run

        rng = np.random.default_rng(0)
        bias = {int(i): float(v) for i, v in zip(rng.choice(V, 64, replace=False), rng.uniform(-2, 2, 64))}
        out["plain_ms"] = timed(plain)
        out["decode_ms"] = timed(decode_only)
        out["logprobs5_ms"] = timed(steered(LogitsSettings(V, {}, 0.0, 0.0, 5)))
        out["steer5_ms"] = timed(steered(LogitsSettings(V, bias, 0.5, 0.5, 5)))
        try:
            import llguidance  # noqa: F401  (the grammar engine; the device image may lack it)
            out["json_ms"] = timed(steered(LogitsSettings(V), constraint=lambda: eng.json_constraint(None)))
        except ImportError:
            print("json: skipped, llguidance is not installed (pip install llguidance, or its wheel in .whl/)")
        out["host5_ms"] = timed(steered(LogitsSettings(V, {}, 0.0, 0.0, 5), host=True))
        out["logprobs5_cost_vs_decode"] = (out["logprobs5_ms"] - out["decode_ms"]) / out["decode_ms"]
        out["tokens"] = n
    for k, v in out.items():
        print(f"{k:>26}: {v:.4f}" if isinstance(v, float) else f"{k:>26}: {v}")
    if a.json:
        tmp = a.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(out, f, indent=2)
        os.replace(tmp, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
