"""Shapes of the Qwen2.5 / Qwen2.5-Coder sizes (their Hugging Face config.json files), and the runtime facts the
CUDA library shares with Python. One place: tests and benchmarks that sweep the real model shapes import them
from here, and scripts/gen_contract.py writes KV_PAGE_TOKENS into csrc/src/format_contract.h."""
from __future__ import annotations

from typing import NamedTuple


class Qwen25Shape(NamedTuple):
    hidden: int
    intermediate: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_layers: int
    vocab: int           # embedding rows (vocab_size of config.json)
    tied: bool           # tie_word_embeddings

    @property
    def qkv_rows(self) -> int:
        """Output rows of the fused q/k/v projection."""
        return (self.n_heads + 2 * self.n_kv_heads) * self.head_dim


# Qwen2.5-{0.5B..32B} and Qwen2.5-Coder of the same sizes share these numbers.
QWEN25_SHAPES: dict[str, Qwen25Shape] = {
    "0.5B": Qwen25Shape(896, 4864, 14, 2, 64, 24, 151936, True),
    "1.5B": Qwen25Shape(1536, 8960, 12, 2, 128, 28, 151936, True),
    "3B": Qwen25Shape(2048, 11008, 16, 2, 128, 36, 151936, True),
    "7B": Qwen25Shape(3584, 18944, 28, 4, 128, 28, 152064, False),
    "14B": Qwen25Shape(5120, 13824, 40, 8, 128, 48, 152064, False),
    "32B": Qwen25Shape(5120, 27648, 40, 8, 128, 64, 152064, False),
}

# Tokens per page of the CUDA library's paged f16 KV cache.
KV_PAGE_TOKENS = 16
