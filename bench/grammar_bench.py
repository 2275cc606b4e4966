#!/usr/bin/env python3
"""Per-token cost of the grammar engines on a model's vocabulary: llguidance (the one nanoqwen uses) and, when
installed, outlines-core (`pip install outlines-core`), for docs/api-features.md.

    python3 bench/grammar_bench.py FILE.nanoqwen

A 3-property JSON schema and a fixed 30-odd-token answer: tokenizer / vocabulary build, per-schema compile (index),
the allowed-token computation per answer token (median, max), and nanoqwen's numpy mask step on the logits.
"""
from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age", "tags"], "additionalProperties": False}
ANSWER = {"name": "Ada Lovelace", "age": 36, "tags": ["math", "poetry", "engines"]}


def main() -> int:
    import numpy as np
    from tokenizers import Tokenizer
    from nanoqwen_format import BlobKind, open_file
    from nanoqwen_rt.grammar import JSON_LAYOUT
    from nanoqwen_rt.logits import apply_token_bitmask
    from nanoqwen_rt.tokenizer import _gpt2_byte_decoder

    f = open_file(sys.argv[1])
    tj = f.blob_text(BlobKind.TOKENIZER_JSON)
    V = int(f.config.vocab_rows)
    eos = int(f.config.eos_token_id)
    tok = Tokenizer.from_str(tj)
    import llguidance
    t = time.perf_counter()
    llt = llguidance.LLTokenizer(tj, n_vocab=V, eos_token=[eos])
    t_tok = time.perf_counter() - t
    g = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA, defaults=JSON_LAYOUT)
    t = time.perf_counter()
    m = llguidance.LLMatcher(llt, g, log_level=0)
    t_compile = time.perf_counter() - t
    mask = np.zeros((V + 31) // 32, dtype=np.int32)
    ids = tok.encode(json.dumps(ANSWER)).ids             # json.dumps' separators: JSON_LAYOUT's
    times = []
    for i in ids:
        t = time.perf_counter()
        m.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
        times.append(time.perf_counter() - t)
        if not m.consume_token(i):
            raise SystemExit(f"llguidance refused token {i}: {m.get_error()}")
    print(f"answer: {len(ids)} tokens, vocab_rows {V}")
    print(f"llguidance {llguidance.__version__}: tokenizer {t_tok:.2f} s, schema compile {t_compile * 1e3:.2f} ms, "
          f"mask per token median {np.median(times) * 1e3:.3f} ms, max {np.max(times) * 1e3:.3f} ms")
    logits = np.random.default_rng(0).standard_normal(V).astype(np.float32)
    ts = []
    for _ in range(50):
        x = logits.copy()
        t = time.perf_counter()
        apply_token_bitmask(x, mask)
        ts.append(time.perf_counter() - t)
    print(f"apply_token_bitmask (numpy): median {np.median(ts) * 1e3:.3f} ms")
    try:
        from outlines_core import Guide, Index, Vocabulary
        from outlines_core.json_schema import build_regex_from_schema
    except ImportError:
        print("outlines-core: not installed")
        return 0
    t = time.perf_counter()
    bd = _gpt2_byte_decoder()
    pieces: dict[bytes, list[int]] = {}
    for s, i in tok.get_vocab(with_added_tokens=False).items():
        pieces.setdefault(bytes(bd[c] for c in s), []).append(i)
    voc = Vocabulary(eos, pieces)
    t_voc = time.perf_counter() - t
    rx = build_regex_from_schema(json.dumps(SCHEMA), whitespace_pattern="")
    t = time.perf_counter()
    guide = Guide(Index(rx, voc))
    t_idx = time.perf_counter() - t
    times = []
    for i in tok.encode(json.dumps(ANSWER, separators=(",", ":"))).ids:   # its regex: no whitespace
        t = time.perf_counter()
        guide.get_tokens()
        times.append(time.perf_counter() - t)
        guide.advance(i)
    print(f"outlines-core: vocabulary {t_voc:.2f} s, index build {t_idx:.2f} s, allowed tokens per token median "
          f"{np.median(times) * 1e3:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
