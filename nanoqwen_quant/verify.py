"""nanoqwen-verify FILE [--source SRC] [--eval [TEXT]] [--json]: structure, checksums, (with --source)
quantization error, and (with --eval) quality on text.

\b
Exit status: 0 valid (and, with --source, every tensor within its thresholds; with --eval, the text within its
thresholds); 1 invalid file or a threshold exceeded; 2 usage problems (FILE missing, SOURCE or TEXT unreadable,
--eval without --source).

\b
--eval [TEXT] (needs --source): runs FILE and SRC on the CPU backend over TEXT (default: a held-out Python text
shipped with nanoqwen) and reports both perplexities, KL(source||file) per token (mean, p99) and top-1
agreement. Fails when the perplexity is more than 5 % above the source's, the mean KL is above 0.05 nats/token,
or top-1 agreement is below 85 % (nanoqwen_quant/evaluate.py gives the reasons).

\b
Thresholds (per tensor, against the source weights converted to float32):
* f16 tensors. Element bound: |w - w'| <= 2^-11 |w| + 2^-25 (f16 round-to-nearest: half an ulp of an 11-bit
  significand for normal values, half the subnormal quantum 2^-24 below 2^-14). SNR >= 60 dB: the relative
  error bound alone gives >= 66 dB (10 log10(2^22)); 6 dB margin for values in the subnormal range.
  (bf16 tensors: 2^-8 |w|, SNR >= 45 dB; f32 tensors: exact.)
* int4 tensors. Element bound, from the file's own scale s of the element's group:
  |w - w'| <= max(s/2, |w| - 7s) * (1 + 2^-16) + 2^-40: rounding error at most half a step, plus the
  clipping error above the largest code (mse clips at r*amax, r >= 0.6); the slack covers the float32
  division before rint. s == 0 is only legal where |w| < 2^-25 * 7 / 0.6 (< 4e-7).
  SNR >= 15 dB: absmax/7 rounding noise s^2/12 on Gaussian groups of 128 gives
  10 log10(12 * 49 / E[amax/sigma]^2) ~= 18.5 dB (measured 18.6 dB g128, 19.4 dB g64: bench/RESULTS.md);
  15 dB leaves 3.5 dB for the heavier tails of trained weights (group crest factor 4.3 instead of 2.9).
  Layout 2 (zero points, spec §9.5) is dequantized by its own rule, s * (u - z), against the same bounds; the
  converter writes it only for the exact import of an AWQ / asymmetric GPTQ source, whose error is 0.
* int4 tensors of a --mode gptq file (provenance quantizer.mode): GPTQ moves codes away from the nearest one to
  cancel output error, so the element bound does not apply and the weight SNR is lower by design; SNR >= 12 dB
  (measured 15.4-17.8 dB on the embedded model at g128, rtn 18.1-18.9). --eval is the check that matters.
"""
from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import click
import numpy as np

from nanoqwen_format import (LAYOUT_INT4_ROWMAJOR_K8_ASYM, BlobKind, DType, NanoqwenFormatError,
                             dequantize_int4_asym_reference, open_file)
from nanoqwen_format.writer import file_kind

from .cast import bf16_to_f32
from .errstats import stats_int4, stats_plain
from .hf import ConvertError
from .load import load_checkpoint
from .one_line_errors import OneLineErrorCommand
from .quantize import dequantize

F16_MIN_SNR_DB = 60.0
INT4_MIN_SNR_DB = 15.0
INT4_GPTQ_MIN_SNR_DB = 12.0                # see the docstring: GPTQ trades weight error for output error
F16_REL_BOUND = 2.0 ** -11                 # half an ulp of f16's 11-bit significand, relative
F16_ABS_BOUND = 2.0 ** -25                 # half the f16 subnormal quantum
INT4_BOUND_SLACK_REL = 2.0 ** -16          # float32 division before rint: |w/s| <= 7.5 times 2^-24 << 2^-16 of s/2
INT4_BOUND_SLACK_ABS = 2.0 ** -40
INT4_ZERO_SCALE_MAX_ABS = 2.0 ** -25 * 7 / 0.6   # largest |w| whose group scale may round to f16 zero
BLOCK_ELEMS = 8 * 1024 * 1024              # elements compared per block
# Files from other writers may hold bf16 / f32 tensors: bf16 keeps 8 significant bits (half-ulp 2^-8 relative,
# SNR >= 10 log10(2^16) = 48 dB, threshold 45 dB); f32 must be exact when the source is bf16/f16/f32.
PLAIN_BOUNDS = {DType.F16: (F16_REL_BOUND, F16_ABS_BOUND), DType.BF16: (2.0 ** -8, 2.0 ** -134),
                DType.F32: (0.0, 0.0)}
MIN_SNR_DB = {DType.F16: F16_MIN_SNR_DB, DType.BF16: 45.0, DType.F32: math.inf, DType.INT4G: INT4_MIN_SNR_DB}

THRESHOLDS = {
    "f16": {"min_snr_db": F16_MIN_SNR_DB, "element_bound": "|w-w'| <= 2^-11|w| + 2^-25"},
    "int4g": {"min_snr_db": INT4_MIN_SNR_DB,
              "element_bound": "|w-w'| <= max(s/2, |w|-7s)(1+2^-16) + 2^-40; s == 0 only if |w| < 4e-7"},
}


@dataclass
class TensorReport:
    name: str
    dtype: str
    shape: list
    group_size: int
    rel_rmse: float
    max_abs_err: float
    snr_db: float
    bound_violations: int
    min_snr_db: float
    ok: bool


def _kind(name: str) -> str:
    parts = name.split(".")
    if name == "model.embed_tokens.weight":
        return "embed"
    if name == "lm_head.weight":
        return "lm_head"
    if name == "model.norm.weight" or parts[-2].endswith("layernorm"):
        return "norm"
    if parts[-1] == "bias":
        return parts[-2] + ".bias"
    return parts[-2]


def _compare_tensor(f, ckpt, name: str, gptq: bool = False) -> TensorReport:
    info = f.tensors[name]
    shape = info.shape
    rows = shape[0]
    per_row = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
    step = max(1, BLOCK_ELEMS // per_row)
    sig = err2 = 0.0
    max_abs = 0.0
    violations = 0
    for a in range(0, rows, step):
        b = min(rows, a + step)
        ref = ckpt.read_rows(name, a, b)                                         # float32 (rows, ...)
        if info.dtype == DType.INT4G:
            g = info.group_size
            if info.layout_id == LAYOUT_INT4_ROWMAJOR_K8_ASYM:
                q, s, z = f.int4_asym(name)
                got = dequantize_int4_asym_reference(q[a:b], s[a:b], z[a:b], g)     # float32 (rows, K)
            else:
                q, s = f.int4(name)
                got = dequantize(q[a:b], s[a:b], g)                                # float32 (rows, K)
            st = stats_int4(ref, got, s[a:b].astype(np.float32), g, INT4_BOUND_SLACK_REL, INT4_BOUND_SLACK_ABS,
                            INT4_ZERO_SCALE_MAX_ABS)
        else:
            view = f.array(name)[a:b]                                              # zero-copy rows
            got = bf16_to_f32(view) if info.dtype == DType.BF16 else view.astype(np.float32)
            st = stats_plain(ref, got, *PLAIN_BOUNDS[info.dtype])
        sig += float(st[0])
        err2 += float(st[1])
        max_abs = max(max_abs, float(st[2]))
        violations += int(st[3])
    n = max(1, rows * per_row)
    rel = math.sqrt(err2 / sig) if sig > 0 else (0.0 if err2 == 0 else math.inf)
    snr = math.inf if err2 == 0 else (10 * math.log10(sig / err2) if sig > 0 else -math.inf)
    min_snr = MIN_SNR_DB[info.dtype]
    if gptq and info.dtype == DType.INT4G:
        min_snr, violations = INT4_GPTQ_MIN_SNR_DB, 0
    ok = violations == 0 and snr >= min_snr and math.isfinite(math.sqrt(err2 / n))
    return TensorReport(name=name, dtype=info.dtype.name.lower(), shape=list(shape), group_size=info.group_size,
                        rel_rmse=rel, max_abs_err=max_abs, snr_db=snr, bound_violations=violations,
                        min_snr_db=min_snr, ok=ok)


def _check_tokenizer(f) -> dict:
    tj = f.blob(BlobKind.TOKENIZER_JSON)
    if tj is None:
        return {"present": False, "ok": True}
    try:
        from tokenizers import Tokenizer
        tok = Tokenizer.from_str(tj.decode("utf-8"))
    except Exception as e:
        return {"present": True, "ok": False, "error": f"tokenizer.json does not load: {e}".splitlines()[0]}
    n = tok.get_vocab_size(with_added_tokens=True)
    ok = n <= f.config.vocab_rows
    out = {"present": True, "ok": ok, "vocab_size": n}
    if not ok:
        out["error"] = f"tokenizer has {n} tokens, more than the {f.config.vocab_rows} embedding rows"
    return out


def verify_file(path, source=None, revision=None) -> dict:
    """Build the report dict (what --json prints). Raises ConvertError for an unreadable source, OSError for a
    missing file."""
    report: dict = {"file": str(path), "valid": False, "error": None, "source": None, "ok": False}
    try:
        f = open_file(path, verify_checksums=True)
    except NanoqwenFormatError as e:
        report["error"] = f"{type(e).__name__}: {e}"
        return report
    with f:
        report.update(valid=True, version=f.version, file_size=f.file_size, config=f.config.to_dict(),
                      n_tensors=len(f.tensors), checksums="ok",
                      blobs=[BlobKind(k).name.lower() for k in f.blob_kinds],
                      dtypes={d: sum(1 for t in f.tensors.values() if t.dtype.name.lower() == d)
                              for d in sorted({t.dtype.name.lower() for t in f.tensors.values()})})
        report["provenance"] = f.blob_json(BlobKind.PROVENANCE)
        report["tokenizer"] = _check_tokenizer(f)
        ok = report["tokenizer"]["ok"]
        if source is not None:
            ckpt = load_checkpoint(source, revision)
            report["source"] = str(source)
            report["thresholds"] = THRESHOLDS
            src_cfg = ckpt.config.canonical()
            report["config_matches_source"] = src_cfg == f.config
            if not report["config_matches_source"]:
                diff = {k: [v, getattr(src_cfg, k)] for k, v in f.config.to_dict().items()
                        if getattr(src_cfg, k) != v}
                report["config_diff"] = diff      # field: [file, source]
                ok = False
            else:
                gptq = ((report["provenance"] or {}).get("quantizer") or {}).get("mode") == "gptq"
                tensors = [_compare_tensor(f, ckpt, name, gptq) for name in f.tensors]
                report["tensors"] = [asdict(t) for t in tensors]
                report["summary"] = _summary(tensors)
                ok = ok and all(t.ok for t in tensors)
        report["ok"] = bool(ok)
    return report


def _summary(tensors: list[TensorReport]) -> list[dict]:
    groups: dict[tuple[str, str], list[TensorReport]] = {}
    for t in tensors:
        groups.setdefault((_kind(t.name), t.dtype), []).append(t)
    out = []
    for (kind, dtype), ts in groups.items():
        worst = min(ts, key=lambda t: t.snr_db)
        out.append({"kind": kind, "dtype": dtype, "count": len(ts), "min_snr_db": worst.snr_db,
                    "mean_snr_db": float(np.mean(fin)) if (fin := [t.snr_db for t in ts if math.isfinite(t.snr_db)])
                    else math.inf,
                    "max_rel_rmse": max(t.rel_rmse for t in ts), "max_abs_err": max(t.max_abs_err for t in ts),
                    "worst": worst.name, "ok": all(t.ok for t in ts)})
    return out


def _fmt_db(x: float) -> str:
    return "exact" if x == math.inf else f"{x:.2f}"


def print_report(r: dict, eval_lines: list[str] = ()) -> None:
    echo = click.echo
    if not r["valid"]:
        echo(f"INVALID {r['file']}: {r['error']}")
        return
    c = r["config"]
    echo(f"{r['file']}: valid nanoqwen v{r['version']}, {r['file_size'] / 2**20:.1f} MiB, {r['n_tensors']} tensors "
         f"({', '.join(f'{n} {d}' for d, n in r['dtypes'].items())}), checksums ok")
    echo(f"  {c['arch']}: {c['n_layers']} layers, hidden {c['hidden_size']}, heads {c['n_heads']}/{c['n_kv_heads']}"
         f" x {c['head_dim']}, vocab rows {c['vocab_rows']}, tied={c['tied_embeddings']}")
    echo(f"  blobs: {', '.join(r['blobs']) or 'none'}")
    tk = r["tokenizer"]
    if tk["present"]:
        echo(f"  tokenizer: {'ok' if tk['ok'] else 'BAD'} ({tk.get('vocab_size', '?')} tokens)"
             + (f" - {tk['error']}" if tk.get("error") else ""))
    if r.get("source") is not None:
        echo(f"  source: {r['source']}")
        if not r["config_matches_source"]:
            echo(f"  CONFIG MISMATCH (file vs source): {r['config_diff']}")
        else:
            echo(f"  {'kind':<16} {'dtype':<6} {'n':>4} {'min SNR dB':>10} {'mean SNR':>9} {'max relRMSE':>11} "
                 f"{'max |err|':>10}  status")
            for s in r["summary"]:
                echo(f"  {s['kind']:<16} {s['dtype']:<6} {s['count']:>4} {_fmt_db(s['min_snr_db']):>10} "
                     f"{_fmt_db(s['mean_snr_db']):>9} {s['max_rel_rmse']:>11.4g} {s['max_abs_err']:>10.4g}  "
                     f"{'ok' if s['ok'] else 'FAIL'}")
            for t in r["tensors"]:
                if not t["ok"]:
                    echo(f"  FAIL {t['name']}: SNR {_fmt_db(t['snr_db'])} dB (min {t['min_snr_db']}), "
                         f"{t['bound_violations']} elements over the bound")
            echo(f"  thresholds: f16 SNR >= {F16_MIN_SNR_DB} dB, int4 SNR >= {INT4_MIN_SNR_DB} dB, "
                 f"per-element bounds (see nanoqwen-verify --help)")
    for line in eval_lines:
        echo(line)
    echo("OK" if r["ok"] else "FAILED")


def _finite(o):
    """JSON has no inf: encode non-finite floats as the strings 'inf' / '-inf' / 'nan'."""
    if isinstance(o, float) and not math.isfinite(o):
        return str(o)
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, list):
        return [_finite(v) for v in o]
    return o


@click.command(name="nanoqwen-verify", cls=OneLineErrorCommand,
               context_settings={"help_option_names": ["-h", "--help"]}, help=__doc__)
@click.argument("file", type=click.Path())
@click.option("--source", default=None, help="the checkpoint FILE was made from: Hugging Face dir or hub id (bf16/f16/f32, "
              "GPTQ or AWQ: compared against their exact dequantization), or a GGUF file; with --eval also a .nanoqwen "
              "file (then only --eval compares)")
@click.option("--revision", default=None, help="hub revision of --source")
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON on stdout (no table)")
@click.option("--eval", "eval_text", is_flag=False, flag_value="", default=None, metavar="[TEXT]",
              help="also compare FILE with --source on a text file (default: the shipped held-out text)")
@click.option("--eval-tokens", type=click.IntRange(1), default=None,
              help="tokens of the text to score with --eval (default 4096)")
def main(file, source, revision, as_json, eval_text, eval_tokens):
    from .evaluate import DEFAULT_MAX_TOKENS, EvalError, evaluate, format_eval
    if eval_text is not None and source is None:
        click.echo("nanoqwen-verify: error: --eval needs --source (the model FILE is compared with)", err=True)
        sys.exit(2)
    try:
        if not Path(file).exists():
            raise FileNotFoundError(file)
        if not Path(file).is_file():     # a directory, or a FIFO / device that would block or never end
            kind = file_kind(os.stat(file).st_mode)
            click.echo(f"nanoqwen-verify: error: {file}: is {kind}, expected a .nanoqwen file", err=True)
            sys.exit(2)
        src_is_file = source is not None and str(source).endswith(".nanoqwen") and Path(source).is_file()
        if src_is_file and eval_text is None:   # a .nanoqwen holds no source weights: only --eval compares with it
            click.echo(f"nanoqwen-verify: error: --source {source} is a .nanoqwen file, which only --eval compares "
                       f"with; add --eval, or give the checkpoint FILE was converted from", err=True)
            sys.exit(2)
        report = verify_file(file, None if src_is_file else source, revision)   # a file source: --eval only
        if eval_text is not None and report["valid"]:
            report["eval"] = evaluate(file, source, eval_text or None, revision=revision,
                                      max_tokens=eval_tokens or DEFAULT_MAX_TOKENS)
            report["ok"] = bool(report["ok"] and report["eval"]["ok"])
    except EvalError as e:
        click.echo(f"nanoqwen-verify: error: eval: {e}", err=True)
        sys.exit(2)
    except FileNotFoundError:
        click.echo(f"nanoqwen-verify: error: {file}: no such file", err=True)
        sys.exit(2)
    except ConvertError as e:
        click.echo(f"nanoqwen-verify: error: source: {e}", err=True)
        sys.exit(2)
    except OSError as e:
        click.echo(f"nanoqwen-verify: error: {file}: {e.strerror or e}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        click.echo("nanoqwen-verify: interrupted", err=True)
        sys.exit(130)
    if as_json:
        click.echo(json.dumps(_finite(report), indent=1, allow_nan=False))
    else:
        print_report(report, format_eval(report["eval"]) if "eval" in report else [])
    if not report["valid"]:
        click.echo(f"nanoqwen-verify: invalid file: {report['error']}", err=True)
    sys.exit(0 if report["ok"] else 1)


if __name__ == "__main__":  # pragma: no cover
    main()
