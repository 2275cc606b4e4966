"""GPTQ variants at one group size, measured on a trained checkpoint's output (the experiment behind --mode gptq).

    python bench/gptq_variants.py [--checkpoint smollm2-135m | --model DIR [--name NAME]] [--group 64]
                                  [--tokens 2048] [--chunks 1] [--damp 0.01] [--variants rtn,gptq-act,...]
                                  [--json OUT] [--hessians-only] [--fallback-f16]
                                  [--class-groups down_proj=32,...]

Variants (VARIANTS below): rtn, mse; gptq (left to right, mse scales: --mode gptq before act-order), gptq-act
(act-order, static groups: --mode gptq now), awq-rtn (activation-aware input-channel scales, shared as a fold into the
previous RMSNorm / v rows / up rows would need, then rtn), gptq-rtnscale / gptq-act-rtnscale (rtn scales), gptq-hmse /
gptq-act-hmse (scale per group from the mse rule's candidates by diag(H)-weighted error), gptq-dyn-* (scales chosen
on the error-updated weights when a group starts; slow numpy path). Measured ones: bench/NOTES.md.

Every variant quantizes every q/k/v/o/gate/up/down weight of the checkpoint at --group and is scored like
`nanoqwen-verify --eval` (nanoqwen_quant.evaluate: perplexity gap, mean / p99 KL, top-1 agreement against the
unquantized model, on nanoqwen_quant/data/eval_heldout.txt). To try many variants in one process without writing a
file per variant, the quantized weights are dequantized (float32(f16 scale) * code, exact in float32) and put in
place of the f16 conversion's linears on the CPU backend (its F32 linear path: the same products as the INT4 kernel,
summed in another order). The chosen variant is then measured through the real converter by bench/quality.py.

Cached in --cache (default ~/.cache/nanoqwen-bench): the f16 conversion and the calibration Hessians, per chunk of
CALIB_TOKENS tokens of nanoqwen_quant.calibrate's default text (chunk i = tokens [i*8192, (i+1)*8192)), so a
larger calibration set reuses the chunks already computed (H of the union = mean of the chunks' H: equal counts).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj")


def log(msg: str) -> None:
    print(f"[variants {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def f16_file(model: Path, name: str, cache: Path) -> Path:
    from nanoqwen_quant.convert import convert_checkpoint
    p = cache / f"{name}-f16.nanoqwen"
    if not p.exists():
        convert_checkpoint(model, p, quant="none")
    return p


def hessian_chunk(f16: Path, name: str, cache: Path, i: int) -> dict[str, np.ndarray]:
    """Hessians of calibration chunk i (tokens [i*CALIB_TOKENS, (i+1)*CALIB_TOKENS) of the default text)."""
    from nanoqwen_format import open_file
    from nanoqwen_quant.calibrate import CALIB_CONTEXT, CALIB_TOKENS, collect_hessians, default_calibration_text
    from nanoqwen_rt.tokenizer import Tokenizer
    p = cache / f"{name}-hessians-chunk{i}.npz"
    if p.exists():
        with np.load(p) as z:
            return {k: z[k] for k in z.files}
    with open_file(f16, verify_checksums=False) as f:
        tok = Tokenizer.from_file(f)
        ctx = min(CALIB_CONTEXT, int(f.config.max_positions))
    ids = np.asarray(tok.encode(default_calibration_text()), np.int32)
    chunk = ids[i * CALIB_TOKENS:(i + 1) * CALIB_TOKENS]
    if len(chunk) < CALIB_TOKENS:
        raise SystemExit(f"calibration text has {len(ids)} tokens, fewer than chunk {i} needs")
    t = time.time()
    h = collect_hessians(f16, chunk, ctx)
    log(f"{name}: Hessians of calibration chunk {i} ({CALIB_TOKENS} tokens) in {time.time() - t:.0f} s")
    tmp = p.with_suffix(".tmp.npz")
    np.savez(tmp, **h)
    tmp.replace(p)
    return h


# ----------------------------------------------------------------------------------------------- variants
def _f16(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def scales_weighted(w: np.ndarray, d: np.ndarray, g: int) -> np.ndarray:
    """Per group, the mse rule's candidate scale (r = 1.00 ... 0.60 of amax / 7, rounded to f16) with the lowest
    diag(H)-weighted error sum_k d_k (w_k - s q_k)^2 instead of the plain sum. w (N, K) float64, d (K,) → (N, K/g)."""
    from nanoqwen_quant.quantize import MSE_RATIOS, QMAX, QMIN, RTN_DIVISOR
    n, k = w.shape
    wg = w.reshape(n, k // g, g)
    dg = d.reshape(1, k // g, g)
    amax = np.abs(wg).max(axis=2).astype(np.float32)
    best_s, best_e = None, None
    for r in MSE_RATIOS:
        s = _f16((np.float32(r) * amax) / np.float32(RTN_DIVISOR)).astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.where(s[..., None] == 0, 0.0, np.clip(np.rint(wg / np.where(s == 0, 1, s)[..., None]), QMIN, QMAX))
        e = ((wg - s[..., None] * q) ** 2 * dg).sum(axis=2)
        if best_s is None:
            best_s, best_e = s, e
        else:
            better = e < best_e
            best_s, best_e = np.where(better, s, best_s), np.where(better, e, best_e)
    return best_s


_LAST_U: list = [None, None]


def gptq_general(w, h, g, scale_rule="mse", order="natural", dynamic=False, damp=0.01, block=128):
    """GPTQ variants, float64. scale_rule: rtn | mse | hmse (diag(H)-weighted mse); order: natural | act
    (columns by descending diag(H), scales fixed per plain group before the permutation: static groups);
    dynamic: scales chosen on the error-updated weights when a group starts (natural order only).
    Returns (codes int8 (N, K), scales float64 (N, K/g), f16-exact)."""
    from nanoqwen_quant.gptq import _round, inverse_cholesky
    from nanoqwen_quant.quantize import quantize
    w = np.array(w, dtype=np.float64)
    n, k = w.shape
    dh = np.diag(h).astype(np.float64)

    def pick(wpart, dpart):
        if scale_rule == "hmse":
            return scales_weighted(wpart, dpart, g)
        return quantize(wpart.astype(np.float32), g, scale_rule)[1].astype(np.float64)

    perm = np.arange(k) if order == "natural" else np.argsort(-dh, kind="stable")
    if dynamic and order != "natural":
        raise ValueError("dynamic scales need natural order (plain groups)")
    scales = None if dynamic else pick(w, dh)
    key = (id(h), order, damp)                      # q/k/v (and gate/up) share one H: factor it once
    if _LAST_U[0] != key:
        _LAST_U[:] = [key, inverse_cholesky(np.asarray(h, np.float64)[np.ix_(perm, perm)], damp)]
    u = _LAST_U[1]
    if not dynamic:                                    # the product's fast path (numba), same codes
        from nanoqwen_quant.gptq import gptq_codes
        return gptq_codes(w, u, scales, g, block, order=perm), scales
    wp = w[:, perm]
    grp = perm // g
    q = np.zeros((n, k), np.int8)
    if dynamic:
        scales = np.zeros((n, k // g))
    for a in range(0, k, block):
        b = min(k, a + block)
        wb = wp[:, a:b]
        errb = np.empty((n, b - a))
        ub = u[a:b, a:b]
        for i in range(b - a):
            j = a + i
            if dynamic and j % g == 0:
                scales[:, j // g] = pick(wb[:, i:i + g], dh[j:j + g])[:, 0]
            s = scales[:, grp[j]]
            qi = _round(wb[:, i], s)
            q[:, perm[j]] = qi
            err = (wb[:, i] - s * qi) / ub[i, i]
            wb[:, i + 1:] -= np.outer(err, ub[i, i + 1:])
            errb[:, i] = err
        if b < k:
            wp[:, b:] -= errb @ u[a:b, b:]
    return q, scales


VARIANTS = {
    "rtn": None, "mse": None,
    "gptq": dict(scale_rule="mse"),                                    # --mode gptq as it is
    "gptq-rtnscale": dict(scale_rule="rtn"),
    "gptq-hmse": dict(scale_rule="hmse"),
    "gptq-act": dict(scale_rule="mse", order="act"),
    "gptq-act-hmse": dict(scale_rule="hmse", order="act"),
    "gptq-act-rtnscale": dict(scale_rule="rtn", order="act"),
    "gptq-dyn-rtn": dict(scale_rule="rtn", dynamic=True),
    "gptq-dyn-mse": dict(scale_rule="mse", dynamic=True),
    "gptq-dyn-hmse": dict(scale_rule="hmse", dynamic=True),
}


# ----------------------------------------------------------------------------------------------- awq-style scales
AWQ_ALPHAS = tuple(round(0.1 * i, 1) for i in range(11))   # the exponent grid of the scale search (AWQ's own: 20 steps)


def awq_group_scale(ws: list[np.ndarray], h: np.ndarray, g: int, tie=None) -> tuple[np.ndarray, float]:
    """Activation-aware input-channel scales s (K,) for weights ws (each (N_i, K)) that share one input whose
    calibration Hessian (mean x x^T) is h: s = rms(x)^alpha (normalised by sqrt(max * min)), alpha from AWQ_ALPHAS
    minimising the output error of round-to-nearest on W diag(s), sum_i tr(dW_i H dW_i^T) with
    dW_i = W_i - Q(W_i diag(s)) diag(s)^-1. tie(x) maps per-channel values onto the channels that must share a
    scale (o_proj: the query heads of one KV head, whose inputs come from one v row). Returns (s, alpha)."""
    from nanoqwen_quant.quantize import dequantize, quantize
    x = np.sqrt(np.maximum(np.diag(h).astype(np.float64), 1e-12))
    if tie is not None:
        x = tie(x)
    hf = h.astype(np.float32)
    best = (None, None, np.inf)
    for a in AWQ_ALPHAS:
        sc = x ** a
        sc = (sc / np.sqrt(sc.max() * sc.min())).astype(np.float32)
        loss = 0.0
        for w in ws:
            dw = w - dequantize(*quantize(w * sc[None, :], g, "rtn"), g) / sc[None, :]
            loss += float(np.einsum("nk,nk->", dw @ hf, dw))
        if loss < best[2]:
            best = (sc, a, loss)
    return best[0], best[1]


def awq_layer_scales(ckpt, hess, li: int, g: int, n_heads: int, n_kv: int) -> dict[str, tuple[np.ndarray, float]]:
    """Per linear of layer li: its input-channel scale and alpha, shared as a runtime fold would need (q/k/v: the
    input RMSNorm's weight; gate/up: the post-attention RMSNorm's; o: v's rows, one per KV head and dim; down: up's
    rows)."""
    p = f"model.layers.{li}."
    rd = lambda nm: ckpt.read_rows(p + nm + ".weight", 0, ckpt.tensors[p + nm + ".weight"].shape[0]).astype(np.float32)
    out = {}
    s, a = awq_group_scale([rd(n) for n in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")],
                           hess[p + "self_attn.q_proj.weight"], g)
    for n in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
        out[p + n + ".weight"] = (s, a)
    wo = rd("self_attn.o_proj")
    D = wo.shape[1] // n_heads
    tie = lambda x: np.repeat(np.sqrt(np.mean(x.reshape(n_kv, n_heads // n_kv, D) ** 2, axis=1))[:, None, :],
                              n_heads // n_kv, axis=1).reshape(-1)
    out[p + "self_attn.o_proj.weight"] = awq_group_scale([wo], hess[p + "self_attn.o_proj.weight"], g, tie)
    s, a = awq_group_scale([rd("mlp.gate_proj"), rd("mlp.up_proj")], hess[p + "mlp.gate_proj.weight"], g)
    out[p + "mlp.gate_proj.weight"] = out[p + "mlp.up_proj.weight"] = (s, a)
    out[p + "mlp.down_proj.weight"] = awq_group_scale([rd("mlp.down_proj")], hess[p + "mlp.down_proj.weight"], g)
    return out


def dequantized(variant: str, w: np.ndarray, h, g: int, damp: float) -> np.ndarray:
    from nanoqwen_quant.quantize import dequantize, quantize
    base, _, opt = variant.partition("+")
    if base in ("rtn", "mse"):
        return dequantize(*quantize(w, g, base), g)
    kw = dict(VARIANTS[base])
    codes, scales = gptq_general(w, h, g, damp=damp, **kw)
    return (np.repeat(scales, g, axis=1) * codes).astype(np.float32)


def run_variant(variant, ckpt, f16, hess, g, damp, ref_logits, windows, ctx, fallback_f16=False,
                class_groups=None):
    """fallback_f16: linears whose K the group does not divide keep the f16 file's weights (the converter's
    --fallback-f16), instead of failing. class_groups: {"down_proj": 32, ...} group sizes per linear class instead
    of g (a per-tensor choice)."""
    from nanoqwen_quant.evaluate import compare_logits, summarize
    from nanoqwen_quant.quantize import can_quantize
    from nanoqwen_rt.backends.cpu import CPUBackend
    t = time.time()
    kept_f16 = 0
    with CPUBackend(f16, max_context=ctx + 1) as be:
        for li, L in enumerate(be.layers):
            if variant == "awq-rtn":   # activation-aware scales, then rtn; the weights as a fold would leave them
                cfg = be.config
                sc = awq_layer_scales(ckpt, hess, li, g, cfg.n_heads, cfg.n_kv_heads)
                for attr, nm in zip(("q", "k", "v", "o", "gate", "up", "down"), LINEARS):
                    name = f"model.layers.{li}.{nm}.weight"
                    lin = getattr(L, attr)
                    from nanoqwen_quant.quantize import dequantize, quantize
                    s, _ = sc[name]
                    w = ckpt.read_rows(name, 0, lin.N).astype(np.float32)
                    lin.w = (dequantize(*quantize(w * s[None, :], g, "rtn"), g) / s[None, :]).astype(np.float32)
                    lin.kind = "F32"
                log(f"layer {li}: alpha q/k/v {sc[f'model.layers.{li}.self_attn.q_proj.weight'][1]}, "
                    f"o {sc[f'model.layers.{li}.self_attn.o_proj.weight'][1]}, "
                    f"gate/up {sc[f'model.layers.{li}.mlp.gate_proj.weight'][1]}, "
                    f"down {sc[f'model.layers.{li}.mlp.down_proj.weight'][1]}")
                continue
            for attr, nm in zip(("q", "k", "v", "o", "gate", "up", "down"), LINEARS):
                name = f"model.layers.{li}.{nm}.weight"
                lin = getattr(L, attr)
                gt = (class_groups or {}).get(nm.split(".")[-1], g)
                if fallback_f16 and not can_quantize(ckpt.tensors[name].shape, gt):
                    kept_f16 += 1
                    continue
                w = ckpt.read_rows(name, 0, lin.N)
                lin.w = dequantized(variant, w, None if hess is None else hess.get(name), gt, damp)
                lin.kind = "F32"
        tq = time.time() - t
        parts = [compare_logits(r, be.logits_all(w[:-1]), w[1:]) for r, w in zip(ref_logits, windows)]
    r = summarize(parts)
    r.update(variant=variant, group=g, damp=damp, quantize_s=round(tq, 1), total_s=round(time.time() - t, 1))
    if fallback_f16:
        r.update(fallback_f16=kept_f16)
    if class_groups:
        r.update(class_groups=class_groups)
    return r


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", default="smollm2-135m")
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--name", default=None)
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "nanoqwen-bench")
    ap.add_argument("--chunks", type=int, default=1, help="calibration chunks of 8192 tokens")
    ap.add_argument("--hessians-only", action="store_true")
    ap.add_argument("--group", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--damp", type=float, default=0.01)
    ap.add_argument("--variants", default="rtn,gptq")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--fallback-f16", action="store_true",
                    help="keep linears whose K --group does not divide in f16 (the converter's --fallback-f16)")
    ap.add_argument("--class-groups", default="",
                    help="group size per linear class instead of --group, e.g. down_proj=32,o_proj=64")
    a = ap.parse_args(argv)
    class_groups = {k: int(v) for k, v in (kv.split("=") for kv in a.class_groups.split(",") if kv)}
    if a.model is not None:
        model, name = a.model, a.name or a.model.stem
    else:
        from real_checkpoints import materialize
        model, name = materialize(a.checkpoint, a.cache), a.checkpoint
    f16 = f16_file(model, name, a.cache)
    variants = a.variants.split(",")
    hess = None
    if a.hessians_only or any(v.startswith(("gptq", "awq")) for v in variants):
        chunks = [hessian_chunk(f16, name, a.cache, i) for i in range(a.chunks)]
        hess = {k: np.mean([c[k] for c in chunks], axis=0) for k in chunks[0]} if len(chunks) > 1 else chunks[0]
    if a.hessians_only:
        return 0
    from nanoqwen_format import open_file
    from nanoqwen_quant.evaluate import DEFAULT_TEXT, token_windows
    from nanoqwen_quant.load import load_checkpoint
    from nanoqwen_rt.backends.cpu import CPUBackend
    from nanoqwen_rt.tokenizer import Tokenizer
    with open_file(f16) as f:
        tok = Tokenizer.from_file(f)
        ctx = min(512, f.config.max_positions - 1)
    windows = token_windows(np.asarray(tok.encode(DEFAULT_TEXT.read_text(encoding="utf-8")), np.int32), ctx,
                            a.tokens)
    t = time.time()
    ref_path = a.cache / f"{name}-ref-logits-{a.tokens}.npy"       # (scored tokens, vocab rows) float32
    if ref_path.exists():
        flat = np.load(ref_path, mmap_mode="r")
        ref_logits, at = [], 0
        for w in windows:
            ref_logits.append(np.asarray(flat[at:at + len(w) - 1]))
            at += len(w) - 1
    else:
        with CPUBackend(f16, max_context=ctx + 1) as be:
            ref_logits = [be.logits_all(w[:-1]) for w in windows]
        tmp = ref_path.with_suffix(".tmp.npy")
        np.save(tmp, np.concatenate(ref_logits))
        tmp.replace(ref_path)
    log(f"{name}: reference logits in {time.time() - t:.0f} s")
    ckpt = load_checkpoint(model)
    out = a.json or ROOT / "bench" / f"gptq_variants_{name}.json"
    rows = json.loads(out.read_text())["rows"] if out.exists() else []
    for v in variants:
        r = run_variant(v, ckpt, f16, hess, a.group, a.damp, ref_logits, windows, ctx, a.fallback_f16,
                        class_groups)
        r.update(calib_tokens=8192 * a.chunks if v.startswith("gptq") else 0,
                 date_utc=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M"))
        rows.append(r)
        log(f"{name} g{a.group} {a.class_groups} {v} damp {a.damp} calib {r['calib_tokens']}: ppl {r['ppl']:.4f} vs "
            f"{r['ppl_source']:.4f} ({100 * r['ppl_gap']:+.2f} %), KL {r['mean_kl']:.5f}, p99 {r['p99_kl']:.4f}, "
            f"top-1 {100 * r['top1_agreement']:.2f} % ({r['quantize_s']} s quantize, {r['total_s']} s)")
        tmp = out.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"model": name, "rows": rows}, indent=1) + "\n")
        tmp.replace(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
