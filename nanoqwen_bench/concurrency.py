"""`nanoqwen bench FILE --concurrency 1,8,32,64`: N concurrent streams through Engine.submit (the batched API the
server drives), each level on the same Engine, and at concurrency 1 the single-stream figure (Engine backend's
generate_ids, as `nanoqwen bench` measures it) beside it for the batch-1 regression check.

    result = run_concurrency("model.nanoqwen", [1, 8, 32], prompt_tokens=512, new_tokens=128)   # -> dict (JSON-able)
    print(format_concurrency_table(result))

Each level: N requests of prompt_tokens random ids (a different prompt per stream, ids below Qwen2's first special
id), greedy, max_new_tokens = new_tokens, no stop ids, all submitted at once; this thread steps the engine
(Engine.step) until every stream is done and stamps each token with the end of the step that sampled it.
One warm-up level of the same size runs first (CUDA: sessions, the batch, graph capture). Definitions:
* ttft_ms: submit → the stream's first token (includes waiting for its prompt's chunks: PREFILL_CHUNK_TOKENS
  prompt tokens per step over all streams).
* itl_ms: a stream's inter-token times (first token excluded); itl_p50_ms / itl_p90_ms: the median over streams
  of each stream's p50 / p90; itl_p50_worst_ms: the slowest stream's p50.
* tokens_per_s: every generated token / (first submit → last token), prompts included.
* decode_tokens_per_s, decode_step_ms: over the steady steps, where every stream of the level had its first token
  and each sampled one (a batch of N decodes, no prompt chunk): tokens / time, and the median step time.
  steady_steps: how many. The prompts enter a few hundred tokens a step while the first streams already decode, so
  with N x prompt_tokens large against new_tokens the window where all N decode is short: 512-token prompts and 128
  new tokens leave 1-7 steps at 64 streams (bench/NOTES.md "Session 10" §9). The table flags a level with fewer
  than MIN_STEADY_STEPS; its decode figure is then one or a few steps, not a steady rate.
* batch: the running sequences per step (min / median / max over the steps that sampled a token).
* consumer_ms_per_step: the median time the streams' handles took to turn a step's tokens into chunks (text
  decoding, stop handling), in this thread between steps; it is part of itl_ms (a server pays it on the
  handlers' threads instead), not of decode_step_ms.
* scaling (scaling_of): between consecutive levels a < b, the decode tokens/s gained against proportional
  scaling, (tps_b / tps_a) / (b / a): 1.0 when b streams run as fast per stream as a did, 1 / (b / a) when the
  aggregate stopped growing. The knee is the first level whose step scales below KNEE_SCALING: past it, adding
  streams buys less than half their share of throughput (each stream slows down more than the batch gains).
"""
from __future__ import annotations

import os
import statistics
import time

import numpy as np

from .timing import BenchError, gpu_name

__all__ = ["MAX_CONCURRENCY", "KNEE_SCALING", "MIN_STEADY_STEPS", "parse_concurrency", "measure_concurrency",
           "run_concurrency", "scaling_of", "format_concurrency_table"]

#: most streams one level may ask for: the library's batch limit (nanoqwen.h NQ_MAX_BATCH)
MAX_CONCURRENCY = 256
#: ids a random prompt draws from: below Qwen2's first special id (151643), as nanoqwen_bench.measure does
FIRST_SPECIAL_ID = 151643
#: the knee: the first level whose step from the level before scales below this (module docstring, "scaling")
KNEE_SCALING = 0.5
#: steady steps below which a level's decode tok/s is flagged as not a steady rate (module docstring)
MIN_STEADY_STEPS = 16


def parse_concurrency(text: str) -> list[int]:
    """"1,8,32,64" → [1, 8, 32, 64]: comma-separated integers in [1, MAX_CONCURRENCY], no repeats (kept in the
    order given). Raises BenchError naming the bad item."""
    items = [x.strip() for x in str(text).split(",")]
    out: list[int] = []
    for x in items:
        if not x.isdigit():
            raise BenchError(f"--concurrency: {x!r} is not a positive integer (give e.g. 1,8,32,64)")
        n = int(x)
        if not 1 <= n <= MAX_CONCURRENCY:
            raise BenchError(f"--concurrency: {n} is outside [1, {MAX_CONCURRENCY}]")
        if n in out:
            raise BenchError(f"--concurrency: {n} is given twice")
        out.append(n)
    return out


def _pct(xs, q: float) -> float:
    return float(np.percentile(np.asarray(xs, dtype=np.float64), q))


def _run_level(eng, prompts: list[np.ndarray], new_tokens: int) -> dict:
    """All prompts at once through Engine.submit; this thread steps the engine until every stream is done."""
    n = len(prompts)
    t0 = time.perf_counter()
    handles = [eng.submit(p, max_new_tokens=new_tokens, temperature=0.0, stop_token_ids=[]) for p in prompts]
    stamps: list[list[float]] = [[] for _ in range(n)]
    steps = []                                  # (seconds, tokens sampled, running sequences, steady)
    polls = []                                  # seconds the streams' consumers took after each step
    live = set(range(n))
    while live:
        ts = time.perf_counter()
        k = eng.step()
        te = time.perf_counter()
        steady = k == n and all(stamps[i] for i in range(n))     # every stream decoding, no first token
        for i in list(live):
            for c in handles[i].poll():
                stamps[i] += [te] * len(c.token_ids)
            if handles[i].done:
                live.discard(i)
        polls.append(time.perf_counter() - te)
        steps.append((te - ts, k, eng.batch_stats().last_batch, steady))
        if len(steps) > 100 * (new_tokens + 1) * n + 10_000:
            raise BenchError(f"concurrency {n}: the batch did not finish in {len(steps)} steps")
    counts = [len(s) for s in stamps]
    if any(c != new_tokens for c in counts):
        raise BenchError(f"concurrency {n}: streams produced {sorted(set(counts))} tokens, expected {new_tokens}")
    t_end = max(s[-1] for s in stamps)
    ttft = [(s[0] - t0) * 1e3 for s in stamps]
    itl = [np.diff(s) * 1e3 for s in stamps]
    p50 = [_pct(x, 50) for x in itl if x.size]
    p90 = [_pct(x, 90) for x in itl if x.size]
    steady = [(dt, k) for dt, k, _, st in steps if st]
    batches = [b for _, k, b, _ in steps if k > 0]
    out = {"concurrency": n, "steps": len(steps), "wall_s": t_end - t0,
           "tokens_per_s": n * new_tokens / (t_end - t0),
           "ttft_p50_ms": _pct(ttft, 50), "ttft_p90_ms": _pct(ttft, 90), "ttft_max_ms": max(ttft),
           "batch_min": min(batches), "batch_median": statistics.median(batches), "batch_max": max(batches),
           "steady_steps": len(steady), "consumer_ms_per_step": statistics.median(polls) * 1e3}
    if p50:
        out.update(itl_p50_ms=statistics.median(p50), itl_p90_ms=statistics.median(p90), itl_p50_worst_ms=max(p50))
    if steady:
        out.update(decode_tokens_per_s=sum(k for _, k in steady) / sum(dt for dt, _ in steady),
                   decode_step_ms=statistics.median(dt for dt, _ in steady) * 1e3)
    return out


def measure_concurrency(path: str, levels: list[int], prompt_tokens: int = 512, new_tokens: int = 128,
                        device: str = "auto", seed: int = 0) -> dict:
    """Each level of `levels` on one Engine(path, device, max_batch = the largest level), after a warm-up level of
    the largest size. Returns {"backend", "prompt_tokens", "new_tokens", "levels": [per-level dicts]}."""
    from nanoqwen_format import open_file

    from nanoqwen_rt.engine import Engine
    from nanoqwen_rt.kv_pool import pages_for

    if prompt_tokens < 1 or new_tokens < 1:
        raise BenchError("prompt_tokens and new_tokens must be >= 1")
    if not levels:
        raise BenchError("--concurrency: no levels given")
    with open_file(path, verify_checksums=False) as f:
        cfg = f.config
    max_context = prompt_tokens + new_tokens + 1
    if max_context > cfg.max_positions:
        raise BenchError(f"prompt_tokens + new_tokens + 1 = {max_context} exceeds max_positions {cfg.max_positions}")
    top = max(levels)
    # every stream of the largest level holds its whole context at once: none waits for pages
    eng = Engine(path, device=device, max_context=max_context, verify_checksums=False, max_batch=top,
                 kv_pages=top * pages_for(max_context))
    try:
        rng = np.random.default_rng(seed)
        hi = min(cfg.vocab_rows, FIRST_SPECIAL_ID)

        def prompts(n):
            return [rng.integers(0, hi, size=prompt_tokens, dtype=np.int64).astype(np.int32) for _ in range(n)]
        _run_level(eng, prompts(top), min(new_tokens, 8))             # warm-up
        rows = [_run_level(eng, prompts(n), new_tokens) for n in levels]
        backend = eng.backend.describe()
    finally:
        eng.close()
    return {"backend": backend, "prompt_tokens": prompt_tokens, "new_tokens": new_tokens, "levels": rows}


def run_concurrency(path, levels: list[int], prompt_tokens: int = 512, new_tokens: int = 128,
                    device: str = "auto", repeats: int = 3) -> dict:
    """The whole `nanoqwen bench FILE --concurrency ...` measurement: the levels, and with level 1 the single
    stream (nanoqwen_bench.measure.measure_engine: generate_ids, `repeats` runs) for the regression check."""
    from .measure import _git_commit, measure_engine

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise BenchError(f"no such file: {path}")
    res: dict = {"gpu": gpu_name(), "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
                 "commit": _git_commit()}
    if 1 in levels:       # first, in its own Engine (closed before the batched one opens)
        single = measure_engine(path, prompt_tokens, new_tokens, repeats=repeats, device=device)
        res["single_stream"] = {k: single[k] for k in ("ms_per_token", "ms_per_token_all", "tokens_per_s", "ttft_ms",
                                                       "backend")}
    res["concurrency"] = measure_concurrency(path, levels, prompt_tokens, new_tokens, device=device)
    res["scaling"] = scaling_of(res["concurrency"]["levels"])
    if "single_stream" in res:
        one = next(r for r in res["concurrency"]["levels"] if r["concurrency"] == 1)
        if "itl_p50_ms" in one:
            # the batched API at one stream against the single stream: > 1 is slower
            res["single_stream"]["batch1_itl_vs_single"] = one["itl_p50_ms"] / res["single_stream"]["ms_per_token"]
    return res


def scaling_of(levels: list[dict]) -> dict:
    """The scaling between consecutive levels with a decode tokens/s figure, in concurrency order (module
    docstring): {"steps": [{"from", "to", "scaling"}], "knee": the first level whose step scales below
    KNEE_SCALING, or None}."""
    pts = sorted((r["concurrency"], r["decode_tokens_per_s"]) for r in levels if r.get("decode_tokens_per_s"))
    steps = [{"from": a, "to": b, "scaling": (tb / ta) / (b / a)} for (a, ta), (b, tb) in zip(pts, pts[1:])]
    knee = next((st["to"] for st in steps if st["scaling"] < KNEE_SCALING), None)
    return {"steps": steps, "knee": knee}


def format_concurrency_table(result: dict) -> str:
    """A short human table of a run_concurrency result."""
    c = result["concurrency"]
    lines = [f"GPU {result.get('gpu', '?')}  ({result.get('date_utc', '?')}, commit {result.get('commit', '?')})",
             f"backend {c['backend']}; {c['prompt_tokens']}-token prompts, {c['new_tokens']} greedy tokens per stream",
             ""]

    def f(r, key, fmt):
        return format(r[key], fmt) if key in r else "-"
    head = ("streams", "tok/s all", "decode tok/s", "steady", "step ms", "ITL p50", "ITL p90", "ITL p50 worst",
            "TTFT p50", "TTFT p90", "batch min/med/max", "consumer ms")
    rows = [head]
    for r in c["levels"]:
        rows.append((str(r["concurrency"]), f(r, "tokens_per_s", ".1f"), f(r, "decode_tokens_per_s", ".1f"),
                     f(r, "steady_steps", "d"),
                     f(r, "decode_step_ms", ".3f"), f(r, "itl_p50_ms", ".3f"), f(r, "itl_p90_ms", ".3f"),
                     f(r, "itl_p50_worst_ms", ".3f"), f(r, "ttft_p50_ms", ".1f"), f(r, "ttft_p90_ms", ".1f"),
                     f"{r['batch_min']}/{r['batch_median']:g}/{r['batch_max']}", f(r, "consumer_ms_per_step", ".3f")))
    w = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines += ["  ".join(x.rjust(w[i]) for i, x in enumerate(row)) for row in rows]
    lines.append("(ms; ITL = a stream's inter-token time, median over streams of its p50 / p90; decode = the steps "
                 "where every stream decoded, steady = how many; consumer = the handles' chunking after a step, "
                 "inside ITL)")
    short = [r for r in c["levels"] if r.get("decode_tokens_per_s") and r.get("steady_steps", 0) < MIN_STEADY_STEPS]
    if short:
        lines.append("not a steady rate (fewer than %d steps with every stream decoding): " % MIN_STEADY_STEPS
                     + ", ".join(f"{r['concurrency']} streams ({r['steady_steps']})" for r in short)
                     + "; more --new-tokens (against streams x prompt tokens) widen that window")
    sc = scaling_of(c["levels"])
    if sc["steps"]:
        top = max(r["concurrency"] for r in c["levels"])
        knee = (f"knee at {sc['knee']} streams" if sc["knee"] is not None
                else f"no knee up to {top} streams (every step >= {KNEE_SCALING:g})")
        lines.append("scaling of decode tok/s against proportional: "
                     + ", ".join(f"{st['from']} -> {st['to']} {st['scaling']:.2f}" for st in sc["steps"]) + f"; {knee}")
    s = result.get("single_stream")
    if s:
        line = (f"single stream (generate_ids): {s['ms_per_token']:.3f} ms/token = {s['tokens_per_s']:.1f} tok/s, "
                f"TTFT {s['ttft_ms']:.1f} ms")
        if "batch1_itl_vs_single" in s:
            line += f"; Engine.submit at 1 stream: {s['batch1_itl_vs_single']:.3f}x its time per token"
        lines.append(line)
    return "\n".join(lines)
