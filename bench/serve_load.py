"""HTTP load generator for `nanoqwen serve`: C concurrent streaming completions, each a different prompt, through the
official `openai` client; reports aggregate tokens/s, per-stream inter-token time (p50 / p90) and TTFT.

    nanoqwen serve FILE --port 8000 --max-batch 64 --queue-size 64 &
    python bench/serve_load.py --base http://127.0.0.1:8000 --concurrency 1,8,32,64 --tokens 64 [--json out.json]

Every stream asks for exactly --tokens tokens (ignore_eos). Tokens are counted from the stream's chunks; a chunk
carrying text counts once per token the server says it generated (usage at the end), so the rate is tokens, not
chunks. Aggregate tokens/s = all completion tokens / wall time from the first request sent to the last stream's end.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path


def run_level(client, model: str, concurrency: int, tokens: int) -> dict:
    results: list = [None] * concurrency

    def one(i: int) -> None:
        t0 = time.perf_counter()
        stamps = []
        n_tokens = 0
        stream = client.completions.create(model=model, prompt=f"def function_{i}(values):", max_tokens=tokens,
                                           temperature=0, stream=True, stream_options={"include_usage": True},
                                           extra_body={"ignore_eos": True})
        for ch in stream:
            if ch.choices and ch.choices[0].text:
                stamps.append(time.perf_counter())
            if ch.usage is not None:
                n_tokens = ch.usage.completion_tokens
        gaps = [b - a for a, b in zip(stamps, stamps[1:])]
        results[i] = {"ttft_s": stamps[0] - t0 if stamps else None, "gaps": gaps, "tokens": n_tokens,
                      "end": time.perf_counter()}

    t0 = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = max(r["end"] for r in results) - t0
    gaps = sorted(g for r in results for g in r["gaps"])
    total = sum(r["tokens"] for r in results)
    p = lambda q: gaps[min(len(gaps) - 1, int(q * len(gaps)))] if gaps else float("nan")   # noqa: E731
    return {"concurrency": concurrency, "tokens": total, "wall_s": wall, "tokens_per_s": total / wall,
            "inter_token_p50_ms": p(0.5) * 1e3, "inter_token_p90_ms": p(0.9) * 1e3,
            "ttft_p50_ms": statistics.median(r["ttft_s"] for r in results) * 1e3}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default=None, help="model id (default: the server's only model)")
    ap.add_argument("--api-key", default="unused")
    ap.add_argument("--concurrency", default="1,8,32,64")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    import openai
    client = openai.OpenAI(base_url=a.base.rstrip("/") + "/v1", api_key=a.api_key, max_retries=0, timeout=600)
    model = a.model or client.models.list().data[0].id
    rows = []
    for c in (int(x) for x in a.concurrency.split(",")):
        r = run_level(client, model, c, a.tokens)
        rows.append(r)
        print(f"concurrency {c:3d}: {r['tokens']} tokens in {r['wall_s']:.2f} s = {r['tokens_per_s']:.0f} tok/s; "
              f"inter-token p50 {r['inter_token_p50_ms']:.1f} ms, p90 {r['inter_token_p90_ms']:.1f} ms; "
              f"TTFT p50 {r['ttft_p50_ms']:.0f} ms", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"base": a.base, "model": model, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
