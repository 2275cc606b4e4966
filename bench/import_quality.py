"""Output quality of imported (already quantized) checkpoints: what nanoqwen-convert makes of a GPTQ (symmetric,
act-order, asymmetric) or AWQ source, by default (exact: layout 1 or 2 where one holds the source) and requantized
into layout 1 (--int4-layout 1), in perplexity / KL, next to the source itself and to converting the original
weights directly. The weight-error side of the same question is bench/import_errors.py.

    PYTHONPATH=.:tests python bench/import_quality.py [--model models/tiny-py] [--group 128] [--tokens 4096]
        [--sources "gptq asym,awq"] [--modes rtn,mse] [--no-original] [--json OUT]

Sources are packed from the original checkpoint by tests/quant_sources.py (round-to-nearest with GPTQ's / AWQ's own
scale and zero rules, Qwen's tensor names; the packing, not GPTQ's Hessian update). Every row is scored like
`nanoqwen-verify --eval` (nanoqwen_quant.evaluate) against the original checkpoint converted with --quant none:
* "source as stored": the source converted with --quant none (f16 of its exact dequantization): what an exact path
  gives, up to the f16 rounding of s * (q - z);
* "→ default": nanoqwen-convert's default (the lossless repack into layout 1 for symmetric GPTQ, into layout 2 for
  asymmetric GPTQ and AWQ; act-order requantized with rtn);
* "→ rtn" / "→ mse" (--int4-layout 1): requantized into layout 1 where the source is not layout 1 in disguise;
* "original → rtn / mse": the original weights converted directly.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

SOURCES = {   # name: make_quantized keyword arguments
    "gptq sym (Qwen Int4)": dict(method="gptq"),
    "gptq sym desc_act": dict(method="gptq", desc_act=True),
    "gptq asym": dict(method="gptq", sym=False, checkpoint_format="gptq_v2"),
    "awq": dict(method="awq"),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "tiny-py")
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--sources", default=",".join(SOURCES), help="comma-separated names of SOURCES to score")
    ap.add_argument("--modes", default="rtn,mse", help="requantization modes of the --int4-layout 1 rows")
    ap.add_argument("--no-original", action="store_true", help="skip the original → rtn / mse rows")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    sources = [x.strip() for x in a.sources.split(",") if x.strip()]
    modes = [x.strip() for x in a.modes.split(",") if x.strip()]
    if unknown := [x for x in sources if x not in SOURCES]:
        ap.error(f"--sources: unknown {unknown}; known: {list(SOURCES)}")
    from nanoqwen_quant.convert import convert_checkpoint
    from nanoqwen_quant.evaluate import evaluate
    from quant_sources import make_quantized

    rows = []
    with tempfile.TemporaryDirectory(prefix="nanoqwen-import-quality-") as td:
        td = Path(td)
        ref = convert_checkpoint(a.model, td / "ref.nanoqwen", quant="none")

        def score(label: str, path: Path) -> None:
            t = time.time()
            e = evaluate(path, ref, max_tokens=a.tokens)
            rows.append({"row": label, **{k: e[k] for k in ("tokens", "ppl_source", "ppl", "ppl_gap", "mean_kl",
                                                            "p99_kl", "top1_agreement")}})
            print(f"{label:40s} gap {100 * e['ppl_gap']:+7.2f} %  KL {e['mean_kl']:.5f}  p99 {e['p99_kl']:.4f}  "
                  f"top-1 {100 * e['top1_agreement']:.2f} %  ({time.time() - t:.0f} s)", flush=True)

        for mode in ([] if a.no_original else modes):
            score(f"original → {mode}", convert_checkpoint(a.model, td / f"orig-{mode}.nanoqwen",
                                                            group_size=a.group, mode=mode))
        for name in sources:
            d = td / name.replace(" ", "_").replace("(", "").replace(")", "")
            make_quantized(a.model, d, g=a.group, **SOURCES[name])
            score(f"{name}: source as stored", convert_checkpoint(d, td / "src.nanoqwen", quant="none", force=True))
            score(f"{name} → default", convert_checkpoint(d, td / "q-default.nanoqwen", group_size=a.group,
                                                           force=True))
            for mode in modes:
                score(f"{name} → {mode} (--int4-layout 1)",
                      convert_checkpoint(d, td / f"q-{mode}.nanoqwen", group_size=a.group, mode=mode, force=True,
                                         int4_layout="1"))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    out = a.json or ROOT / "bench" / f"import_quality_{a.model.name}_g{a.group}.json"
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"model": str(a.model), "group": a.group, "commit": commit, "date_utc":
                               _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M"), "rows": rows},
                              indent=1) + "\n")
    tmp.replace(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
