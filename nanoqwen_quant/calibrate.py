"""Calibration for --mode gptq: the input Hessian H = (2/T) X^T X of every linear layer, from a forward pass of
the unquantized model (the source converted with --quant none, run on the CPU backend) over a calibration text.

The layers' inputs are recorded by wrapping the backend's Linear objects (nothing in the runtime changes):
q/k/v share one input (the attention norm's output), gate/up share one (the MLP norm's output); o_proj and
down_proj have their own. Activations come from the unquantized model (GPTQ's sequential variant would feed
quantized layers' outputs forward instead; not done here).

Default calibration text: Python standard-library files of the running interpreter from the *training* side of
the split in nanoqwen_quant.stdlib_split (the rule models/tiny-py was trained with), in hash order, so it never
overlaps the held-out files that --eval and bench/quality.py measure on.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import numpy as np

from .stdlib_split import is_heldout, list_stdlib_files, read_text, stdlib_root

CALIB_TOKENS = 8192            # tokens of calibration text (GPTQ's paper: 128 x 2048; a small model needs fewer)
CALIB_CONTEXT = 512            # tokens per calibration window
# Refuse --mode gptq when the Hessians (float32, kept for every layer) need more than this fraction of RAM.
HESSIAN_RAM_FRACTION = 0.5


def default_calibration_text(max_chars: int = 400_000) -> str:
    """Training-side standard-library .py files, in sha256 order, up to max_chars characters."""
    root = stdlib_root()
    rels = [r for r in list_stdlib_files(root) if not is_heldout(r)]
    rels.sort(key=lambda r: hashlib.sha256(r.encode("utf-8")).digest())
    parts, n = [], 0
    for rel in rels:
        t = read_text(root, rel)
        if t is None:
            continue
        parts.append(t)
        n += len(t)
        if n >= max_chars:
            break
    return "\n\n".join(parts)


def hessian_bytes(config) -> int:
    """float32 bytes of every layer's Hessians (attention input, o_proj input, MLP input, down_proj input)."""
    h, qo, i = config.hidden_size, config.n_heads * config.head_dim, config.intermediate_size
    return 4 * config.n_layers * (2 * h * h + qo * qo + i * i)


def gptq_flops(config, tokens: int = CALIB_TOKENS) -> tuple[float, float]:
    """(calibration forward FLOPs, GPTQ FLOPs) for an estimate of the time: the forward is ~2 x params per token
    plus the X^T X products; GPTQ costs ~2 N K^2 per weight (the error feedback) plus K^3 for the inverse."""
    h, qo, kv, i = (config.hidden_size, config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim,
                    config.intermediate_size)
    mats = [(qo, h), (kv, h), (kv, h), (h, qo), (i, h), (i, h), (h, i)]          # (N, K) per layer
    params = config.n_layers * sum(n * k for n, k in mats)       # the layers' linears (no lm_head: not run)
    fwd = tokens * (2 * params + 2 * config.n_layers * (2 * h * h + qo * qo + i * i))
    gq = config.n_layers * sum(2 * n * k * k for n, k in mats) + config.n_layers * 4 * (2 * h ** 3 + qo ** 3 + i ** 3)
    return float(fwd), float(gq)


class _Recorder:
    """Wraps a Linear: accumulates x^T x (float32) of its inputs into acc["xtx"], counts rows in acc["t"]."""

    def __init__(self, inner, acc: dict):
        self.inner = inner
        self.acc = acc

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        self.acc["xtx"] += x.T @ x
        self.acc["t"] += x.shape[0]
        return self.inner(x)


def collect_hessians(f16_path, ids: np.ndarray, context: int = CALIB_CONTEXT) -> dict[str, np.ndarray]:
    """Run the f16 file over ids in windows of `context`; return {linear weight name: H float32 (K, K)}.
    Weights that share an input share one array."""
    from nanoqwen_rt.backends.cpu import CPUBackend
    out: dict[str, np.ndarray] = {}
    with CPUBackend(f16_path, max_context=context) as be:
        accs = []
        for li, L in enumerate(be.layers):
            p = f"model.layers.{li}."
            a_in = {"xtx": np.zeros((L.q.K, L.q.K), np.float32), "t": 0}
            o_in = {"xtx": np.zeros((L.o.K, L.o.K), np.float32), "t": 0}
            m_in = {"xtx": np.zeros((L.gate.K, L.gate.K), np.float32), "t": 0}
            d_in = {"xtx": np.zeros((L.down.K, L.down.K), np.float32), "t": 0}
            L.q, L.o, L.gate, L.down = (_Recorder(L.q, a_in), _Recorder(L.o, o_in), _Recorder(L.gate, m_in),
                                        _Recorder(L.down, d_in))
            accs.append((p, a_in, o_in, m_in, d_in))
        be.lm_head = lambda h: h                  # calibration needs the layers' inputs, not the logits
        for a in range(0, len(ids), context):
            w = ids[a:a + context]
            if len(w):
                be.logits_all(w)
        for p, a_in, o_in, m_in, d_in in accs:
            h = {k: (2.0 / max(1, d["t"])) * d["xtx"] for k, d in
                 (("a", a_in), ("o", o_in), ("m", m_in), ("d", d_in))}
            for name, key in (("self_attn.q_proj", "a"), ("self_attn.k_proj", "a"), ("self_attn.v_proj", "a"),
                              ("self_attn.o_proj", "o"), ("mlp.gate_proj", "m"), ("mlp.up_proj", "m"),
                              ("mlp.down_proj", "d")):
                out[f"{p}{name}.weight"] = h[key]
    return out


def check_hessians_fit(config) -> None:
    """Refuse --mode gptq before anything is converted when every layer's Hessians would not fit in memory."""
    from .hf import ConvertError
    need = hessian_bytes(config)
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need > HESSIAN_RAM_FRACTION * ram:
        raise ConvertError(f"--mode gptq keeps every layer's Hessian in memory: {need / 2**30:.1f} GiB, more "
                           f"than {HESSIAN_RAM_FRACTION:.0%} of this machine's {ram / 2**30:.1f} GiB; use --mode mse")


def calibration_hessians(f16_file, text: str | None = None, tokens: int = CALIB_TOKENS) -> dict[str, np.ndarray]:
    """The Hessians of every linear from an unquantized (f16) conversion of the source: tokenize the calibration
    text with the file's tokenizer and run the CPU backend over it. The caller makes the f16 file
    (convert_checkpoint(..., quant="none")) and checks check_hessians_fit first."""
    from nanoqwen_format import open_file
    from nanoqwen_rt.tokenizer import Tokenizer

    from .hf import ConvertError
    with open_file(f16_file, verify_checksums=False) as f:
        cfg = f.config
        try:
            tok = Tokenizer.from_file(f)
        except Exception as e:
            raise ConvertError(f"--mode gptq needs the checkpoint's tokenizer: {e}".splitlines()[0]) from None
        ids = np.asarray(tok.encode(text if text is not None else default_calibration_text()), np.int32)
    if len(ids) < 2:
        raise ConvertError("calibration text gives fewer than 2 tokens")
    ctx = min(CALIB_CONTEXT, int(cfg.max_positions))
    return collect_hessians(f16_file, ids[:tokens], ctx)


def calibration_workdir(out: Path) -> tempfile.TemporaryDirectory:
    """A temp dir beside the output (same disk: the f16 copy of the source is as large as the source)."""
    return tempfile.TemporaryDirectory(prefix=".nanoqwen-calib-", dir=out.parent)


# Throughput of the two phases on the 2-core development VM (bench/RESULTS.md, quantizer section), for the
# up-front estimate: the calibration forward runs on the CPU backend (f16 weights), GPTQ in float64 BLAS.
FORWARD_FLOPS_PER_S = 8e9
GPTQ_FLOPS_PER_S = 4e9


def gptq_time_estimate(src, revision=None, threads: int | None = None) -> str:
    """One line for stderr before a --mode gptq conversion starts: its expected time and Hessian memory."""
    from .load import load_checkpoint
    cfg = load_checkpoint(src, revision).config
    fwd, gq = gptq_flops(cfg)
    secs = fwd / FORWARD_FLOPS_PER_S + gq / GPTQ_FLOPS_PER_S
    return (f"--mode gptq: calibration forward over {CALIB_TOKENS} tokens ({fwd / 1e12:.2f} TFLOP) + GPTQ of "
            f"{7 * cfg.n_layers} matrices ({gq / 1e12:.2f} TFLOP), Hessians {hessian_bytes(cfg) / 2**30:.2f} GiB: "
            f"expect about {secs / 60:.1f} min on 2 cores (rtn takes seconds)")
