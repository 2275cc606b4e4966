#!/usr/bin/env python3
"""Summarise one bench/cpu_vs_llamacpp.sh run directory: per round (runs back to back) the prefill time of the
128-token prompt and the decode ms/token of ours (fast numerics; the oracle's too when present) and of llama.cpp at
each thread count, the ratios ours / llama.cpp's faster setting in that round (per figure), and the load average;
then the median and range of the ratios over the rounds.

    python3 bench/cpu_vs_llamacpp_summary.py RUN_DIR [--json OUT.json]

RUN_DIR holds ours.jsonl (bench/cpu_speed.py lines, fast numerics), optionally ours_oracle.jsonl (the same with
--numerics oracle), llamacpp_tN.jsonl for each llama-bench thread count N (llama-bench -o jsonl lines: one "pp" line,
n_gen 0, and one "tg" line, n_prompt 0, per run; an older run's single llamacpp.jsonl is read as its one setting)
and load.jsonl. Per run, ours is the median of its repetitions and llama.cpp the mean llama-bench reports.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import sys


def _lines(path):
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip().startswith("{")]


def _runs(path):
    """bench/cpu_speed.py lines grouped by process (a new process starts at rep 0) → [(prefill_s, decode_ms)]."""
    if not os.path.exists(path):
        return []
    runs: list[list[dict]] = []
    for r in _lines(path):
        if r["rep"] == 0:
            runs.append([])
        runs[-1].append(r)
    return [(statistics.median(r["prefill_s"] for r in run), statistics.median(r["decode_ms_per_token"] for r in run),
             run[-1]["loadavg_1m"]) for run in runs]


def _llama(path):
    """llama-bench jsonl → [(prefill_s, decode_ms)] per run."""
    rows = _lines(path)
    pp = [r for r in rows if r["n_gen"] == 0]
    tg = [r for r in rows if r["n_prompt"] == 0]
    return [(p["avg_ns"] / 1e9, t["avg_ns"] / 1e6 / t["n_gen"]) for p, t in zip(pp, tg)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir")
    ap.add_argument("--json", help="also write the summary here")
    a = ap.parse_args()
    ours = _runs(os.path.join(a.run_dir, "ours.jsonl"))
    oracle = _runs(os.path.join(a.run_dir, "ours_oracle.jsonl"))
    llama = {}
    for path in sorted(glob.glob(os.path.join(a.run_dir, "llamacpp*.jsonl"))):
        m = re.search(r"llamacpp_t(\d+)\.jsonl$", path)
        llama[f"t{m.group(1)}" if m else "t?"] = _llama(path)
    load_path = os.path.join(a.run_dir, "load.jsonl")
    load = _lines(load_path) if os.path.exists(load_path) else []
    n = min([len(ours)] + [len(v) for v in llama.values()]) if llama else 0
    if n == 0:
        print(f"error: no complete round in {a.run_dir}", file=sys.stderr)
        return 1
    rounds = []
    for i in range(n):
        lp = {k: v[i][0] for k, v in llama.items()}
        ld = {k: v[i][1] for k, v in llama.items()}
        best_p, best_d = min(lp.values()), min(ld.values())
        r = {"round": i + 1, "ours_prefill_s": ours[i][0], "ours_decode_ms": ours[i][1],
             "llamacpp_prefill_s": lp, "llamacpp_decode_ms": ld,
             "llamacpp_best_prefill_s": best_p, "llamacpp_best_decode_ms": best_d,
             "prefill_ratio": ours[i][0] / best_p, "decode_ratio": ours[i][1] / best_d,
             "loadavg_1m": [ours[i][2]] + ([load[i]["loadavg_1m"]] if i < len(load) else [])}
        if i < len(oracle):
            r.update(oracle_prefill_s=oracle[i][0], oracle_decode_ms=oracle[i][1],
                     oracle_prefill_ratio=oracle[i][0] / best_p, oracle_decode_ratio=oracle[i][1] / best_d)
        rounds.append(r)
    keys = sorted(llama)
    print(f"{'round':>5} {'ours pp128 s':>12} " + " ".join(f"{'llama ' + k:>9}" for k in keys) + f" {'ratio':>6} "
          f"{'ours ms/tok':>11} " + " ".join(f"{'llama ' + k:>9}" for k in keys) + f" {'ratio':>6} "
          f"{'oracle pp/ms':>14}  load (ours end, round end)")
    for r in rounds:
        orc = f"{r['oracle_prefill_s']:.2f}/{r['oracle_decode_ms']:.0f}" if "oracle_decode_ms" in r else "-"
        print(f"{r['round']:>5} {r['ours_prefill_s']:>12.3f} "
              + " ".join(f"{r['llamacpp_prefill_s'][k]:>9.3f}" for k in keys) + f" {r['prefill_ratio']:>6.2f} "
              f"{r['ours_decode_ms']:>11.2f} " + " ".join(f"{r['llamacpp_decode_ms'][k]:>9.2f}" for k in keys)
              + f" {r['decode_ratio']:>6.2f} {orc:>14}  " + ", ".join(f"{x:.2f}" for x in r["loadavg_1m"]))
    summ = {}
    for key in ("prefill_ratio", "decode_ratio", "ours_prefill_s", "ours_decode_ms", "llamacpp_best_prefill_s",
                "llamacpp_best_decode_ms", "oracle_prefill_ratio", "oracle_decode_ratio"):
        v = [r[key] for r in rounds if key in r]
        if v:
            summ[key] = {"median": statistics.median(v), "min": min(v), "max": max(v)}
    print(f"median ratio ours (fast) / llama.cpp's faster setting over {n} rounds: prefill "
          f"{summ['prefill_ratio']['median']:.2f} ({summ['prefill_ratio']['min']:.2f}-"
          f"{summ['prefill_ratio']['max']:.2f}), decode {summ['decode_ratio']['median']:.2f} "
          f"({summ['decode_ratio']['min']:.2f}-{summ['decode_ratio']['max']:.2f})")
    if "oracle_decode_ratio" in summ:
        print(f"oracle numerics: prefill {summ['oracle_prefill_ratio']['median']:.2f}, decode "
              f"{summ['oracle_decode_ratio']['median']:.2f}")
    if a.json:
        with open(a.json + ".tmp", "w") as fh:
            json.dump({"rounds": rounds, "summary": summ}, fh, indent=2)
        os.replace(a.json + ".tmp", a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
