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

    python bench/quality.py --sweep [--model DIR | --checkpoint smollm2-135m] [--groups 128,64,32]
                            [--modes rtn,mse,gptq] [--tokens 4096] [--json bench/quality_sweep_<name>.json]

Sweep: every mode x group size against the unquantized model (the source converted with --quant none), on the
text of nanoqwen-verify --eval (nanoqwen_quant/data/eval_heldout.txt), with the numbers of nanoqwen_quant.evaluate:
perplexity gap, mean / p99 KL(unquantized || int4) per token, top-1 agreement. The reference logits are computed
once; gptq's Hessians once per model (calibration text: nanoqwen_quant.calibrate's default, disjoint from the
evaluation text; --hessians loads them when they were computed before). --checkpoint names a trained checkpoint
from bench/real_checkpoints.py (fetched into its cache).
Group sizes that a model's shapes cannot hold (K % g != 0) are reported as such, not run.
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


def sweep(a) -> int:
    from nanoqwen_format import open_file
    from nanoqwen_quant.calibrate import calibration_hessians
    from nanoqwen_quant.convert import convert_checkpoint, plan_tensors
    from nanoqwen_quant.evaluate import DEFAULT_TEXT, compare_logits, summarize, token_windows
    from nanoqwen_quant.load import load_checkpoint
    from nanoqwen_rt.backends.cpu import CPUBackend
    from nanoqwen_rt.tokenizer import Tokenizer

    if a.checkpoint:
        sys.path.insert(0, str(ROOT / "bench"))
        from real_checkpoints import materialize
        model, name = materialize(a.checkpoint), a.checkpoint
    else:
        model, name = a.model, a.model.name
    groups = [int(g) for g in a.groups.split(",")]
    modes = a.modes.split(",")
    t0 = time.time()
    rows, timing = [], {}
    with tempfile.TemporaryDirectory(prefix="nanoqwen-sweep-") as td:
        ref_path = convert_checkpoint(model, Path(td) / "f16.nanoqwen", quant="none")
        with open_file(ref_path) as f:
            tok = Tokenizer.from_file(f)
            cfg = f.config
        ctx = min(512, cfg.max_positions - 1)
        windows = token_windows(np.asarray(tok.encode(DEFAULT_TEXT.read_text(encoding="utf-8")), np.int32), ctx,
                                a.tokens)
        with CPUBackend(ref_path, max_context=ctx + 1) as be:
            ref_logits = [be.logits_all(w[:-1]) for w in windows]
        log(f"{name}: reference logits over {sum(len(w) - 1 for w in windows)} tokens ({time.time() - t0:.0f} s)")
        hess = None
        if "gptq" in modes and a.hessians:                 # the same calibration, computed before and saved
            with np.load(a.hessians) as z:
                hess = {k: z[k] for k in z.files}
            log(f"{name}: calibration Hessians from {a.hessians}")
        elif "gptq" in modes:
            t = time.time()
            hess = calibration_hessians(ref_path)          # the f16 conversion made above
            timing["gptq_calibration_s"] = round(time.time() - t, 1)
            log(f"{name}: calibration Hessians in {timing['gptq_calibration_s']} s")
        ckpt = load_checkpoint(model)
        for g in groups:
            specs = plan_tensors(ckpt, quant="int4", group_size=g, lm_head="fp16", fallback_f16=True)
            f16_linears = sum(1 for sp in specs if sp.dtype.name == "F16" and sp.name.endswith("proj.weight"))
            if f16_linears:
                rows.append({"group": g, "mode": "-", "skipped": f"{f16_linears} linears have K % {g} != 0"})
                log(f"{name} g{g}: skipped ({f16_linears} linears have K % {g} != 0)")
                continue
            for mode in modes:
                t = time.time()
                path = convert_checkpoint(model, Path(td) / f"{mode}-g{g}.nanoqwen", group_size=g, mode=mode,
                                          hessians=hess if mode == "gptq" else None)
                conv_s = time.time() - t
                with CPUBackend(path, max_context=ctx + 1) as be:
                    parts = [compare_logits(r, be.logits_all(w[:-1]), w[1:]) for r, w in zip(ref_logits, windows)]
                r = summarize(parts)
                r.update(group=g, mode=mode, convert_s=round(conv_s, 1))
                rows.append(r)
                path.unlink()
                log(f"{name} g{g} {mode}: ppl {r['ppl']:.4f} vs {r['ppl_source']:.4f} ({100 * r['ppl_gap']:+.2f} %),"
                    f" KL {r['mean_kl']:.5f}, top-1 {100 * r['top1_agreement']:.2f} %")
    res = {"date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M"), "commit": git_commit(),
           "model": name, "text": str(DEFAULT_TEXT.relative_to(ROOT)), "tokens": sum(len(w) - 1 for w in windows),
           "context": ctx, "rows": rows, "seconds": round(time.time() - t0, 1), **timing}
    out = a.json or ROOT / "bench" / f"quality_sweep_{name}.json"
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(res, indent=2) + "\n")
    tmp.replace(out)
    print(sweep_markdown(res))
    return 0


def sweep_markdown(r: dict) -> str:
    lines = [f"{r['model']}: {r['tokens']} tokens of `{r['text']}` (windows of {r['context']}), measured "
             f"{r['date_utc']} UTC at {r['commit']} ({r['seconds']} s)", "",
             "| group | mode | ppl (unquantized) | ppl int4 | gap | mean KL | p99 KL | top-1 |", "|---|---|---|---|---|---|---|---|"]
    for x in r["rows"]:
        if "skipped" in x:
            lines.append(f"| {x['group']} | — | — | — | n/a: {x['skipped']} | | | |")
            continue
        lines.append(f"| {x['group']} | {x['mode']} | {x['ppl_source']:.4f} | {x['ppl']:.4f} | "
                     f"{100 * x['ppl_gap']:+.2f} % | {x['mean_kl']:.5f} | {x['p99_kl']:.4f} | "
                     f"{100 * x['top1_agreement']:.2f} % |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "tiny-py")
    ap.add_argument("--windows", type=int, default=50)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--group-size", type=int, default=128)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--sweep", action="store_true", help="modes x group sizes (see the module docstring)")
    ap.add_argument("--checkpoint", default=None, help="--sweep: a bench/real_checkpoints.py name")
    ap.add_argument("--groups", default="128,64,32")
    ap.add_argument("--modes", default="rtn,mse,gptq")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--hessians", type=Path, default=None,
                    help="--sweep: .npz of the default calibration's Hessians (bench/gptq_variants.py caches them "
                         "as <cache>/<name>-hessians-chunk0.npz), instead of recomputing them")
    a = ap.parse_args(argv)
    if a.sweep:
        return sweep(a)
    a.json = a.json or ROOT / "bench" / "quality_last.json"

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
