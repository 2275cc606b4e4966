#!/usr/bin/env python3
"""Summarise one bench/cpu_vs_llamacpp.sh run directory: per pair (ours then llama.cpp, back to back) the prefill
time of the 128-token prompt and the decode ms/token of each, their ratios (ours / llama.cpp), and the load average;
then the median and range of the ratios over the pairs.

    python3 bench/cpu_vs_llamacpp_summary.py RUN_DIR [--json OUT.json]

RUN_DIR holds ours.jsonl (bench/cpu_speed.py lines), llamacpp.jsonl (llama-bench -o jsonl lines: one "pp" line,
n_gen 0, and one "tg" line, n_prompt 0, per run) and load.jsonl. Per run, ours is the median of its repetitions
and llama.cpp the mean llama-bench reports over its repetitions.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys


def _lines(path):
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip().startswith("{")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir")
    ap.add_argument("--json", help="also write the summary here")
    a = ap.parse_args()
    ours = _lines(os.path.join(a.run_dir, "ours.jsonl"))
    llama = _lines(os.path.join(a.run_dir, "llamacpp.jsonl"))
    load = _lines(os.path.join(a.run_dir, "load.jsonl"))
    # ours: one process per pair prints reps 0..R-1; a new process starts at rep 0
    runs_ours: list[list[dict]] = []
    for r in ours:
        if r["rep"] == 0:
            runs_ours.append([])
        runs_ours[-1].append(r)
    pp = [r for r in llama if r["n_gen"] == 0]
    tg = [r for r in llama if r["n_prompt"] == 0]
    n = min(len(runs_ours), len(pp), len(tg))
    if n == 0:
        print(f"error: no complete pair in {a.run_dir}", file=sys.stderr)
        return 1
    pairs = []
    for i in range(n):
        o_pre = statistics.median(r["prefill_s"] for r in runs_ours[i])
        o_dec = statistics.median(r["decode_ms_per_token"] for r in runs_ours[i])
        l_pre = pp[i]["avg_ns"] / 1e9
        l_dec = tg[i]["avg_ns"] / 1e6 / tg[i]["n_gen"]
        pairs.append({"pair": i + 1, "ours_prefill_s": o_pre, "llamacpp_prefill_s": l_pre,
                      "prefill_ratio": o_pre / l_pre, "ours_decode_ms": o_dec, "llamacpp_decode_ms": l_dec,
                      "decode_ratio": o_dec / l_dec,
                      "loadavg_1m": [runs_ours[i][-1]["loadavg_1m"]] + ([load[i]["loadavg_1m"]] if i < len(load)
                                                                        else [])})
    print(f"{'pair':>4} {'ours pp128 s':>12} {'llama pp128 s':>13} {'ratio':>6} {'ours ms/tok':>11} "
          f"{'llama ms/tok':>12} {'ratio':>6}  load (ours end, pair end)")
    for p in pairs:
        print(f"{p['pair']:>4} {p['ours_prefill_s']:>12.3f} {p['llamacpp_prefill_s']:>13.3f} {p['prefill_ratio']:>6.2f} "
              f"{p['ours_decode_ms']:>11.2f} {p['llamacpp_decode_ms']:>12.2f} {p['decode_ratio']:>6.2f}  "
              f"{', '.join(f'{x:.2f}' for x in p['loadavg_1m'])}")
    summ = {}
    for key in ("prefill_ratio", "decode_ratio", "ours_prefill_s", "llamacpp_prefill_s", "ours_decode_ms",
                "llamacpp_decode_ms"):
        v = [p[key] for p in pairs]
        summ[key] = {"median": statistics.median(v), "min": min(v), "max": max(v)}
    print(f"median ratio ours/llama.cpp over {n} pairs: prefill {summ['prefill_ratio']['median']:.2f} "
          f"({summ['prefill_ratio']['min']:.2f}-{summ['prefill_ratio']['max']:.2f}), decode "
          f"{summ['decode_ratio']['median']:.2f} ({summ['decode_ratio']['min']:.2f}-{summ['decode_ratio']['max']:.2f})")
    if a.json:
        with open(a.json + ".tmp", "w") as fh:
            json.dump({"pairs": pairs, "summary": summ}, fh, indent=2)
        os.replace(a.json + ".tmp", a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
