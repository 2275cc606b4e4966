#!/usr/bin/env python3
"""The host's share of JSON-constrained decoding on the CUDA path, measured on a CPU-only machine: the product's
steered loop (CudaBackend._generate_steered, with llguidance on Qwen2.5's full tokenizer) driven against a stand-in
for libnanoqwen whose device work takes simulated time.

    python3 bench/grammar_host_bench.py [--step-ms 2.1505] [--sample-ms 0.062] [--tokens 128] [--decode-waits]
                                        [--code DIR] [--json out.json]

The stand-in (SimulatedLibrary) keeps a virtual clock: host time is the real time spent outside it, device work is
simulated: nq_decode occupies the device --step-ms (default: the decode ms/token of the 2026-12-01 H200 run,
bench/runs/2026-12-01_s4_steer7b.json), nq_sample_steered --sample-ms (that run's logprobs5 - decode), and every
call waits for the device first, as libnanoqwen's do. --decode-waits makes nq_decode also wait at its end (the
library before the change that lets it return once the step is enqueued). The stand-in's own work (picking a
token: the argmax under the mask of fresh N(0, 3²) logits each step, what a random-weight file such as
bench/make_7b_file.py's gives) is taken off the clock. So the per-token time printed is a prediction of the GPU's
json figure for these token streams: device step + sample + whatever host work the loop does not overlap.
--code DIR imports nanoqwen_rt from DIR instead (e.g. an export of an older commit, to time its loop).

Per grammar of bench/steer_bench.py's JSON_CASES (each run --repeats times on the same token stream; medians, so
that other jobs on a shared machine disturb it less): tokens, compile, first mask, host mask (fill + accept) per
token, the simulated per-token time (first → last token), and the host time it exposes: simulated per-token time
- step - sample.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from types import SimpleNamespace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Qwen2.5's tokenizer files: shared/ beside the checkout or beside the folder holding it, else the copy in bench/
TOKENIZER_DIRS = [os.path.join(ROOT, "..", "shared", "qwen2-tokenizer"),
                  os.path.join(ROOT, "..", "..", "shared", "qwen2-tokenizer"),
                  os.path.join(ROOT, "bench", "assets", "qwen2-tokenizer")]
VOCAB_ROWS = 151936              # Qwen2.5's embedding rows (151,665 tokens, padded)
STOP_IDS = [151645, 151643]      # <|im_end|>, <|endoftext|>
LOGIT_STD = 3.0                  # bench/make_7b_file.py's logits of a random-weight file


class SimulatedLibrary:
    """The libnanoqwen entry points CudaBackend._generate_steered calls, with device time simulated (see above)."""

    def __init__(self, step_s: float, sample_s: float, decode_waits: bool, vocab_rows: int, seed: int):
        import numpy as np
        self.np = np
        self.step_s, self.sample_s, self.decode_waits = step_s, sample_s, decode_waits
        self.V = vocab_rows
        self.rng = np.random.default_rng(seed)
        self.busy_until = 0.0    # virtual time the device is idle from
        self.lag = 0.0           # virtual seconds the host waited
        self.off = 0.0           # real seconds spent inside the stand-in (off the clock)
        self._t_enter = None

    def now(self) -> float:
        return (self._t_enter if self._t_enter is not None else time.perf_counter()) - self.off + self.lag

    def _wait(self) -> None:
        n = self.now()
        if self.busy_until > n:
            self.lag += self.busy_until - n

    def _launch(self, seconds: float) -> None:
        self.busy_until = max(self.now(), self.busy_until) + seconds

    def _call(fn):
        def wrapped(self, *args):
            self._t_enter = time.perf_counter()
            try:
                return fn(self, *args)
            finally:
                self.off += time.perf_counter() - self._t_enter
                self._t_enter = None
        return wrapped

    @_call
    def nq_session_set_sampling(self, sess, sp):
        self._wait()
        return 0

    @_call
    def nq_session_reset(self, sess):
        self._wait()
        return 0

    @_call
    def nq_prefill(self, sess, ids, n):
        self._wait()
        return 0

    @_call
    def nq_decode(self, sess, tok):
        self._wait()
        self._launch(self.step_s)
        if self.decode_waits:
            self._wait()
        return 0

    @_call
    def nq_sample_steered(self, sess, bias_ids, bias_vals, n_bias, mask, n_words, presence, frequency, top_n,
                          out_tok, out_lp, top_ids, top_lps, n_top):
        np = self.np
        self._wait()
        self._launch(self.sample_s)
        self._wait()
        x = self.rng.standard_normal(self.V, dtype=np.float32) * LOGIT_STD          # (V,)
        if mask is not None:
            words = np.ctypeslib.as_array(mask, shape=(n_words,))
            allowed = np.unpackbits(words.view(np.uint8), bitorder="little", count=self.V).view(bool)
            x[~allowed] = -np.inf
        out_tok._obj.value = int(np.argmax(x))
        return 0

    def nq_last_error(self):
        return b""

    def nq_session_free(self, sess):
        pass

    def nq_model_free(self, model):
        pass


def qwen25_tokenizer_json() -> str:
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from make_7b_file import build_qwen2_tokenizer_json
    for d in TOKENIZER_DIRS:
        if all(os.path.isfile(os.path.join(d, f)) for f in ("vocab.json", "merges.txt")):
            return build_qwen2_tokenizer_json(d)
    raise SystemExit(f"no Qwen2.5 tokenizer files in {', '.join(TOKENIZER_DIRS)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--step-ms", type=float, default=2.1505)
    ap.add_argument("--sample-ms", type=float, default=0.062)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--decode-waits", action="store_true")
    ap.add_argument("--code", default=None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    sys.path.insert(0, ROOT)
    if a.code:
        sys.path.insert(0, os.path.abspath(a.code))
    import numpy as np
    import nanoqwen_rt
    from nanoqwen_rt.backends.cuda.backend import CudaBackend
    from nanoqwen_rt.grammar import GrammarCompiler
    from nanoqwen_rt.logits import LogitsPipeline, LogitsSettings
    from nanoqwen_rt.sampling import SamplingParams
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from steer_bench import JSON_CASES, run_json_case, suite_per_token

    t = time.perf_counter()
    compiler = GrammarCompiler(qwen25_tokenizer_json(), VOCAB_ROWS, STOP_IDS)
    print(f"nanoqwen_rt from {os.path.dirname(nanoqwen_rt.__file__)}; grammar tokenizer built in "
          f"{time.perf_counter() - t:.1f} s; device step {a.step_ms} ms, sample {a.sample_ms} ms, "
          f"nq_decode {'waits for the step' if a.decode_waits else 'returns once enqueued'}")
    prompt = np.array([750, 3974, 6860, 53322, 982], dtype=np.int32)        # "def quicksort(xs):\n"
    rows = {}
    for i, (name, schema) in enumerate(JSON_CASES):
        lib = SimulatedLibrary(a.step_ms * 1e-3, a.sample_ms * 1e-3, a.decode_waits, VOCAB_ROWS, seed=i)
        be = object.__new__(CudaBackend)
        be._lib, be._sess, be._model = lib, ctypes.c_void_p(1), ctypes.c_void_p()
        be.config = SimpleNamespace(vocab_rows=VOCAB_ROWS)
        be.max_context = 4096

        def gen(c):
            return be._generate_steered(prompt, SamplingParams(), a.tokens, set(),
                                        LogitsPipeline(LogitsSettings(VOCAB_ROWS), c))
        run_json_case(lambda: compiler.json(schema), gen, clock=lib.now)      # warm-up
        runs = []
        for _ in range(a.repeats):
            lib.rng = np.random.default_rng(i)                                # the same token stream each time
            runs.append(run_json_case(lambda: compiler.json(schema), gen, clock=lib.now))
        r = {k: (None if runs[0][k] is None else float(np.median([x[k] for x in runs]))) for k in runs[0]}
        r["tokens"] = runs[0]["tokens"]
        r["exposed_host_ms_per_token"] = (None if r["decode_ms_per_token"] is None
                                          else r["decode_ms_per_token"] - a.step_ms - a.sample_ms)
        rows[name] = r
        fmt = lambda v: "   -  " if v is None else f"{v:6.3f}"                # noqa: E731
        print(f"{name:8s} tokens {r['tokens']:4d}  compile {r['compile_ms']:6.3f} ms  first mask "
              f"{r['first_mask_ms']:6.3f} ms  host mask/token {fmt(r['host_mask_ms_per_token'])} ms "
              f"(max {r['host_mask_max_ms']:6.3f})  simulated ms/token {fmt(r['decode_ms_per_token'])}, "
              f"host exposed {fmt(r['exposed_host_ms_per_token'])}")
    out = {"step_ms": a.step_ms, "sample_ms": a.sample_ms, "decode_waits": a.decode_waits, "repeats": a.repeats,
           "code": os.path.dirname(nanoqwen_rt.__file__), "cases": rows,
           "suite_ms_per_token": suite_per_token(rows)}
    print(f"suite: simulated {out['suite_ms_per_token']:.3f} ms/token, host exposed "
          f"{out['suite_ms_per_token'] - a.step_ms - a.sample_ms:.3f}")
    if a.json:
        tmp = a.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(out, f, indent=2)
        os.replace(tmp, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
