#!/usr/bin/env python3
"""Write a random Qwen2.5-0.5B-shaped Hugging Face checkpoint directory (config.json + model.safetensors + the real
Qwen2.5 tokenizer) for the CPU speed comparison against llama.cpp (bench/cpu_vs_llamacpp.sh).

    python3 bench/make_cpu_bench_checkpoint.py OUT_DIR [--seed 0]

The weights are random (tests/synth.py's random_tensor: normals scaled like a trained model's, bf16), so the
checkpoint is good for SPEED only: both runtimes then convert the same tensors (ours to INT4 g128 RTN, llama.cpp's
to GGUF Q4_0) and do exactly the work a real Qwen2.5-0.5B would ask of them. Shapes: nanoqwen_format.shapes
QWEN25_SHAPES["0.5B"] (24 layers, hidden 896, 4864 intermediate, 14/2 heads, tied embeddings, 151936 rows).
The tokenizer is the real Qwen2/Qwen2.5 byte-level BPE (bench/assets/qwen2-tokenizer, built the way
bench/make_7b_file.py builds it), so llama.cpp's converter recognises its pre-tokenizer as "qwen2".
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from nanoqwen_format.shapes import QWEN25_SHAPES  # noqa: E402
from make_7b_file import (GENERATION_CONFIG, QWEN25_CHAT_TEMPLATE, TOKENIZER_CONFIG,  # noqa: E402
                          build_qwen2_tokenizer_json, QWEN2_BASE_VOCAB)
from synth import make_checkpoint  # noqa: E402

ENDOFTEXT_ID = QWEN2_BASE_VOCAB          # <|endoftext|>
IM_END_ID = QWEN2_BASE_VOCAB + 2         # <|im_end|>


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="output directory (created; must not exist)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if os.path.exists(a.out):
        print(f"error: {a.out} exists", file=sys.stderr)
        return 2
    s = QWEN25_SHAPES["0.5B"]
    make_checkpoint(a.out, hidden=s.hidden, intermediate=s.intermediate, n_layers=s.n_layers, n_heads=s.n_heads,
                    n_kv_heads=s.n_kv_heads, vocab=s.vocab, tied=s.tied, qkv_bias=True, dtype="bf16",
                    seed=a.seed, tokenizer=False, max_positions=32768)
    cfg_p = os.path.join(a.out, "config.json")
    cfg = json.load(open(cfg_p))
    cfg["bos_token_id"], cfg["eos_token_id"] = ENDOFTEXT_ID, IM_END_ID
    with open(cfg_p, "w") as fh:
        json.dump(cfg, fh, indent=2)
    with open(os.path.join(a.out, "tokenizer.json"), "w") as fh:
        fh.write(build_qwen2_tokenizer_json())
    with open(os.path.join(a.out, "tokenizer_config.json"), "w") as fh:
        json.dump(dict(TOKENIZER_CONFIG, chat_template=QWEN25_CHAT_TEMPLATE), fh, indent=2)
    with open(os.path.join(a.out, "generation_config.json"), "w") as fh:
        json.dump(GENERATION_CONFIG, fh, indent=2)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
