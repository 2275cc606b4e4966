"""Time to first token of a request whose long prompt prefix is in the KV prefix cache, against the first request
that computed it (Engine.submit: the CPU backend with the embedded model converted to INT4, or the CUDA backend
with any file, e.g. the 7B-shaped one of bench/make_7b_file.py).

    python bench/prefix_cache_ttft.py [--prefix-tokens 600] [--rounds 5] [--json out.json]
    python bench/prefix_cache_ttft.py --device cuda --file 7b.nanoqwen --prefix-tokens 2000 [--max-context 8192]

Each round uses a fresh prefix (other text, so no round hits an earlier one): request A = prefix + suffix A (a miss:
it computes the whole prompt), then request B = prefix + suffix B (a hit: it reuses the prefix's cached pages and
computes only its last partial page and its suffix). Both run alone, so TTFT is the prompt's compute plus one
sampling step. Prints per round and the medians. On CUDA the cached pages are device pages of the backend's KV
pool (nq_session_set_pages lists them in B's page table); the target there is B/A <= 0.10 at a 2,000-token prefix.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def _ttft(eng, ids) -> tuple[float, int]:
    t0 = time.perf_counter()
    h = eng.submit(ids, max_new_tokens=1, temperature=0.0)
    for _ in h:
        pass
    return time.perf_counter() - t0, len(ids)


def _extra_round_prefix(eng, all_ids, a, k: int, suffix_a) -> list[int]:
    """The prefix of extra round k after the timed rounds (0: the profiled one, 1: the timed-calls one), its miss
    run once so that the next request with it is a hit."""
    start = 1000 + (a.rounds + k) * (a.prefix_tokens + 50)
    prefix = all_ids[start:start + a.prefix_tokens]
    _ttft(eng, prefix + suffix_a)
    return prefix


def _profile_hit(eng, all_ids, a, suffix_a, suffix_b) -> None:
    """One more round, its hit under cProfile. Iterating the handle runs Engine.step on this thread (no background
    loop is started here), so this thread's profile holds the whole hit."""
    import cProfile
    import io
    import pstats
    prefix = _extra_round_prefix(eng, all_ids, a, 0, suffix_a)
    prof = cProfile.Profile()
    prof.enable()
    hit_s, _ = _ttft(eng, prefix + suffix_b)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(a.profile)
    print(f"profiled hit: TTFT {hit_s * 1e3:.1f} ms (under the profiler)")
    print(out.getvalue())


def _timeline_hit(eng, all_ids, a, suffix_a, suffix_b) -> None:
    """One more round, its hit with every C entry point's call timed (CUDA: abi.call, through which abi.check goes
    too): start and end in ms after submit, so the host's share of the TTFT shows between and around the calls."""
    from nanoqwen_rt.backends.cuda import abi
    prefix = _extra_round_prefix(eng, all_ids, a, 1, suffix_a)
    events, plain = [], abi.call
    t0 = time.perf_counter()

    def timed(lib, name, *args):
        s = time.perf_counter()
        out = plain(lib, name, *args)
        events.append((name, (s - t0) * 1e3, (time.perf_counter() - t0) * 1e3))
        return out
    abi.call = timed
    try:
        t0 = time.perf_counter()
        h = eng.submit(prefix + suffix_b, max_new_tokens=1, temperature=0.0)
        first = None
        for _ in h:
            first = first or (time.perf_counter() - t0) * 1e3
        end = (time.perf_counter() - t0) * 1e3
    finally:
        abi.call = plain
    print(f"timeline of one hit (ms after submit): first token {first:.3f}, handle done {end:.3f}")
    for name, s, e in events:
        print(f"  {s:8.3f} .. {e:8.3f}  {e - s:7.3f}  {name}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefix-tokens", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--file", default=None, help="the .nanoqwen file (default: the embedded model's)")
    ap.add_argument("--max-context", type=int, default=None, help="the engine's context (default: the model's)")
    ap.add_argument("--timeline", action="store_true",
                    help="CUDA: after the rounds, time each C call of one more hit against the submit")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="after the rounds, cProfile one more hit and print its N functions of most own time")
    a = ap.parse_args(argv)
    from nanoqwen_rt import Engine, demo_model_path
    src = Path(__file__).resolve().parents[1] / "nanoqwen_rt"
    text = "\n".join(p.read_text() for p in sorted(src.rglob("*.py")))     # real Python source, many prefixes
    rows = []
    with Engine(a.file or demo_model_path(), device=a.device, max_context=a.max_context) as eng:
        all_ids = eng.tokenizer.encode(text)
        need = 1000 + (a.rounds + 2) * (a.prefix_tokens + 50)   # the rounds, the profiled and the timed one
        if len(all_ids) < need:
            raise SystemExit(f"prefix_cache_ttft: the source text gives {len(all_ids)} tokens, the rounds need {need}")
        suffix_a = eng.tokenizer.encode("\ndef first_helper(x):")
        suffix_b = eng.tokenizer.encode("\nclass SecondThing:")
        _ttft(eng, all_ids[:64])                                          # allocate the pool, warm the kernels
        for r in range(a.rounds):
            start = 1000 + r * (a.prefix_tokens + 50)
            prefix = all_ids[start:start + a.prefix_tokens]
            hit0 = eng.batch_stats().prefix_hit_tokens
            miss_s, n_a = _ttft(eng, prefix + suffix_a)
            hit1 = eng.batch_stats().prefix_hit_tokens
            hit_s, n_b = _ttft(eng, prefix + suffix_b)
            cached = eng.batch_stats().prefix_hit_tokens - hit1
            rows.append({"round": r, "prompt_a": n_a, "prompt_b": n_b, "miss_cached_tokens": hit1 - hit0,
                         "hit_cached_tokens": cached, "ttft_miss_s": miss_s, "ttft_hit_s": hit_s,
                         "ratio": hit_s / miss_s})
            print(f"round {r}: A {n_a} tokens (cached {hit1 - hit0}) TTFT {miss_s * 1e3:.1f} ms; "
                  f"B {n_b} tokens (cached {cached}) TTFT {hit_s * 1e3:.1f} ms; B/A {hit_s / miss_s:.3f}")
        if a.profile:
            _profile_hit(eng, all_ids, a, suffix_a, suffix_b)
        if a.timeline and a.device == "cuda":
            _timeline_hit(eng, all_ids, a, suffix_a, suffix_b)
    med = {k: statistics.median(r[k] for r in rows) for k in ("ttft_miss_s", "ttft_hit_s", "ratio")}
    print(f"median: miss {med['ttft_miss_s'] * 1e3:.1f} ms, hit {med['ttft_hit_s'] * 1e3:.1f} ms, "
          f"hit/miss {med['ratio']:.3f}")
    if a.json:
        Path(a.json).write_text(json.dumps({"device": a.device, "file": a.file, "prefix_tokens": a.prefix_tokens,
                                            "rounds": rows, "median": med}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
