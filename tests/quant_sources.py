"""Independent packers for already-quantized checkpoints (tests only), written from the documented layouts:

* GPTQ (AutoGPTQ QuantLinear / GPTQModel): qweight int32 (K/8, N), 8 consecutive k per word, k = 8r + j at bits
  4j; qzeros int32 (G, N/8), zero of n = 8c + j at bits 4j, stored as zero - 1 (checkpoint_format "gptq") or zero
  ("gptq_v2"); scales f16 (G, N); g_idx int32 (K,). w = s * (q - zero).
* AWQ GEMM (AutoAWQ WQLinear_GEMM): qweight int32 (K, N/8), word c of row k holds n = 8c + ORDER[i] at bits 4i with
  ORDER = (0, 2, 4, 6, 1, 3, 5, 7); qzeros int32 (G, N/8) packed the same way; scales f16 (G, N). w = s * (q - z).

Why not a library packer in the tests: auto-gptq (0.7.1, 2024) ships CUDA wheels with their own torch-era pins,
autoawq (0.2.9) is archived and needs its CUDA kernels package, gptqmodel targets GPU builds: none is a reasonable
test dependency here. So these are plain per-element loops, deliberately unlike the vectorized unpackers in
nanoqwen_quant.sources. The GPTQ reading was cross-checked once against AutoGPTQ 0.7.1's own CPU packing code
(bench/gptq_autogptq_crosscheck.py).
The values are quantized by round-to-nearest with GPTQ's/AWQ's own scale and zero rules (the packing, not the
Hessian-based weight update, is what the importer must read).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from synth import load_source_f32

# A converted file vs transformers (fp32) holding bit-identical weights: only the summation order differs, as in
# test_cpu_vs_hf (observed ~1e-6 there); 2e-4 is that file's tolerance and its reasoning.
LOGIT_ATOL = 2e-4

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


# ------------------------------------------------------------------------------------------------ GGUF
GGUF_LAYER = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
              "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
              "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
              "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
              "self_attn.o_proj.weight": "attn_output.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
              "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"}
GGUF_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
               "lm_head.weight": "output.weight"}
# K-quant block byte offsets of their f16 super-block scales (ggml's block_q4_K / q5_K: d, dmin first; q6_K: d last)
K_QUANT_F16_FIELDS = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def gguf_name(hf: str) -> str:
    if hf in GGUF_GLOBAL:
        return GGUF_GLOBAL[hf]
    parts = hf.split(".")
    return f"blk.{parts[2]}." + GGUF_LAYER[".".join(parts[3:])]


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf's permute for llama q/k rows: (n_head, 2, d/2) → (n_head, d/2, 2)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def random_k_quant_blocks(rows: int, cols: int, qtype_name: str, rng) -> np.ndarray:
    """gguf has no K-quant quantizer: random block bytes with sane f16 super-block scales (rows, cols/256*size)."""
    import gguf
    qt = getattr(gguf.GGMLQuantizationType, qtype_name)
    block, size = gguf.GGML_QUANT_SIZES[qt]
    raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    for off in K_QUANT_F16_FIELDS[qtype_name]:
        d = (rng.uniform(1e-4, 4e-4, size=(rows, cols // block))).astype(np.float16)
        raw[:, :, off:off + 2] = d.view(np.uint8).reshape(rows, cols // block, 2)
    return raw.reshape(rows, cols // block * size)


def write_gguf(src: Path, out: Path, *, linear_type: str = "F32", embed_type: str = "F16", arch: str = "qwen2",
               tokenizer: bool = True, seed: int = 0, spm_model: bytes | None = None, meta=None) -> dict:
    """The synthetic HF checkpoint at `src` → a GGUF file like llama.cpp's convert_hf_to_gguf writes (llama q/k
    rows permuted; 1-D tensors F32). Linears stored as `linear_type` (quantized by gguf.quants where the package
    can; K-quants get random blocks, then their meaning is the package's dequantization). spm_model: a
    SentencePiece model (serialized proto) written as a "llama" vocabulary instead of the checkpoint's tokenizer,
    as convert_hf_to_gguf's _create_vocab_sentencepiece does. meta(writer): adds more metadata keys. Returns
    {hf name: float32 values the file means}."""
    import gguf
    T = gguf.GGMLQuantizationType
    cfg = json.loads((src / "config.json").read_text())
    w_all = load_source_f32(src)
    rng = np.random.default_rng(seed)
    wr = gguf.GGUFWriter(str(out), arch)
    wr.add_block_count(cfg["num_hidden_layers"])
    wr.add_context_length(cfg["max_position_embeddings"])
    wr.add_embedding_length(cfg["hidden_size"])
    wr.add_feed_forward_length(cfg["intermediate_size"])
    wr.add_head_count(cfg["num_attention_heads"])
    wr.add_head_count_kv(cfg["num_key_value_heads"])
    wr.add_rope_freq_base(cfg["rope_theta"])
    wr.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    if spm_model is not None:
        import sentencepiece
        sp = sentencepiece.SentencePieceProcessor(model_proto=spm_model)
        T_ = gguf.TokenType
        tokens, scores, types = [], [], []
        for i in range(sp.get_piece_size()):
            tokens.append(sp.id_to_piece(i))
            scores.append(sp.get_score(i))
            types.append(T_.UNKNOWN if sp.is_unknown(i) else T_.CONTROL if sp.is_control(i) else
                         T_.UNUSED if sp.is_unused(i) else T_.BYTE if sp.is_byte(i) else
                         T_.USER_DEFINED if sp.id_to_piece(i).startswith("<|") else T_.NORMAL)
        wr.add_tokenizer_model("llama")
        wr.add_token_list(tokens)
        wr.add_token_scores(scores)
        wr.add_token_types(types)
        wr.add_bos_token_id(sp.bos_id())
        wr.add_eos_token_id(sp.eos_id())
        wr.add_unk_token_id(sp.unk_id())
    elif tokenizer:
        tj = json.loads((src / "tokenizer.json").read_text())
        tcfg = json.loads((src / "tokenizer_config.json").read_text())
        added = {a["id"]: a for a in tj["added_tokens"]}
        inv = {i: t for t, i in tj["model"]["vocab"].items()}
        n_rows = cfg["vocab_size"]
        tokens, types = [], []
        for i in range(n_rows):                 # llama.cpp pads to vocab_size with [PAD{i}] UNUSED tokens
            if i in added:
                tokens.append(added[i]["content"])
                types.append(gguf.TokenType.CONTROL if added[i]["special"] else gguf.TokenType.USER_DEFINED)
            elif i in inv:
                tokens.append(inv[i])
                types.append(gguf.TokenType.NORMAL)
            else:
                tokens.append(f"[PAD{i}]")
                types.append(gguf.TokenType.UNUSED)
        wr.add_tokenizer_model("gpt2")
        wr.add_tokenizer_pre("qwen2")
        wr.add_token_list(tokens)
        wr.add_token_types(types)
        wr.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in tj["model"]["merges"]])
        wr.add_bos_token_id(cfg["bos_token_id"])
        wr.add_eos_token_id(cfg["eos_token_id"])
        wr.add_pad_token_id(cfg["bos_token_id"])
        wr.add_chat_template(tcfg["chat_template"])
    meaning = {}
    for name, w in w_all.items():
        stored = w
        if arch == "llama" and name.endswith("q_proj.weight"):
            stored = permute_qk(w, cfg["num_attention_heads"])
        elif arch == "llama" and name.endswith("k_proj.weight"):
            stored = permute_qk(w, cfg["num_key_value_heads"])
        if w.ndim == 1:
            qt = T.F32
        elif name in GGUF_GLOBAL:
            qt = getattr(T, embed_type)
        else:
            qt = getattr(T, linear_type)
        if qt == T.F32:
            data = stored.astype(np.float32)
        elif qt == T.F16:
            data = stored.astype(np.float16)
        elif qt.name in K_QUANT_F16_FIELDS:
            data = random_k_quant_blocks(*stored.shape, qt.name, rng)
        else:
            data = gguf.quants.quantize(stored, qt)
        wr.add_tensor(gguf_name(name), data, raw_dtype=qt if qt not in (T.F32, T.F16) else None)
        back = gguf.quants.dequantize(data, qt).astype(np.float32).reshape(w.shape)
        heads = {"q_proj.weight": cfg["num_attention_heads"], "k_proj.weight": cfg["num_key_value_heads"]}
        h = heads.get(".".join(name.split(".")[-2:])) if arch == "llama" else None
        if h:                                   # back to HF row order: invert permute_qk row by row
            rows = permute_qk(np.arange(w.shape[0]), h)          # stored row r holds HF row rows[r]
            back = back[np.argsort(rows)]
        meaning[name] = back
    if meta is not None:
        meta(wr)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return meaning


def assert_logits_match_transformers(src, out, weights: dict[str, np.ndarray], *, seed: int, n_tokens: int) -> None:
    """CPU-backend logits of the converted file `out` on `n_tokens` random ids == transformers' (fp32) logits of the
    config at `src` holding `weights` (name -> float32 array: what the file's tensors mean), within LOGIT_ATOL."""
    import pytest
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from nanoqwen_rt.backends.cpu import CPUBackend
    model = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    missing, unexpected = model.load_state_dict({n: torch.from_numpy(w) for n, w in weights.items()}, strict=False)
    assert not missing and not unexpected
    ids = np.random.default_rng(seed).integers(0, 320, size=n_tokens).astype(np.int32)
    with torch.no_grad():
        ref = model(torch.tensor([ids.tolist()])).logits[0].numpy()
    be = CPUBackend(out)
    be.poison()
    try:
        ours = be.logits_all(ids)
    finally:
        be.close()
    assert ref.std() > 0.1                                     # not vacuous
    np.testing.assert_allclose(ours, ref, rtol=0, atol=LOGIT_ATOL)
