"""Which tensors a config requires, and how many bytes each dtype needs (spec §Tensors, §Byte lengths)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from .config import ModelConfig
from .constants import DTYPE_ITEMSIZE, LAYOUT_INT4_ROWMAJOR_K8, LAYOUT_NONE, DType, align128


def expected_tensors(cfg: ModelConfig) -> dict:
    """{HF tensor name: shape tuple} that a file of this config must hold exactly, in canonical order."""
    h, hd, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q_out, kv_out = cfg.n_heads * hd, cfg.n_kv_heads * hd
    out = {"model.embed_tokens.weight": (cfg.vocab_rows, h)}
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = (h,)
        out[p + "self_attn.q_proj.weight"] = (q_out, h)
        out[p + "self_attn.k_proj.weight"] = (kv_out, h)
        out[p + "self_attn.v_proj.weight"] = (kv_out, h)
        if cfg.qkv_bias:
            out[p + "self_attn.q_proj.bias"] = (q_out,)
            out[p + "self_attn.k_proj.bias"] = (kv_out,)
            out[p + "self_attn.v_proj.bias"] = (kv_out,)
        out[p + "self_attn.o_proj.weight"] = (h, q_out)
        out[p + "post_attention_layernorm.weight"] = (h,)
        out[p + "mlp.gate_proj.weight"] = (inter, h)
        out[p + "mlp.up_proj.weight"] = (inter, h)
        out[p + "mlp.down_proj.weight"] = (h, inter)
    out["model.norm.weight"] = (h,)
    if not cfg.tied_embeddings:
        out["lm_head.weight"] = (cfg.vocab_rows, h)
    return out


def int4_nbytes(n: int, k: int, group_size: int) -> int:
    """Bytes of an int4g layout-1 tensor of logical shape (N, K): qweight uint32[N][K/8] (= N*K/2 bytes), zero
    padding to a multiple of 128, then scales float16[N][K/g]."""
    return align128(n * k // 2) + n * (k // group_size) * 2


def tensor_nbytes(dtype: int, shape: Tuple[int, ...], group_size: int = 0) -> int:
    """Exact byte length of a tensor (arbitrary-precision ints; callers check the 2^64 bound)."""
    if dtype == DType.INT4G:
        n, k = shape
        return int4_nbytes(n, k, group_size)
    count = 1
    for d in shape:
        count *= d
    return count * DTYPE_ITEMSIZE[DType(dtype)]


@dataclass(frozen=True)
class TensorSpec:
    """What the writer is told up front. For INT4G, layout_id 0 means LAYOUT_INT4_ROWMAJOR_K8 (the only one)."""
    name: str
    dtype: DType
    shape: Tuple[int, ...]
    group_size: int = 0
    layout_id: int = 0

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if self.dtype == DType.INT4G and self.layout_id == LAYOUT_NONE:
            object.__setattr__(self, "layout_id", LAYOUT_INT4_ROWMAJOR_K8)


@dataclass(frozen=True)
class TensorInfo:
    """One directory entry as read. offset/nbytes are absolute file positions/lengths."""
    name: str
    dtype: DType
    shape: Tuple[int, ...]
    offset: int
    nbytes: int
    crc32c: int
    group_size: int
    layout_id: int
