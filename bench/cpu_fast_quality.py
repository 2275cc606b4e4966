#!/usr/bin/env python3
"""What the CPU backend's fast numerics cost in quality, against its float32 oracle, on the same file and text.

    python3 bench/cpu_fast_quality.py FILE.nanoqwen [--tokens 1024] [--window 256] [--gen 48] [--json OUT.json]

Text: nanoqwen-verify --eval's held-out text (nanoqwen_quant/data/eval_heldout.txt), tokenized with the file's own
tokenizer, cut into windows of --window tokens (the first --tokens tokens). Per window: the oracle's logits of every
position (teacher-forced, CPUBackend(numerics="oracle").logits_all) and the fast numerics' logits computed token by
token (prefill of one token, then decode: the one-token products the fast numerics change). Reported: perplexity of
each, mean and 99th-percentile KL(oracle || fast) per token, top-1 agreement; and greedy continuations (--gen tokens,
no stop ids) of a few code prompts from each, with the number of tokens until they first differ.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nanoqwen_rt.backends.cpu import CPUBackend  # noqa: E402
from nanoqwen_rt.sampling import SamplingParams  # noqa: E402
from nanoqwen_rt.tokenizer import Tokenizer  # noqa: E402

PROMPTS = ["def fibonacci(n):", "import os\n\nclass Config:\n    def __init__(self", "def quicksort(xs):"]


def _log_softmax(a: np.ndarray) -> np.ndarray:
    a = a.astype(np.float64)
    a = a - a.max(axis=-1, keepdims=True)
    return a - np.log(np.exp(a).sum(axis=-1, keepdims=True))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--gen", type=int, default=48)
    ap.add_argument("--json")
    a = ap.parse_args()
    from nanoqwen_format import open_file
    with open_file(a.file) as f:
        tok = Tokenizer.from_file(f)
    text = (ROOT / "nanoqwen_quant" / "data" / "eval_heldout.txt").read_text()
    ids = np.array(tok.encode(text)[:a.tokens], dtype=np.int32)
    kl, top1, nll_o, nll_f = [], [], [], []
    t0 = time.perf_counter()
    with CPUBackend(a.file, max_context=a.window + a.gen + 64, numerics="oracle") as o, \
            CPUBackend(a.file, max_context=a.window + a.gen + 64, numerics="fast") as fb:
        for w0 in range(0, len(ids) - 1, a.window):
            w = ids[w0:w0 + a.window + 1]
            if len(w) < 2:
                break
            lo = o.logits_all(w[:-1])
            fb.reset()
            lf = np.array([fb.prefill(w[:1])] + [fb.decode(int(t)) for t in w[1:-1]])
            po, pf = _log_softmax(lo), _log_softmax(lf)
            kl.append((np.exp(po) * (po - pf)).sum(axis=-1))
            top1.append(lo.argmax(-1) == lf.argmax(-1))
            r = np.arange(len(w) - 1)
            nll_o.append(-po[r, w[1:]])
            nll_f.append(-pf[r, w[1:]])
            print(f"[fast-quality] window at {w0}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        kl, top1 = np.concatenate(kl), np.concatenate(top1)
        ppl_o, ppl_f = float(np.exp(np.concatenate(nll_o).mean())), float(np.exp(np.concatenate(nll_f).mean()))
        greedy = []
        for p in PROMPTS:
            pid = tok.encode(p)
            outs = [list(be.generate_ids(pid, SamplingParams(temperature=0), a.gen, [])) for be in (o, fb)]
            same = next((i for i, (x, y) in enumerate(zip(*outs)) if x != y), len(outs[0]))
            greedy.append({"prompt": p, "oracle": tok.decode(outs[0]), "fast": tok.decode(outs[1]),
                           "tokens_until_first_difference": same, "of": len(outs[0])})
        describe = fb.describe()
    res = {"file": os.path.basename(a.file), "fast": describe, "tokens": int(len(kl)),
           "ppl_oracle": ppl_o, "ppl_fast": ppl_f, "ppl_rel": ppl_f / ppl_o - 1,
           "kl_mean": float(kl.mean()), "kl_p99": float(np.percentile(kl, 99)), "top1_agreement": float(top1.mean()),
           "greedy": greedy}
    print(json.dumps({k: v for k, v in res.items() if k != "greedy"}, indent=1))
    for g in greedy:
        print(f"--- {g['prompt']!r}: identical for {g['tokens_until_first_difference']}/{g['of']} tokens")
        print(f"oracle: {g['oracle']!r}\nfast:   {g['fast']!r}")
    if a.json:
        with open(a.json + ".tmp", "w") as fh:
            json.dump(res, fh, indent=1)
        os.replace(a.json + ".tmp", a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
