#!/usr/bin/env python3
"""Time the CPU backend the way llama-bench times llama.cpp: a prompt of P random token ids (prefill, "pp") and N
decode steps after it ("tg"), each repeated R times on a fresh sequence; print one JSON line per repetition.

    python3 bench/cpu_speed.py FILE.nanoqwen [-p 128] [-n 64] [-r 3] [--seed 0] [--numerics fast|oracle]

--numerics: the CPU backend's numerics (nanoqwen_rt.backends.cpu.backend): "fast" (default: what Engine serves
with) or "oracle" (float32 throughout: what the tests compare against).

Figures per repetition: prefill_s (the P-token prompt through every layer and the lm_head of its last position),
decode_ms_per_token (mean over the N steps, each a full forward + lm_head; greedy argmax feeds the next id, as
llama-bench feeds its own), and the 1-minute load average of the machine when the repetition ended (the machine
is shared: only paired ratios against a peer run in the same sitting mean anything). Load / JIT time is excluded,
as llama-bench excludes its model load; like llama-bench, one untimed warm-up repetition runs first (it faults the
mmap'd weights into the process).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # repo root, when not installed

from nanoqwen_rt.backends.cpu import CPUBackend  # noqa: E402
from nanoqwen_rt.backends.cpu.backend import NUMERICS  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("-p", "--prompt-tokens", type=int, default=128)
    ap.add_argument("-n", "--new-tokens", type=int, default=64)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--numerics", choices=NUMERICS, default="fast")
    a = ap.parse_args()
    if a.prompt_tokens < 1 or a.new_tokens < 1 or a.repetitions < 1:
        print("error: -p, -n and -r must be >= 1", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    be = CPUBackend(a.file, max_context=a.prompt_tokens + a.new_tokens + 8, numerics=a.numerics)
    load_s = time.perf_counter() - t0
    rng = np.random.default_rng(a.seed)
    vocab = be.config.vocab_rows
    try:
        for rep in range(-1, a.repetitions):
            ids = rng.integers(0, min(vocab, 151643), size=a.prompt_tokens).astype(np.int32)
            be.reset()
            t0 = time.perf_counter()
            logits = be.prefill(ids)
            t1 = time.perf_counter()
            tok = int(np.argmax(logits))
            for _ in range(a.new_tokens):
                tok = int(np.argmax(be.decode(tok)))
            t2 = time.perf_counter()
            if rep < 0:
                continue
            print(json.dumps({"runtime": "nanoqwen-cpu", "numerics": a.numerics, "rep": rep, "prompt_tokens": a.prompt_tokens,
                              "new_tokens": a.new_tokens, "prefill_s": round(t1 - t0, 4),
                              "decode_ms_per_token": round((t2 - t1) * 1e3 / a.new_tokens, 3),
                              "load_s": round(load_s, 3), "loadavg_1m": os.getloadavg()[0]}), flush=True)
    finally:
        be.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
