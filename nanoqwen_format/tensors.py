"""Which tensors a config requires, and how many bytes each dtype needs (spec §Tensors, §Byte lengths)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from .config import ModelConfig
from .constants import DTYPE_ITEMSIZE, LAYOUT_INT4_ROWMAJOR_K8, LAYOUT_INT4_ROWMAJOR_K8_ASYM, LAYOUT_NONE, DType, align128


# spec §7, the tensor set: every per-layer tensor as (name suffix, shape symbols, present when), canonical order.
# Shape symbols: H hidden_size, I intermediate_size, Q n_heads*head_dim, KV n_kv_heads*head_dim, V vocab_rows.
_LAYER_TENSORS = (
    ("input_layernorm.weight", ("H",), None),
    ("self_attn.q_proj.weight", ("Q", "H"), None),
    ("self_attn.k_proj.weight", ("KV", "H"), None),
    ("self_attn.v_proj.weight", ("KV", "H"), None),
    ("self_attn.q_proj.bias", ("Q",), "qkv_bias"),
    ("self_attn.k_proj.bias", ("KV",), "qkv_bias"),
    ("self_attn.v_proj.bias", ("KV",), "qkv_bias"),
    ("self_attn.o_proj.weight", ("H", "Q"), None),
    ("post_attention_layernorm.weight", ("H",), None),
    ("mlp.gate_proj.weight", ("I", "H"), None),
    ("mlp.up_proj.weight", ("I", "H"), None),
    ("mlp.down_proj.weight", ("H", "I"), None),
)
_LAYER_PREFIX = "model.layers."


def _dims(cfg: ModelConfig) -> dict:
    return {"H": cfg.hidden_size, "I": cfg.intermediate_size, "Q": cfg.n_heads * cfg.head_dim,
            "KV": cfg.n_kv_heads * cfg.head_dim, "V": cfg.vocab_rows}


def _layer_tensors(cfg: ModelConfig) -> dict:
    """{suffix: shape} of the tensors every layer holds under this config, in canonical order."""
    d = _dims(cfg)
    return {suffix: tuple(d[s] for s in sym) for suffix, sym, when in _LAYER_TENSORS
            if when is None or (when == "qkv_bias" and cfg.qkv_bias)}


def _global_tensors(cfg: ModelConfig) -> tuple:
    """({name: shape} before the layers, {name: shape} after them)."""
    v, h = cfg.vocab_rows, cfg.hidden_size
    tail = {"model.norm.weight": (h,)}
    if not cfg.tied_embeddings:
        tail["lm_head.weight"] = (v, h)
    return {"model.embed_tokens.weight": (v, h)}, tail


def iter_expected_tensors(cfg: ModelConfig):
    """(name, shape) of every tensor a file of this config holds, lazily, in canonical order."""
    head, tail = _global_tensors(cfg)
    yield from head.items()
    per_layer = _layer_tensors(cfg)
    for i in range(cfg.n_layers):
        for suffix, shape in per_layer.items():
            yield f"{_LAYER_PREFIX}{i}.{suffix}", shape
    yield from tail.items()


def expected_tensors(cfg: ModelConfig) -> dict:
    """{HF tensor name: shape tuple} that a file of this config must hold exactly, in canonical order."""
    return dict(iter_expected_tensors(cfg))


def expected_tensor_count(cfg: ModelConfig) -> int:
    """len(expected_tensors(cfg)), in constant time."""
    head, tail = _global_tensors(cfg)
    return len(head) + len(tail) + cfg.n_layers * len(_layer_tensors(cfg))


def expected_shape(cfg: ModelConfig, name: str):
    """The shape §7 gives `name` under this config, or None if the name is not in the set. Constant time in
    n_layers: a layer name is parsed, its index must be canonical decimal (no sign, no leading zero) < n_layers."""
    head, tail = _global_tensors(cfg)
    if name in head:
        return head[name]
    if name in tail:
        return tail[name]
    if not name.startswith(_LAYER_PREFIX):
        return None
    index, _, suffix = name[len(_LAYER_PREFIX):].partition(".")
    if not (index.isascii() and index.isdigit()) or (len(index) > 1 and index[0] == "0"):
        return None
    if len(index) > len(str(cfg.n_layers)) or int(index) >= cfg.n_layers:
        return None
    return _layer_tensors(cfg).get(suffix)


@dataclass(frozen=True)
class Int4Parts:
    """Where the parts of an int4g tensor of logical shape (N, K) lie, in bytes from its offset (spec §9.2, §9.5).
    zeros_offset and zeros_nbytes are 0 for layout 1 (no zero points)."""
    qweight_nbytes: int     # uint32 [N][K/8]  = N*K/2
    scales_offset: int      # align128(N*K/2)
    scales_nbytes: int      # f16 [N][K/g]    = N*(K/g)*2
    zeros_offset: int       # layout 2: align128(scales_offset + scales_nbytes)
    zeros_nbytes: int       # layout 2: uint8 [N][K/g] = N*(K/g)
    nbytes: int             # the whole tensor


def int4_parts(n: int, k: int, group_size: int, layout_id: int = LAYOUT_INT4_ROWMAJOR_K8) -> Int4Parts:
    """The byte map of an int4g tensor of layout 1 or 2 (arbitrary-precision ints; callers check the 2^64 bound)."""
    q_nb = n * k // 2
    s_off = align128(q_nb)
    s_nb = n * (k // group_size) * 2
    if layout_id == LAYOUT_INT4_ROWMAJOR_K8_ASYM:
        z_off = align128(s_off + s_nb)
        z_nb = n * (k // group_size)
        return Int4Parts(q_nb, s_off, s_nb, z_off, z_nb, z_off + z_nb)
    if layout_id != LAYOUT_INT4_ROWMAJOR_K8:
        raise ValueError(f"int4 layout_id: expected {LAYOUT_INT4_ROWMAJOR_K8} or {LAYOUT_INT4_ROWMAJOR_K8_ASYM}, "
                         f"found {layout_id}")
    return Int4Parts(q_nb, s_off, s_nb, 0, 0, s_off + s_nb)


def int4_nbytes(n: int, k: int, group_size: int, layout_id: int = LAYOUT_INT4_ROWMAJOR_K8) -> int:
    """Bytes of an int4g tensor of logical shape (N, K). Layout 1: qweight uint32[N][K/8] (= N*K/2 bytes), zero
    padding to a multiple of 128, then scales float16[N][K/g]. Layout 2: the same, then zero padding to a multiple
    of 128, then zero points uint8[N][K/g]."""
    return int4_parts(n, k, group_size, layout_id).nbytes


def tensor_nbytes(dtype: int, shape: Tuple[int, ...], group_size: int = 0,
                  layout_id: int = LAYOUT_INT4_ROWMAJOR_K8) -> int:
    """Exact byte length of a tensor (arbitrary-precision ints; callers check the 2^64 bound). layout_id matters
    only for INT4G."""
    if dtype == DType.INT4G:
        n, k = shape
        return int4_nbytes(n, k, group_size, layout_id)
    count = 1
    for d in shape:
        count *= d
    return count * DTYPE_ITEMSIZE[DType(dtype)]


@dataclass(frozen=True)
class TensorSpec:
    """What the writer is told up front. For INT4G, layout_id 0 means LAYOUT_INT4_ROWMAJOR_K8 (symmetric);
    LAYOUT_INT4_ROWMAJOR_K8_ASYM asks for zero points."""
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
