#!/usr/bin/env python3
"""Bandwidth ceilings + torch peers (int4 tinygemm chain, cuBLAS fp16 chain) on Qwen2.5-Coder-7B shapes.

    python3 bench/peers.py [--file MODEL.nanoqwen] [--layers 28] [--json OUT.json] [--reps 30]

Shapes come from --file's header when given, else from nanoqwen_bench.measure.QWEN25_CODER_7B (--layers overrides
n_layers). Prints a short table last; --json writes the dict (bandwidth + peers + gpu/date/commit) atomically.
No Engine is involved: this runs before libnanoqwen exists. `nanoqwen bench FILE` runs the same peers
in-process next to the Engine.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import types

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # repo root, when not installed

from nanoqwen_bench.measure import (QWEN25_CODER_7B, BenchError, _git_commit, format_table, gpu_name,  # noqa: E402
                               measure_bandwidth, write_json_atomic)
from nanoqwen_bench.peers import run_peers  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--file", help="take the shapes from this .nanoqwen file's header")
    ap.add_argument("--layers", type=int, help="override n_layers")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json", help="write the result dict here")
    a = ap.parse_args(argv)
    if a.file:
        from nanoqwen_format import open_file
        with open_file(a.file, verify_checksums=False) as f:
            cfg = types.SimpleNamespace(**f.config.to_dict())
    else:
        cfg = types.SimpleNamespace(**QWEN25_CODER_7B)
    if a.layers is not None:
        if a.layers < 1:
            print("peers: --layers must be >= 1", file=sys.stderr)
            return 2
        cfg.n_layers = a.layers
    try:
        res = {"gpu": gpu_name(), "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
               "commit": _git_commit(), "config": vars(cfg)}
        res["bandwidth"] = measure_bandwidth()
        res["peers"] = run_peers(cfg, reps=a.reps)
    except BenchError as e:
        print(f"peers: {e}", file=sys.stderr)
        return 2
    if a.json:
        write_json_atomic(a.json, res)
    print(format_table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
