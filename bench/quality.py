"""Quality of INT4 on real text, measured with the CPU runtime on the embedded model's held-out files.

    python bench/quality.py [--model models/tiny-py] [--windows 50] [--context 256] [--prompts 50]
                            [--prompt-tokens 32] [--gen 128] [--group-size 128] [--json bench/quality_last.json]

1. Converts the checkpoint three ways with nanoqwen_quant.convert_checkpoint: --quant none (f16 weights),
   int4 rtn, int4 mse (group size --group-size; embeddings / lm_head / norms stay f16, as the converter's defaults).
2. Builds the held-out token stream exactly as models/train_tiny_py.py does: the files of
   models/tiny-py/heldout_files.txt (relative to this interpreter's stdlib), each followed by <|endoftext|>,
   concatenated in that order, tokenized with the tokenizer embedded in the file.
3. Perplexity: --windows windows of --context predicted tokens, evenly spaced over the stream (window i holds
   tokens [s, s+context+1) and scores every token after the first), for each file on the CPU backend, plus
   transformers in fp32 on the checkpoint as it is stored (the "fp32" reference of the issue: the checkpoint is
   saved in f16, so fp32 math on those weights is the unquantized model).
   From the same windows: teacher-forced top-1 agreement of each int4 file with the f16 file.
4. Greedy agreement: --prompts prompts of --prompt-tokens tokens taken at evenly spaced held-out positions;
   --gen greedy tokens (no stop ids) from the f16 file and from each int4 file. Reported: mean common-prefix
   fraction (tokens until the first divergence / gen), position-wise match fraction, and the fraction of prompts
   whose whole continuation matches.
Prints a markdown block for bench/RESULTS.md and writes the numbers as JSON.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
EOT = "<|endoftext|>"


def log(msg: str) -> None:
    print(f"[quality] {msg}", file=sys.stderr, flush=True)


def heldout_stream(model_dir: Path, tok) -> tuple[np.ndarray, int, int]:
    """int32 (n,) token stream of the held-out files (+EOT each); also (files used, files listed)."""
    root = Path(sysconfig.get_paths()["stdlib"]).resolve()
    rels = [r for r in (model_dir / "heldout_files.txt").read_text(encoding="utf-8").splitlines() if r.strip()]
    ids: list[int] = []
    used = 0
    for rel in rels:
        try:
            text = (root / rel).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        ids.extend(tok.encode(text + EOT))
        used += 1
    return np.asarray(ids, dtype=np.int32), used, len(rels)


def nll_of_window(logits: np.ndarray, targets: np.ndarray) -> float:
    """Sum of -log softmax(logits)[target] in float64. logits (T, vocab), targets (T,)."""
    x = logits.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    lse = (m[:, 0] + np.log(np.exp(x - m).sum(axis=1)))
    return float((lse - x[np.arange(len(targets)), targets]).sum())


def perplexity_cpu(path: Path, windows: list[np.ndarray], ctx: int, desc: str) -> tuple[float, np.ndarray]:
    """(perplexity, argmax of every scored position: int (n_windows * ctx,))."""
    from tqdm import tqdm

    from nanoqwen_rt.backends.cpu import CPUBackend
    total, count, top1 = 0.0, 0, []
    with CPUBackend(path, max_context=ctx) as be:
        for w in tqdm(windows, desc=desc, disable=not sys.stderr.isatty(), leave=False):
            logits = be.logits_all(w[:-1])                 # (ctx, vocab_rows)
            total += nll_of_window(logits, w[1:])
            count += len(w) - 1
            top1.append(np.argmax(logits, axis=1))
    return math.exp(total / count), np.concatenate(top1)


def perplexity_torch_fp32(model_dir: Path, windows: list[np.ndarray]) -> float:
    import torch
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for w in windows:
            logits = model(torch.from_numpy(w[None, :-1].astype(np.int64))).logits[0].numpy()
            total += nll_of_window(logits, w[1:])
            count += len(w) - 1
    return math.exp(total / count)


def greedy_runs(path: Path, prompts: list[np.ndarray], gen: int, ctx: int, desc: str) -> list[list[int]]:
    from tqdm import tqdm

    from nanoqwen_rt.backends.cpu import CPUBackend
    from nanoqwen_rt.sampling import SamplingParams
    out = []
    with CPUBackend(path, max_context=ctx) as be:
        for p in tqdm(prompts, desc=desc, disable=not sys.stderr.isatty(), leave=False):
            out.append(list(be.generate_ids(p, SamplingParams(), gen, ())))
    return out


def agreement(ref: list[list[int]], other: list[list[int]], gen: int) -> dict:
    prefix, pos, full = [], [], 0
    for a, b in zip(ref, other):
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        prefix.append(n / gen)
        pos.append(sum(x == y for x, y in zip(a, b)) / gen)
        full += int(n == gen)
    return {"common_prefix_fraction": float(np.mean(prefix)), "positionwise_match_fraction": float(np.mean(pos)),
            "full_match_fraction": full / len(ref)}


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except Exception:
        return "unknown"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "tiny-py")
    ap.add_argument("--windows", type=int, default=50)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--group-size", type=int, default=128)
    ap.add_argument("--json", type=Path, default=ROOT / "bench" / "quality_last.json")
    a = ap.parse_args(argv)

    from nanoqwen_format import open_file
    from nanoqwen_quant.convert import convert_checkpoint
    from nanoqwen_rt.tokenizer import Tokenizer

    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="nanoqwen-quality-") as td:
        files = {}
        for label, kw in (("f16", dict(quant="none")), ("int4-rtn", dict(quant="int4", mode="rtn")),
                          ("int4-mse", dict(quant="int4", mode="mse"))):
            files[label] = convert_checkpoint(a.model, Path(td) / f"{label}.nanoqwen",
                                              group_size=a.group_size, **kw)
            log(f"converted {label}: {files[label].stat().st_size / 1e6:.2f} MB")
        with open_file(files["f16"]) as f:
            tok = Tokenizer.from_file(f)
            cfg = f.config
        stream, used, listed = heldout_stream(a.model, tok)
        log(f"held-out: {used}/{listed} files found, {len(stream):,} tokens")
        n_win = (len(stream) - 1) // a.context
        if n_win < 1:
            raise SystemExit("held-out stream shorter than one window")
        starts = np.unique(np.linspace(0, n_win - 1, min(a.windows, n_win)).round().astype(int)) * a.context
        windows = [stream[s:s + a.context + 1] for s in starts]
        ppl = {"fp32 (transformers)": perplexity_torch_fp32(a.model, windows)}
        log(f"ppl fp32 (transformers) {ppl['fp32 (transformers)']:.4f}")
        top1 = {}
        for label, path in files.items():
            ppl[label], top1[label] = perplexity_cpu(path, windows, a.context, f"ppl {label}")
            log(f"ppl {label} {ppl[label]:.4f}")
        # teacher-forced: same (held-out) context for both, so one flip does not cascade as in free generation
        top1_agree = {k: float(np.mean(top1[k] == top1["f16"])) for k in ("int4-rtn", "int4-mse")}
        log(f"teacher-forced top-1 agreement with f16: {top1_agree}")
        hi = len(stream) - a.prompt_tokens
        pstarts = np.unique(np.linspace(0, hi - 1, a.prompts).round().astype(int))
        prompts = [stream[s:s + a.prompt_tokens] for s in pstarts]
        ctx = a.prompt_tokens + a.gen
        gens = {label: greedy_runs(path, prompts, a.gen, ctx, f"greedy {label}") for label, path in files.items()}
        agree = {label: agreement(gens["f16"], gens[label], a.gen) for label in ("int4-rtn", "int4-mse")}
        for k, v in agree.items():
            log(f"agreement {k}: {v}")
    res = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M"), "commit": git_commit(),
        "model": str(a.model.relative_to(ROOT) if a.model.is_relative_to(ROOT) else a.model),
        "config": {"hidden": cfg.hidden_size, "layers": cfg.n_layers, "vocab_rows": cfg.vocab_rows,
                   "tied": cfg.tied_embeddings},
        "group_size": a.group_size, "heldout_files_used": used, "heldout_files_listed": listed,
        "heldout_tokens": int(len(stream)), "windows": len(windows), "context": a.context,
        "teacher_forced_top1_agreement_vs_f16": top1_agree,
        "perplexity": ppl, "relative_to_fp32": {k: v / ppl["fp32 (transformers)"] - 1 for k, v in ppl.items()},
        "greedy": {"prompts": len(prompts), "prompt_tokens": a.prompt_tokens, "gen": a.gen, "vs_f16": agree},
        "seconds": round(time.time() - t0, 1), "python": sys.version.split()[0],
    }
    tmp = a.json.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(res, indent=2) + "\n")
    tmp.replace(a.json)
    print(markdown(res))
    return 0


def markdown(r: dict) -> str:
    lines = [f"Measured {r['date_utc']} UTC at commit {r['commit']} with `python bench/quality.py` "
             f"(Python {r['python']}, {r['seconds']} s): model `{r['model']}`, int4 group size {r['group_size']} "
             f"(embeddings/lm_head f16{', tied' if r['config']['tied'] else ''}); held-out files "
             f"{r['heldout_files_used']}/{r['heldout_files_listed']} ({r['heldout_tokens']:,} tokens).", "",
             f"Perplexity over {r['windows']} evenly spaced windows of {r['context']} predicted tokens:", "",
             "| weights | runtime | perplexity | vs fp32 |", "|---|---|---|---|"]
    for k, v in r["perplexity"].items():
        rt = "transformers fp32" if k.startswith("fp32") else "nanoqwen cpu"
        lines.append(f"| {k.split(' ')[0]} | {rt} | {v:.4f} | {100 * r['relative_to_fp32'][k]:+.2f}% |")
    lines += ["", "Teacher-forced top-1 agreement with the f16 file over the same windows (same held-out context for "
              "both, so a flip does not cascade): " + ", ".join(f"{k} {100 * v:.2f}%" for k, v in
                                                                r["teacher_forced_top1_agreement_vs_f16"].items())
              + "."]
    g = r["greedy"]
    lines += ["", f"Greedy continuation agreement with the f16 file ({g['prompts']} prompts of {g['prompt_tokens']} "
              f"held-out tokens, {g['gen']} new tokens, no stop ids):", "",
              "| weights | common prefix / gen | position-wise match | full-length match |", "|---|---|---|---|"]
    for k, v in g["vs_f16"].items():
        lines.append(f"| {k} | {v['common_prefix_fraction']:.3f} | {v['positionwise_match_fraction']:.3f} | "
                     f"{v['full_match_fraction']:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
