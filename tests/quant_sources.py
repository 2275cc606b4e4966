"""Independent packers for already-quantized checkpoints (tests only), written from the documented layouts:

* GPTQ (AutoGPTQ QuantLinear / GPTQModel): qweight int32 (K/8, N), 8 consecutive k per word, k = 8r + j at bits
  4j; qzeros int32 (G, N/8), zero of n = 8c + j at bits 4j, stored as zero - 1 (checkpoint_format "gptq") or zero
  ("gptq_v2"); scales f16 (G, N); g_idx int32 (K,). w = s * (q - zero).
* AWQ GEMM (AutoAWQ WQLinear_GEMM): qweight int32 (K, N/8), word c of row k holds n = 8c + ORDER[i] at bits 4i with
  ORDER = (0, 2, 4, 6, 1, 3, 5, 7); qzeros int32 (G, N/8) packed the same way; scales f16 (G, N). w = s * (q - z).

Why not a library packer: auto-gptq (0.7.1, 2024) and autoawq (0.2.9, archived) build or require CUDA kernels at
install and pin older torch; gptqmodel likewise targets GPU builds. They were not installed on this CPU-only
machine (not tried: judged from their packaging), so these are plain per-element loops, deliberately unlike the
vectorized unpackers in nanoqwen_quant.sources.
The values are quantized by round-to-nearest with GPTQ's/AWQ's own scale and zero rules (the packing, not the
Hessian-based weight update, is what the importer must read).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from synth import load_source_f32

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

# Qwen2.5-*-GPTQ-Int4's quantization_config (the fields Qwen publishes; values of the Int4 repos)
QWEN_GPTQ_CONFIG = {"bits": 4, "damp_percent": 0.01, "desc_act": False, "group_size": 128,
                    "model_file_base_name": None, "model_name_or_path": None, "quant_method": "gptq",
                    "static_groups": False, "sym": True, "true_sequential": True}
# Qwen2.5-*-AWQ's quantization_config
QWEN_AWQ_CONFIG = {"bits": 4, "group_size": 128, "modules_to_not_convert": None, "quant_method": "awq",
                   "version": "gemm", "zero_point": True}


def rtn_params(w: np.ndarray, g: int, sym: bool, g_idx: np.ndarray):
    """GPTQ Quantizer.find_params per (group, n), 4 bits: scales f16 (G, N), zeros int (G, N), codes (K, N).
    w: float32 (N, K). Groups follow g_idx (act-order permutes which k belong to a group)."""
    n, k = w.shape
    n_groups = int(g_idx.max()) + 1
    scales = np.zeros((n_groups, n), np.float16)
    zeros = np.zeros((n_groups, n), np.int64)
    for G in range(n_groups):
        cols = w[:, g_idx == G]                                   # (N, members)
        xmin = np.minimum(cols.min(axis=1), 0)
        xmax = np.maximum(cols.max(axis=1), 0)
        if sym:
            xmax = np.maximum(np.abs(xmin), xmax)
            xmin = np.where(xmin < 0, -xmax, xmin)
        both0 = (xmin == 0) & (xmax == 0)
        xmin = np.where(both0, -1, xmin)
        xmax = np.where(both0, 1, xmax)
        s = (xmax - xmin) / 15
        scales[G] = s.astype(np.float16)
        zeros[G] = np.full(n, 8) if sym else np.round(-xmin / s)
    s_k = scales[g_idx].astype(np.float32)                        # (K, N)
    codes = np.clip(np.round(w.T / s_k) + zeros[g_idx], 0, 15).astype(np.int64)
    return scales, zeros, codes


def pack_gptq(codes: np.ndarray, zeros: np.ndarray, zero_offset: int) -> tuple[np.ndarray, np.ndarray]:
    """codes (K, N) 0..15, zeros (G, N) → qweight int32 (K/8, N), qzeros int32 (G, N/8) (stored zero - offset)."""
    k, n = codes.shape
    qweight = np.zeros((k // 8, n), np.uint32)
    for kk in range(k):
        qweight[kk // 8] |= codes[kk].astype(np.uint32) << np.uint32(4 * (kk % 8))
    stored = ((zeros - zero_offset) & 0xF).astype(np.uint32)      # zero 0 - 1 wraps to 15, as AutoGPTQ's did
    qzeros = np.zeros((zeros.shape[0], n // 8), np.uint32)
    for nn in range(n):
        qzeros[:, nn // 8] |= stored[:, nn] << np.uint32(4 * (nn % 8))
    return qweight.view(np.int32), qzeros.view(np.int32)


def pack_awq(codes: np.ndarray) -> np.ndarray:
    """codes/zeros (R, N) 0..15 → int32 (R, N/8) in AWQ GEMM order."""
    r, n = codes.shape
    out = np.zeros((r, n // 8), np.uint32)
    for c in range(n // 8):
        for i in range(8):
            out[:, c] |= codes[:, 8 * c + AWQ_ORDER[i]].astype(np.uint32) << np.uint32(4 * i)
    return out.view(np.int32)


def dequant(scales, zeros, codes, g_idx) -> np.ndarray:
    """The format's meaning, w[n, k] = s[g_idx[k], n] * (q[k, n] - zero[g_idx[k], n]) → float32 (N, K)."""
    return (scales[g_idx].astype(np.float32) * (codes - zeros[g_idx]).astype(np.float32)).T.copy()


def _is_linear(name: str) -> bool:
    parts = name.split(".")
    return parts[-1] == "weight" and parts[-2] in LINEARS


def make_quantized(src: Path, dst: Path, method: str, *, g: int = 128, sym: bool = True, desc_act: bool = False,
                   checkpoint_format: str | None = None, zero_bias: bool = False, seed: int = 0) -> dict:
    """Quantize the synthetic HF checkpoint at `src` into a GPTQ or AWQ directory at `dst`, tensor names as in
    Qwen's official repos. Non-linear tensors become f16 (as those repos ship). Returns {linear name: float32 (N, K)
    dequantized weight} — the values the checkpoint means."""
    dst.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    w_all = load_source_f32(src)
    tensors, meaning = {}, {}
    for name, w in w_all.items():
        if not _is_linear(name):
            tensors[name] = w.astype(np.float16)
            continue
        prefix = name[:-len(".weight")]
        n, k = w.shape
        if method == "gptq":
            g_idx = np.arange(k) // g
            if desc_act:
                g_idx = g_idx[rng.permutation(k)]                  # act-order: groups of permuted members
            scales, zeros, codes = rtn_params(w, g, sym, g_idx)
            off = 0 if checkpoint_format == "gptq_v2" else 1
            qweight, qzeros = pack_gptq(codes, zeros, off)
            zeros = ((zeros - off) & 0xF) + off       # what GPTQ kernels read back (v1 cannot store zero 0)
            tensors.update({prefix + ".qweight": qweight, prefix + ".qzeros": qzeros, prefix + ".scales": scales,
                            prefix + ".g_idx": g_idx.astype(np.int32)})
        else:
            g_idx = np.arange(k) // g
            scales, zeros, codes = rtn_params(w, g, False, g_idx)
            tensors.update({prefix + ".qweight": pack_awq(codes), prefix + ".qzeros": pack_awq(zeros),
                            prefix + ".scales": scales})
        if zero_bias and prefix + ".bias" not in w_all:
            tensors[prefix + ".bias"] = np.zeros(n, np.float16)
        meaning[name] = dequant(scales, zeros, codes, g_idx)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    if method == "gptq":
        qc = dict(QWEN_GPTQ_CONFIG, group_size=g, sym=sym, desc_act=desc_act)
        if checkpoint_format:
            qc["checkpoint_format"] = checkpoint_format
    else:
        qc = dict(QWEN_AWQ_CONFIG, group_size=g)
    cfg["quantization_config"] = qc
    cfg["torch_dtype"] = "float16"
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (src / f).exists():
            (dst / f).write_bytes((src / f).read_bytes())
    return meaning
