"""GGUF files (llama.cpp, Ollama blobs): metadata → config, tensors via the `gguf` package's reader and
dequantizer, tokenizer.json and chat template rebuilt from the `tokenizer.*` metadata.

* Architectures: `general.architecture` qwen2 or llama. Tensor names map to Hugging Face's (token_embd →
  model.embed_tokens, blk.N.attn_q → model.layers.N.self_attn.q_proj, ..., output → lm_head).
* llama.cpp's converter permutes the rows of q/k projections of llama-arch models (its rotary embedding pairs
  adjacent dims; HF's pairs halves): that permutation is undone here. qwen2 GGUFs are stored unpermuted.
* Every tensor is dequantized by the `gguf` package (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K, ...)
  to float32; the converter then quantizes linears with our quantizer (requantization, error reported) and keeps
  the rest f16. No GGUF type is layout 1 in disguise: Q4_0 is w = d (q - 8) on 32-blocks, but llama.cpp picks d
  negative whenever the block's largest-magnitude value is positive, which layout 1's scales (>= 0) cannot hold.
* Tokenizer: `tokenizer.ggml.model == "gpt2"` (byte-level BPE: Qwen2, Llama 3, GPT-2 style) with a known
  `tokenizer.ggml.pre` becomes a tokenizers BPE tokenizer.json (control tokens → special added tokens,
  user-defined → added tokens, unused [PAD] rows dropped). `"llama"` (SentencePiece BPE: Llama 2, TinyLlama,
  llama2.c) becomes the tokenizers form of a SentencePiece BPE model, the pipeline of Llama 2's tokenizer.json:
  merges recovered from the piece scores (`tokenizer.ggml.scores`: SentencePiece merges the best-scored pair
  first), byte fallback to the `<0xXX>` pieces, "▁" for spaces with one prepended to each stretch of text
  between special tokens, as llama.cpp tokenizes (`tokenizer.ggml.add_space_prefix`, default true); a BOS is
  added unless `tokenizer.ggml.add_bos_token` says false (llama.cpp's default for these vocabularies). Checked
  against SentencePiece itself (tests/test_import_gguf.py). Other tokenizers (unknown pre, other models) are not
  rebuilt: the file then carries no tokenizer and the converter says so.
"""
from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import numpy as np

from nanoqwen_format import expected_tensors

from ..hf import ConvertError, Source, SourceTensor, model_config_from_hf
from . import ImportedCheckpoint, ImportedTensor

GGUF_ARCHS = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}
LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight", "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight", "ffn_down.weight": "mlp.down_proj.weight",
}
GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                "output.weight": "lm_head.weight"}
# pre-tokenizer split regexes by tokenizer.ggml.pre (those of the HF tokenizer.json each GGUF was made from)
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
               r"|\s+(?!\S)|\s+")
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_REGEX = {"qwen2": QWEN2_REGEX, "llama-bpe": LLAMA3_REGEX, "llama3": LLAMA3_REGEX}
PRE_NFC = {"qwen2"}                               # Qwen2's tokenizer.json normalizes to NFC
PRE_GPT2 = {"gpt-2", "gpt2", "default"}           # plain ByteLevel pre-tokenizer with its own regex
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6
SPM_SPACE = "\u2581"                              # SentencePiece's "▁", the space inside pieces
ROPE_TYPES = {"none": None, "linear": "linear", "yarn": "yarn"}
_BLK = re.compile(r"^blk\.(\d+)\.(.+)$")


def _field(reader, key: str, default=None):
    f = reader.get_field(key)
    if f is None:
        return default
    try:
        return f.contents()
    except Exception as e:  # malformed field: one line
        raise ConvertError(f"GGUF metadata {key}: unreadable ({e})") from None


def hf_name(gguf_name: str) -> str | None:
    if gguf_name in GLOBAL_NAMES:
        return GLOBAL_NAMES[gguf_name]
    m = _BLK.match(gguf_name)
    if m and m.group(2) in LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{LAYER_NAMES[m.group(2)]}"
    return None


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's convert permute(w, n_head): rows (n_head, 2, d/2) were stored as (n_head, d/2, 2)."""
    rest = w.shape[1:]
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape)


def hf_config_from_gguf(reader, arch: str, vocab_rows: int, tied: bool, has_qkv_bias: bool) -> dict:
    def need(key):
        v = _field(reader, f"{arch}.{key}")
        if v is None:
            raise ConvertError(f"GGUF metadata {arch}.{key} is missing")
        return v
    n_heads = need("attention.head_count")
    hidden = need("embedding_length")
    cfg = {"architectures": [GGUF_ARCHS[arch]], "model_type": arch, "hidden_size": hidden,
           "intermediate_size": need("feed_forward_length"), "num_hidden_layers": need("block_count"),
           "num_attention_heads": n_heads,
           "num_key_value_heads": _field(reader, f"{arch}.attention.head_count_kv", n_heads),
           "vocab_size": vocab_rows, "max_position_embeddings": need("context_length"),
           "rope_theta": float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
           "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")), "tie_word_embeddings": tied,
           "hidden_act": "silu"}
    for k in ("num_attention_heads", "num_key_value_heads", "intermediate_size", "num_hidden_layers"):
        if isinstance(cfg[k], list):
            raise ConvertError(f"GGUF metadata: per-layer {k} is not supported")
    key_len = _field(reader, f"{arch}.attention.key_length")
    if key_len is not None and arch == "llama":
        cfg["head_dim"] = key_len
    if arch == "llama":
        cfg["attention_bias"] = has_qkv_bias
    # llama.cpp's rule (llama-model.cpp): the factor is rope.scaling.factor, else the older rope.scale_linear
    # (written by its first convert.py); without a type key the scaling is linear, and a factor of 0 or 1 is none
    factor = _field(reader, f"{arch}.rope.scaling.factor")
    if factor is None:
        factor = _field(reader, f"{arch}.rope.scale_linear")
    scales = factor is not None and float(factor) not in (0.0, 1.0)
    kind = _field(reader, f"{arch}.rope.scaling.type", "linear" if scales else "none")
    if kind not in ROPE_TYPES:
        raise ConvertError(f"GGUF metadata {arch}.rope.scaling.type {kind!r} is not supported "
                           f"(supported: {', '.join(ROPE_TYPES)})")
    if kind == "none" and scales:   # llama.cpp would still scale the frequencies by 1 / factor
        raise ConvertError(f"GGUF metadata: rope scaling type 'none' with a factor of {float(factor)!r}")
    if ROPE_TYPES[kind]:
        if factor is None:
            raise ConvertError(f"GGUF metadata {arch}.rope.scaling.factor is missing")
        rs = {"rope_type": ROPE_TYPES[kind], "factor": float(factor)}
        if kind == "yarn":
            rs["original_max_position_embeddings"] = need("rope.scaling.original_context_length")
        cfg["rope_scaling"] = rs
    for key, hf in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                    ("padding_token_id", "pad_token_id")):
        v = _field(reader, f"tokenizer.ggml.{key}")
        if v is not None:
            cfg[hf] = int(v)
    return cfg


def spm_merges(tokens: list[str], scores: list[float], types: list[int]) -> list[str]:
    """BPE merges of a SentencePiece BPE vocabulary, from its piece scores: every normal piece that splits into
    two normal pieces gives the merge of those two, ranked by the merged piece's score (best first), ties by the
    halves' lengths, then their ids (transformers' `generate_merges` order)."""
    normal = {t: i for i, (t, ty) in enumerate(zip(tokens, types)) if ty == TOKEN_NORMAL and t}
    found = []
    for piece, i in normal.items():
        if " " in piece:                   # never in a SentencePiece vocabulary (spaces are ▁); the merge syntax
            continue
        local = [(piece[:k], piece[k:]) for k in range(1, len(piece)) if piece[:k] in normal and piece[k:] in normal]
        local.sort(key=lambda lr: (normal[lr[0]], normal[lr[1]]))
        found.extend((float(scores[i]), len(lr[0]), len(lr[1]), lr) for lr in local)
    found.sort(key=lambda x: x[:3], reverse=True)       # stable: equal keys keep the id order above
    return [f"{lr[0]} {lr[1]}" for *_, lr in found]


def spm_tokenizer_json(tokens: list[str], scores: list[float], types: list[int], unk_id: int | None,
                       add_space_prefix: bool) -> dict:
    """tokenizer.json of a SentencePiece BPE vocabulary: the pipeline of Llama 2's own tokenizer.json (BPE with
    byte fallback, ▁ normalizer, ByteFallback/Fuse decoder) with merges from the scores."""
    vocab, added = {}, []
    for i, (tok, ty) in enumerate(zip(tokens, types)):
        vocab.setdefault(tok, i)
        if ty in (TOKEN_CONTROL, TOKEN_UNKNOWN, TOKEN_USER_DEFINED):
            added.append({"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": ty != TOKEN_USER_DEFINED})
    decoder = [{"type": "Replace", "pattern": {"String": SPM_SPACE}, "content": " "}, {"type": "ByteFallback"},
               {"type": "Fuse"}]
    if add_space_prefix:
        decoder.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    unk = tokens[unk_id] if unk_id is not None and 0 <= unk_id < len(tokens) else None
    # spaces → ▁, and one ▁ before the text (before every stretch of text between special tokens, as llama.cpp
    # does); a normalizer, not Metaspace, which skips the prefix when the text already starts with a space
    space = [{"type": "Prepend", "prepend": SPM_SPACE}] if add_space_prefix else []
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": {"type": "Sequence", "normalizers": space + [
                {"type": "Replace", "pattern": {"String": " "}, "content": SPM_SPACE}]},
            "pre_tokenizer": None, "post_processor": None, "decoder": {"type": "Sequence", "decoders": decoder},
            "model": {"type": "BPE", "dropout": None, "unk_token": unk, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                      "vocab": vocab, "merges": spm_merges(tokens, scores, types)}}


def _loads(text: str) -> tuple[str | None, str]:
    try:
        from tokenizers import Tokenizer
        Tokenizer.from_str(text)
    except Exception as e:
        return None, f"the rebuilt tokenizer does not load ({e})".splitlines()[0]
    return text, ""


def tokenizer_json_from_gguf(reader) -> tuple[str | None, str]:
    """(tokenizer.json text, "") or (None, why not)."""
    model = _field(reader, "tokenizer.ggml.model")
    if model is None:
        return None, "no tokenizer.ggml.model metadata"
    if model == "llama":
        tokens = _field(reader, "tokenizer.ggml.tokens")
        scores = _field(reader, "tokenizer.ggml.scores")
        types = _field(reader, "tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens or [])
        if not tokens or scores is None or not (len(tokens) == len(scores) == len(types)):
            return None, "tokenizer.ggml.tokens / scores / token_type missing or of different lengths"
        unk = _field(reader, "tokenizer.ggml.unknown_token_id")
        tj = spm_tokenizer_json(list(tokens), list(scores), list(types), None if unk is None else int(unk),
                                bool(_field(reader, "tokenizer.ggml.add_space_prefix", True)))
        return _loads(json.dumps(tj, ensure_ascii=False))
    if model != "gpt2":
        return None, f"tokenizer.ggml.model {model!r} (rebuilt: 'gpt2' byte-level BPE, 'llama' SentencePiece BPE)"
    pre = _field(reader, "tokenizer.ggml.pre", "default")
    if pre not in PRE_REGEX and pre not in PRE_GPT2:
        return None, f"tokenizer.ggml.pre {pre!r} (rebuilt: {', '.join(sorted(PRE_REGEX) + sorted(PRE_GPT2))})"
    tokens = _field(reader, "tokenizer.ggml.tokens")
    merges = _field(reader, "tokenizer.ggml.merges") or []
    types = _field(reader, "tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens or [])
    if not tokens or len(types) != len(tokens):
        return None, "tokenizer.ggml.tokens missing or not matching tokenizer.ggml.token_type"
    vocab, added = {}, []
    for i, (tok, ty) in enumerate(zip(tokens, types)):
        if ty == TOKEN_UNUSED:
            continue                                    # llama.cpp's [PAD{i}] filler rows
        if ty in (TOKEN_CONTROL, TOKEN_USER_DEFINED):
            added.append({"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": ty == TOKEN_CONTROL})
        else:
            vocab[tok] = i
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    if pre in PRE_GPT2:
        pre_tok = dict(byte_level, use_regex=True)
    else:
        pre_tok = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": PRE_REGEX[pre]}, "behavior": "Isolated", "invert": False},
            byte_level]}
    tj = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
          "normalizer": {"type": "NFC"} if pre in PRE_NFC else None, "pre_tokenizer": pre_tok,
          "post_processor": byte_level, "decoder": byte_level,
          "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                    "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                    "vocab": vocab, "merges": list(merges)}}
    return _loads(json.dumps(tj, ensure_ascii=False))


def load_gguf(source: Source) -> ImportedCheckpoint:
    try:
        import gguf
        from gguf import GGMLQuantizationType
    except ImportError:  # pragma: no cover - a declared dependency
        raise ConvertError("reading GGUF needs the 'gguf' package (pip install gguf)") from None
    path = source.path
    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # truncated or malformed: the reader raises ValueError / IndexError / ...
        raise ConvertError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})".splitlines()[0]) from None
    arch = _field(reader, "general.architecture")
    if arch not in GGUF_ARCHS:
        raise ConvertError(f"{path}: GGUF architecture {arch!r} is not supported (supported: {', '.join(GGUF_ARCHS)})")
    by_hf: dict[str, object] = {}
    for t in reader.tensors:
        hn = hf_name(t.name)
        if hn is None:
            raise ConvertError(f"{path}: GGUF tensor {t.name!r} is not part of a {arch} model we can run "
                               f"(unsupported variant?)")
        by_hf[hn] = t
    if "model.embed_tokens.weight" not in by_hf:
        raise ConvertError(f"{path}: GGUF file has no token_embd.weight")
    vocab_rows = int(by_hf["model.embed_tokens.weight"].shape[1])      # GGUF dims are (K, N): ne0 first
    cfg = hf_config_from_gguf(reader, arch, vocab_rows, "lm_head.weight" not in by_hf,
                              "model.layers.0.self_attn.q_proj.bias" in by_hf)
    mc = model_config_from_hf(cfg)
    want = expected_tensors(mc)
    extra = sorted(set(by_hf) - set(want))
    if extra:
        raise ConvertError(f"{path}: GGUF tensor for {extra[0]!r} does not fit the {arch} config")
    tensors, imported = {}, {}
    for name, shape in want.items():
        t = by_hf.get(name)
        if t is None:
            raise ConvertError(f"{path}: GGUF file lacks the tensor for {name!r}")
        gshape = tuple(int(d) for d in reversed(t.shape.tolist()))
        if gshape != tuple(shape):
            raise ConvertError(f"{path}: GGUF tensor {t.name!r} has shape {list(gshape)}, the config implies "
                               f"{list(shape)}")
        qtype = GGMLQuantizationType(t.tensor_type)
        permute = None
        if arch == "llama" and name.endswith("self_attn.q_proj.weight"):
            permute = mc.n_heads
        elif arch == "llama" and name.endswith("self_attn.k_proj.weight"):
            permute = mc.n_kv_heads

        def rows(a, b, t=t, qtype=qtype, shape=tuple(shape)):
            """Rows [a, b) of the stored tensor (GGUF data is (N, row bytes) or (N,) for 1-D), dequantized."""
            try:
                w = gguf.quants.dequantize(t.data[a:b], qtype)
            except NotImplementedError:
                raise ConvertError(f"{path}: GGUF tensor {t.name!r} has type {qtype.name}, which the gguf package "
                                   f"cannot dequantize") from None
            except (ValueError, IndexError) as e:   # truncated data in the memory map
                raise ConvertError(f"{path}: GGUF tensor {t.name!r}: cannot read ({e})".splitlines()[0]) from None
            return np.ascontiguousarray(w, dtype=np.float32).reshape((b - a,) + shape[1:])

        def dequant(rows=rows, shape=tuple(shape), permute=permute):
            w = rows(0, shape[0])
            return np.ascontiguousarray(unpermute_qk(w, permute)) if permute else w

        imported[name] = ImportedTensor(name, tuple(shape), f"gguf {qtype.name}", dequant,
                                        reason=f"GGUF {qtype.name} is not layout 1",
                                        rows=None if permute else rows)
        tensors[name] = SourceTensor(name, "F32", tuple(shape), path, int(t.data_offset), int(t.n_bytes))
    # metadata files the converter embeds, built from the GGUF metadata in a private temporary directory
    tmp = tempfile.TemporaryDirectory(prefix="nanoqwen-gguf-")
    d = Path(tmp.name)
    extras: dict[str, Path] = {}
    tok_text, tok_why = tokenizer_json_from_gguf(reader)
    tokens = _field(reader, "tokenizer.ggml.tokens") or []
    if tok_text is not None:
        (d / "tokenizer.json").write_text(tok_text, encoding="utf-8")
        extras["tokenizer.json"] = d / "tokenizer.json"
    tcfg = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
    for key, field in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"), ("pad_token", "padding_token_id"),
                       ("unk_token", "unknown_token_id")):
        i = _field(reader, f"tokenizer.ggml.{field}")
        tcfg[key] = tokens[i] if i is not None and 0 <= i < len(tokens) else None
    add_bos = _field(reader, "tokenizer.ggml.add_bos_token")
    if add_bos is None and _field(reader, "tokenizer.ggml.model") == "llama":
        add_bos = True                # llama.cpp adds a BOS to a SentencePiece vocabulary that does not say
    if add_bos is not None:
        tcfg["add_bos_token"] = bool(add_bos)
    tmpl = _field(reader, "tokenizer.chat_template")
    if isinstance(tmpl, str):
        tcfg["chat_template"] = tmpl
    (d / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=1, ensure_ascii=False), encoding="utf-8")
    extras["tokenizer_config.json"] = d / "tokenizer_config.json"
    gen = {k: cfg[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in cfg}
    if gen:
        (d / "generation_config.json").write_text(json.dumps(gen, indent=1), encoding="utf-8")
        extras["generation_config.json"] = d / "generation_config.json"
    types = sorted({t.encoding.split()[1] for t in imported.values()})
    info = {"format": "gguf", "architecture": arch, "tensor_types": types,
            "file_type": _field(reader, "general.file_type"), "tokenizer": "rebuilt" if tok_text else tok_why}
    src = Source(path=d, source=source.source)
    ck = ImportedCheckpoint(source=src, hf_config=cfg, config=mc, tensors=tensors, extras=extras,
                            imported=imported, import_info=info)
    ck._keep = (tmp, reader)
    return ck
