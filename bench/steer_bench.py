#!/usr/bin/env python3
"""Per-token cost of steered generation on the CUDA backend (issue: logprobs at N = 5 ≤ 5 % of decode time).

    python3 bench/steer_bench.py FILE [--tokens 128] [--json out.json]

Times, at batch 1 on FILE (a Qwen2.5-shaped .nanoqwen; its tokenizer is used for the grammar):
  plain      Engine.generate (device sampler, decode+sample graph, 8 steps ahead of the host)
  decode     nq_decode per token (the decode-only graph, one host round trip per token), no sampling: the floor
             of any step-by-step loop
  logprobs5  decode + nq_sample_steered with top_n 5 (device: log-softmax + top-5, token and 6 values copied back)
  steer5     the same + 64 logit_bias entries + penalties
  host5      the host path (logits copied out, numpy pipeline, host sampler), for comparison
Each: ms/token over --tokens greedy tokens (ignore_eos), after one warm-up run; and the logprobs cost as
(logprobs5 - decode) / decode.

  json_NAME  decode + the llguidance mask (host) + nq_sample_steered with the mask, for each grammar of
             JSON_CASES. A grammar ends the output when it is complete, which on a random-weight file can be after
             one token (json_object: greedy picks `{}`), so each case reports its token count, its setup (call →
             first token: grammar compile, prefill, first mask, first sample) and its per-token time from the first
             token to the last (as GenerationStats.decode_s), never the two mixed; and the host's mask time per
             token (fill_bitmask + accept), which the loop overlaps with the device's forward pass.
  json_suite the per-token time over all tokens of the tests/schema_suite.py cases together.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from schema_suite import SCHEMAS  # noqa: E402

#: the grammars timed: (name, JSON schema or None for OpenAI's json_object). `long` makes ~4 tokens per item with
#: bounded strings (the mask llguidance cannot take from its precomputed string slices), so it runs to --tokens.
JSON_CASES = [("object", None),
              ("long", {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 64,
                        "maxItems": 64})] + [(f"suite{i}", s) for i, s in enumerate(SCHEMAS)]


class TimedConstraint:
    """A TokenConstraint that records the host time of fill_bitmask and accept (perf_counter seconds)."""

    def __init__(self, inner):
        self.inner = inner
        self.fill_s: list[float] = []
        self.accept_s: list[float] = []

    def fill_bitmask(self, out) -> None:
        t = time.perf_counter()
        self.inner.fill_bitmask(out)
        self.fill_s.append(time.perf_counter() - t)

    def accept(self, token_id: int) -> None:
        t = time.perf_counter()
        self.inner.accept(token_id)
        self.accept_s.append(time.perf_counter() - t)

    @property
    def complete(self) -> bool:
        return self.inner.complete


def run_json_case(make_constraint, generate, clock=time.perf_counter) -> dict:
    """One constrained generation: `make_constraint()` → a constraint, `generate(constraint)` → the token iterator.
    Returns tokens, setup_ms (call → first token, compile included), decode_ms_per_token (first → last token;
    None under 2 tokens), compile_ms, host mask (fill + accept) ms per token, first mask ms."""
    t0 = clock()
    c = TimedConstraint(make_constraint())
    t_compiled = clock()
    times = [clock() for _ in generate(c)]
    k = len(times)
    host = [f + a for f, a in zip(c.fill_s, c.accept_s)]
    return {"tokens": k, "setup_ms": (times[0] - t0) * 1e3, "compile_ms": (t_compiled - t0) * 1e3,
            "decode_ms_per_token": (times[-1] - times[0]) * 1e3 / (k - 1) if k > 1 else None,
            "first_mask_ms": c.fill_s[0] * 1e3,
            "host_mask_ms_per_token": sum(host[1:]) * 1e3 / (k - 1) if k > 1 else None,
            "host_mask_max_ms": max(host) * 1e3}


def suite_per_token(rows: dict) -> float | None:
    """ms per token over the decode intervals of all suite cases together."""
    n = sum(r["tokens"] - 1 for name, r in rows.items() if name.startswith("suite") and r["tokens"] > 1)
    t = sum(r["decode_ms_per_token"] * (r["tokens"] - 1) for name, r in rows.items()
            if name.startswith("suite") and r["tokens"] > 1)
    return t / n if n else None


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
            be._logits()              # nq_decode returns once the step is enqueued: wait for the last one
            return n

        def steered(settings, host=False):
            def run():
                gen = (Backend._generate_steered(be, prompt, SamplingParams(), n, set(), LogitsPipeline(settings))
                       if host else be._generate_steered(prompt, SamplingParams(), n, set(),
                                                         LogitsPipeline(settings)))
                return sum(1 for _ in gen)
            return run

        rng = np.random.default_rng(0)
        bias = {int(i): float(v) for i, v in zip(rng.choice(V, 64, replace=False), rng.uniform(-2, 2, 64))}
        out["plain_ms"] = timed(plain)
        out["decode_ms"] = timed(decode_only)
        out["logprobs5_ms"] = timed(steered(LogitsSettings(V, {}, 0.0, 0.0, 5)))
        out["steer5_ms"] = timed(steered(LogitsSettings(V, bias, 0.5, 0.5, 5)))
        out["host5_ms"] = timed(steered(LogitsSettings(V, {}, 0.0, 0.0, 5), host=True))
        out["logprobs5_cost_vs_decode"] = (out["logprobs5_ms"] - out["decode_ms"]) / out["decode_ms"]
        out["tokens"] = n
        try:
            import llguidance  # noqa: F401  (the grammar engine; the device image may lack it)
        except ImportError:
            print("json: skipped, llguidance is not installed (pip install llguidance, or its wheel in .whl/)")
        else:
            eng.json_constraint(None)                       # builds the grammar engine's tokenizer (seconds)
            rows = {}
            for name, schema in JSON_CASES:
                def gen(c):
                    return be._generate_steered(prompt, SamplingParams(), n, set(),
                                                LogitsPipeline(LogitsSettings(V), c))
                run_json_case(lambda: eng.json_constraint(schema), gen)      # warm-up
                rows[name] = r = run_json_case(lambda: eng.json_constraint(schema), gen)
                for k, v in r.items():
                    out[f"json_{name}_{k}"] = v
            out["json_suite_ms_per_token"] = suite_per_token(rows)
    for k, v in out.items():
        print(f"{k:>36}: {v:.4f}" if isinstance(v, float) else f"{k:>36}: {v}")
    if a.json:
        tmp = a.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(out, f, indent=2)
        os.replace(tmp, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
