"""Model quality on text: a converted file against its source, as llama.cpp's `perplexity --kl-divergence` does.

Both models run on the CPU backend over the same token windows (teacher forcing). The source is either another
.nanoqwen file or a Hugging Face checkpoint, which is first converted with --quant none (f16 weights: exact for
f16 sources, bf16 values are f16-representable unless tiny (subnormal in f16) or beyond 65504, which the
converter refuses). Reported, over every scored token:

* perplexity of each: exp(mean -log p(next token));
* KL divergence per token, KL(source ‖ file) = Σ_v p_src(v) (log p_src(v) − log p_file(v)), in nats: mean, p99, max;
* top-1 agreement: the fraction of positions where both argmaxes are the same token.

The text is tokenized with the file's own tokenizer and cut into consecutive windows of `context` + 1 tokens
(every token after a window's first is scored once); at most `max_tokens` tokens are scored.
Default text: nanoqwen_quant/data/eval_heldout.txt, 41 KB of Python: the first 3,000 characters (cut at a line
end) of each of the first 16 files of models/tiny-py/heldout_files.txt (CPython 3.11.7 standard library, PSF
license), joined by blank lines. The embedded model never saw these files in training.

Thresholds (a file fails --eval when any is exceeded; nanoqwen-verify then exits 1):
* EVAL_MAX_PPL_GAP: perplexity at most +5 % over the source's (the project's INT4 target).
* EVAL_MAX_MEAN_KL: mean KL at most 0.05 nats/token. Plain INT4 g128 on the embedded model measures ~0.004
  (bench/RESULTS.md), so 0.05 flags a broken file (wrong scales, wrong layer) long before it flags rounding.
* EVAL_MIN_TOP1: top-1 agreement at least 85 %: the embedded model agrees at ~95 % under rtn g128; a file whose
  argmax differs on more than one token in seven is a different model for greedy decoding.
"""
from __future__ import annotations

import math
import tempfile
from pathlib import Path

import numpy as np

EVAL_MAX_PPL_GAP = 0.05
EVAL_MAX_MEAN_KL = 0.05
EVAL_MIN_TOP1 = 0.85
EVAL_THRESHOLDS = {"max_ppl_gap": EVAL_MAX_PPL_GAP, "max_mean_kl_nats": EVAL_MAX_MEAN_KL,
                   "min_top1_agreement": EVAL_MIN_TOP1}
DEFAULT_TEXT = Path(__file__).resolve().parent / "data" / "eval_heldout.txt"
DEFAULT_CONTEXT = 512          # tokens predicted per window (capped by the model's max positions)
DEFAULT_MAX_TOKENS = 4096      # scored tokens: ~1 s on the embedded model, ~30 s per model at 135M on 2 cores
KL_PERCENTILE = 99.0


class EvalError(ValueError):
    """The evaluation cannot run (unreadable text, too few tokens, source and file that do not match)."""


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """float64 log-probabilities of logits (T, V)."""
    x = np.asarray(logits, dtype=np.float64)
    m = x.max(axis=1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))


def compare_logits(ref_logits: np.ndarray, logits: np.ndarray, targets: np.ndarray) -> dict:
    """Per-position numbers of one window: ref / file NLL of the targets, KL(ref ‖ file), argmax agreement."""
    lp_ref = log_softmax(ref_logits)
    lp = log_softmax(logits)
    rows = np.arange(len(targets))
    kl = np.sum(np.exp(lp_ref) * (lp_ref - lp), axis=1)
    return {"nll_ref": -lp_ref[rows, targets], "nll": -lp[rows, targets], "kl": np.maximum(kl, 0.0),
            "top1_same": np.argmax(lp_ref, axis=1) == np.argmax(lp, axis=1)}


def summarize(parts: list[dict]) -> dict:
    """Combine compare_logits results into the report numbers."""
    cat = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    ppl_ref = math.exp(float(np.mean(cat["nll_ref"])))
    ppl = math.exp(float(np.mean(cat["nll"])))
    return {"tokens": int(len(cat["kl"])), "ppl_source": ppl_ref, "ppl": ppl, "ppl_gap": ppl / ppl_ref - 1.0,
            "mean_kl": float(np.mean(cat["kl"])), "p99_kl": float(np.percentile(cat["kl"], KL_PERCENTILE)),
            "max_kl": float(np.max(cat["kl"])), "top1_agreement": float(np.mean(cat["top1_same"]))}


def verdict(s: dict) -> dict:
    """Which thresholds the summary meets: {"ok": bool, "failed": [names]}."""
    failed = []
    if not s["ppl_gap"] <= EVAL_MAX_PPL_GAP:
        failed.append("max_ppl_gap")
    if not s["mean_kl"] <= EVAL_MAX_MEAN_KL:
        failed.append("max_mean_kl_nats")
    if not s["top1_agreement"] >= EVAL_MIN_TOP1:
        failed.append("min_top1_agreement")
    return {"ok": not failed, "failed": failed}


def token_windows(ids: np.ndarray, context: int, max_tokens: int) -> list[np.ndarray]:
    """Consecutive windows of context + 1 tokens (the last may be shorter, ≥ 2), until max_tokens are scored."""
    out, scored = [], 0
    for a in range(0, len(ids) - 1, context):
        n = min(context, len(ids) - 1 - a, max_tokens - scored)
        if n < 1:
            break
        out.append(ids[a:a + n + 1])
        scored += n
    return out


def read_text(text_path) -> str:
    p = Path(text_path) if text_path else DEFAULT_TEXT
    try:
        return p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise EvalError(f"text {str(p)!r}: {getattr(e, 'strerror', None) or e}") from None


def evaluate_files(path, source_path, text: str, *, context: int = DEFAULT_CONTEXT,
                   max_tokens: int = DEFAULT_MAX_TOKENS) -> dict:
    """Run two .nanoqwen files over `text` and compare (source_path is the reference)."""
    from nanoqwen_format import open_file
    from nanoqwen_rt.backends.cpu import CPUBackend
    from nanoqwen_rt.tokenizer import Tokenizer

    with open_file(path, verify_checksums=False) as f, open_file(source_path, verify_checksums=False) as fs:
        if f.config.vocab_rows != fs.config.vocab_rows:
            raise EvalError(f"vocabularies differ: file has {f.config.vocab_rows} rows, source "
                            f"{fs.config.vocab_rows}")
        try:
            tok = Tokenizer.from_file(f)
        except Exception as e:
            raise EvalError(f"the file's tokenizer does not load: {e}".splitlines()[0]) from None
        ctx = max(1, min(context, int(f.config.max_positions) - 1))
        ids = np.asarray(tok.encode(text), dtype=np.int32)
        windows = token_windows(ids, ctx, max_tokens)
        if not windows:
            raise EvalError(f"the text gives {len(ids)} tokens; at least 2 are needed")
        parts = []
        with CPUBackend(path, max_context=ctx + 1, file=f) as be, \
                CPUBackend(source_path, max_context=ctx + 1, file=fs) as ref:
            for w in windows:
                parts.append(compare_logits(ref.logits_all(w[:-1]), be.logits_all(w[:-1]), w[1:]))
    s = summarize(parts)
    s.update(context=ctx, windows=len(windows), text_tokens=int(len(ids)), thresholds=EVAL_THRESHOLDS)
    s.update(verdict(s))
    return s


def evaluate(path, source, text_path=None, *, revision=None, context: int = DEFAULT_CONTEXT,
             max_tokens: int = DEFAULT_MAX_TOKENS) -> dict:
    """--eval: `source` is a .nanoqwen file or a Hugging Face checkpoint (converted to f16 in a temp dir)."""
    text = read_text(text_path)
    src = Path(str(source))
    if src.is_file() and src.suffix == ".nanoqwen":
        out = evaluate_files(path, src, text, context=context, max_tokens=max_tokens)
        out["source_runtime"] = "nanoqwen cpu, the source file as stored"
    else:
        from .convert import convert_checkpoint
        with tempfile.TemporaryDirectory(prefix="nanoqwen-eval-") as td:
            ref = convert_checkpoint(source, Path(td) / "source-f16.nanoqwen", quant="none", revision=revision)
            out = evaluate_files(path, ref, text, context=context, max_tokens=max_tokens)
        out["source_runtime"] = "nanoqwen cpu, the source converted with --quant none (f16)"
    out["text"] = str(Path(text_path) if text_path else DEFAULT_TEXT)
    return out


def format_eval(e: dict) -> list[str]:
    """Human-readable lines of an evaluate() result."""
    t = e["thresholds"]
    mark = {True: "ok", False: "FAIL"}
    return [
        f"  eval: {e['tokens']} tokens of {e['text']} ({e['windows']} windows of <= {e['context']}), "
        f"reference: {e['source_runtime']}",
        f"  perplexity: source {e['ppl_source']:.4f}, file {e['ppl']:.4f} ({100 * e['ppl_gap']:+.2f} %, max "
        f"+{100 * t['max_ppl_gap']:.0f} %) {mark['max_ppl_gap' not in e['failed']]}",
        f"  KL(source||file) nats/token: mean {e['mean_kl']:.5f} (max {t['max_mean_kl_nats']}) "
        f"{mark['max_mean_kl_nats' not in e['failed']]}, p99 {e['p99_kl']:.5f}, max {e['max_kl']:.5f}",
        f"  top-1 agreement: {100 * e['top1_agreement']:.2f} % (min {100 * t['min_top1_agreement']:.0f} %) "
        f"{mark['min_top1_agreement' not in e['failed']]}",
    ]
