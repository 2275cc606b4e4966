"""ModelConfig: the 128-byte config block at FileHeader offset 48 (spec §ModelConfig)."""
from __future__ import annotations

import math
import numbers
import struct
from dataclasses import asdict, dataclass

import numpy as np

from .constants import (ARCH_NAMES, CONFIG_FLAG_QKV_BIAS, CONFIG_FLAG_TIED, CONFIG_FLAGS_KNOWN, CONFIG_SIZE,
                        MAX_N_LAYERS, ROPE_SCALING_NAMES, Arch, RopeScaling)
from .errors import ConfigMismatch, NonZeroReserved

# u32 arch, n_layers, hidden_size, intermediate_size, n_heads, n_kv_heads, head_dim, vocab_rows, max_positions,
# config_flags | f64 rope_theta @40 | u32 rope_scaling_type @48 | f32 factor @52 | u32 orig_max @56 |
# f32 rms_eps @60 | i32 bos @64, eos @68, pad @72 | reserved zero @76..128
_CONFIG_STRUCT = struct.Struct("<10I d I f I f 3i")
CONFIG_USED_SIZE = _CONFIG_STRUCT.size  # 76
assert CONFIG_USED_SIZE == 76

_ARCH_BY_NAME = {v: k for k, v in ARCH_NAMES.items()}
_ROPE_BY_NAME = {v: k for k, v in ROPE_SCALING_NAMES.items()}
_U32_MAX = 2**32 - 1
_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1


@dataclass(frozen=True)
class ModelConfig:
    """Model hyper-parameters as stored in the header. Floats stored as f32 in the file (rope_scaling_factor,
    rms_norm_eps) come back from a reader as the f32 value widened to float; use .canonical() to compare."""
    arch: str                       # "qwen2" | "llama"
    n_layers: int
    hidden_size: int
    intermediate_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_rows: int                 # embedding rows incl. padding
    max_positions: int
    rope_theta: float
    rope_scaling_type: str = "none"  # "none" | "linear" | "yarn"
    rope_scaling_factor: float = 1.0
    rope_original_max_positions: int = 0
    rms_norm_eps: float = 1e-6
    tied_embeddings: bool = False
    qkv_bias: bool = False
    bos_token_id: int = -1
    eos_token_id: int = -1
    pad_token_id: int = -1

    def canonical(self) -> "ModelConfig":
        """The config exactly as a reader returns it after a write (f32 fields rounded to f32)."""
        return unpack_config(pack_config(self))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        return cls(**d)


def _is_int(v) -> bool:
    """Python or numpy integer, not bool."""
    return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))


def _is_real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _fits_f32(x) -> bool:
    """True if x is finite and stays finite when rounded to binary32."""
    try:
        return math.isfinite(x) and math.isfinite(struct.unpack("<f", struct.pack("<f", float(x)))[0])
    except (OverflowError, TypeError, ValueError):
        return False


def _finite_f64(x) -> bool:
    """True if x is finite as the binary64 the file stores (a Python int past 2^1024 has no binary64)."""
    try:
        return math.isfinite(float(x))
    except (OverflowError, TypeError, ValueError):
        return False


def _f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def validate_config(c: ModelConfig) -> None:
    """Raise ConfigMismatch naming the field if any config value is invalid (spec §ModelConfig rules)."""
    def bad(field, expected, found):
        raise ConfigMismatch(f"config.{field}: expected {expected}, found {found!r}")

    if c.arch not in _ARCH_BY_NAME:
        bad("arch", "'qwen2' or 'llama'", c.arch)
    for field in ("n_layers", "hidden_size", "intermediate_size", "n_heads", "n_kv_heads", "head_dim",
                  "vocab_rows", "max_positions"):
        v = getattr(c, field)
        if not _is_int(v) or not (1 <= v <= _U32_MAX):
            bad(field, "an integer in 1..2^32-1", v)
    if c.n_layers > MAX_N_LAYERS:
        bad("n_layers", f"<= MAX_N_LAYERS = {MAX_N_LAYERS}", c.n_layers)
    if c.n_heads % c.n_kv_heads != 0:
        bad("n_kv_heads", f"a divisor of n_heads={c.n_heads}", c.n_kv_heads)
    if c.head_dim % 2 != 0:
        bad("head_dim", "an even number (rotary pairs)", c.head_dim)
    if c.arch == "qwen2" and c.head_dim * c.n_heads != c.hidden_size:
        bad("head_dim", f"hidden_size/n_heads = {c.hidden_size}/{c.n_heads} for qwen2", c.head_dim)
    if not (_is_real(c.rope_theta) and _finite_f64(c.rope_theta) and c.rope_theta > 0):
        bad("rope_theta", "a finite number > 0", c.rope_theta)
    if c.rope_scaling_type not in _ROPE_BY_NAME:
        bad("rope_scaling_type", "'none', 'linear' or 'yarn'", c.rope_scaling_type)
    f = c.rope_scaling_factor
    if not (_is_real(f) and _fits_f32(f)):
        bad("rope_scaling_factor", "a finite number (also finite in binary32)", f)
    if not (_is_int(c.rope_original_max_positions) and 0 <= c.rope_original_max_positions <= _U32_MAX):
        bad("rope_original_max_positions", "an integer in 0..2^32-1", c.rope_original_max_positions)
    if c.rope_scaling_type == "none":
        if f != 1.0:
            bad("rope_scaling_factor", "1.0 when rope_scaling_type is 'none'", f)
        if c.rope_original_max_positions != 0:
            bad("rope_original_max_positions", "0 when rope_scaling_type is 'none'", c.rope_original_max_positions)
    elif c.rope_scaling_type == "linear":
        if not (f > 0 and _f32(f) > 0):   # the stored binary32 value is what the reader checks (a tiny f rounds to 0)
            bad("rope_scaling_factor", "> 0 for linear scaling, also in binary32", f)
    else:  # yarn
        if not f >= 1.0:
            bad("rope_scaling_factor", ">= 1 for yarn", f)
        if c.rope_original_max_positions < 1:
            bad("rope_original_max_positions", ">= 1 for yarn", c.rope_original_max_positions)
    eps = c.rms_norm_eps
    if not (_is_real(eps) and _fits_f32(eps) and eps > 0 and _f32(eps) > 0):
        bad("rms_norm_eps", "a number > 0, finite and > 0 in binary32", eps)
    for field in ("tied_embeddings", "qkv_bias"):
        if not isinstance(getattr(c, field), bool):
            bad(field, "a bool", getattr(c, field))
    for field in ("bos_token_id", "eos_token_id", "pad_token_id"):
        v = getattr(c, field)
        if not _is_int(v) or not (v == -1 or 0 <= v < c.vocab_rows):
            bad(field, f"-1 or an id in 0..vocab_rows-1={c.vocab_rows - 1}", v)


def pack_config(c: ModelConfig) -> bytes:
    """128 bytes, little-endian. Validates first."""
    validate_config(c)
    flags = (CONFIG_FLAG_TIED if c.tied_embeddings else 0) | (CONFIG_FLAG_QKV_BIAS if c.qkv_bias else 0)
    used = _CONFIG_STRUCT.pack(
        int(_ARCH_BY_NAME[c.arch]), int(c.n_layers), int(c.hidden_size), int(c.intermediate_size), int(c.n_heads),
        int(c.n_kv_heads), int(c.head_dim), int(c.vocab_rows), int(c.max_positions), flags, float(c.rope_theta),
        int(_ROPE_BY_NAME[c.rope_scaling_type]), float(c.rope_scaling_factor), int(c.rope_original_max_positions),
        float(c.rms_norm_eps), int(c.bos_token_id), int(c.eos_token_id), int(c.pad_token_id))
    return used + bytes(CONFIG_SIZE - len(used))


def unpack_config(buf: bytes) -> ModelConfig:
    """Parse and validate the 128-byte block. Raises ConfigMismatch / NonZeroReserved."""
    if len(buf) != CONFIG_SIZE:
        raise ConfigMismatch(f"config block: expected {CONFIG_SIZE} bytes, found {len(buf)}")
    (arch, n_layers, hidden, inter, n_heads, n_kv, head_dim, vocab_rows, max_pos, flags, theta, rs_type, rs_factor,
     rs_orig, eps, bos, eos, pad) = _CONFIG_STRUCT.unpack_from(buf, 0)
    if any(buf[CONFIG_USED_SIZE:]):
        first = next(i for i in range(CONFIG_USED_SIZE, CONFIG_SIZE) if buf[i])
        raise NonZeroReserved(f"config reserved bytes [76,128): expected all zero, found byte {buf[first]:#04x} "
                              f"at config offset {first}")
    if flags & ~CONFIG_FLAGS_KNOWN:
        raise NonZeroReserved(f"config.config_flags: expected only bits 0-1, found {flags:#010x}")
    if arch not in ARCH_NAMES:
        raise ConfigMismatch(f"config.arch: expected 1 (qwen2) or 2 (llama), found {arch}")
    if rs_type not in ROPE_SCALING_NAMES:
        raise ConfigMismatch(f"config.rope_scaling_type: expected 0, 1 or 2, found {rs_type}")
    cfg = ModelConfig(
        arch=ARCH_NAMES[Arch(arch)], n_layers=n_layers, hidden_size=hidden, intermediate_size=inter,
        n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim, vocab_rows=vocab_rows, max_positions=max_pos,
        rope_theta=theta, rope_scaling_type=ROPE_SCALING_NAMES[RopeScaling(rs_type)],
        rope_scaling_factor=rs_factor, rope_original_max_positions=rs_orig, rms_norm_eps=eps,
        tied_embeddings=bool(flags & CONFIG_FLAG_TIED), qkv_bias=bool(flags & CONFIG_FLAG_QKV_BIAS),
        bos_token_id=bos, eos_token_id=eos, pad_token_id=pad)
    validate_config(cfg)
    return cfg
