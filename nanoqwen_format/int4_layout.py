"""INT4 packed layouts 1 ("rowmajor-k8-interleaved") and 2 ("rowmajor-k8-interleaved-asym"): the pure-numpy
REFERENCE (spec §9).

Logical weight W: (N, K) = (out_features, in_features). Stored codes u = q + 8 in 0..15, q in -8..7.
qweight: uint32 (N, K//8), little-endian words; word j of row n holds k = 8j..8j+7, nibble i (bits 4i..4i+3)
holds value k = 8j + INT4_PERM[i], INT4_PERM = (0, 2, 4, 6, 1, 3, 5, 7).
scales: float16 (N, K//g); layout 1 dequant w' = float32(scale[n, k // g]) * (u - 8).
Layout 2 packs codes and scales the same way and adds zeros: uint8 (N, K//g) in 0..15;
dequant w' = float32(scale[n, k // g]) * (u - zero[n, k // g]).
These functions are deliberately simple (one loop over the 8 nibble slots); the quantizer's fast numba version
is tested against them.
"""
from __future__ import annotations

import numpy as np

from .constants import INT4_MAX_CODE, INT4_PERM, INT4_ZERO_CODE


def pack_int4_reference(u_codes: np.ndarray) -> np.ndarray:
    """u_codes: uint8 (N, K) with values 0..15, K % 8 == 0  ->  qweight uint32 (N, K//8)."""
    u = np.asarray(u_codes)
    if u.ndim != 2 or u.shape[1] % 8 != 0:
        raise ValueError(f"u_codes: expected 2-D (N, K) with K % 8 == 0, found shape {u.shape}")
    if u.size and (u.min() < 0 or u.max() > 15):
        raise ValueError(f"u_codes: expected values 0..15, found range [{u.min()}, {u.max()}]")
    n, k = u.shape
    groups = u.astype(np.uint32).reshape(n, k // 8, 8)      # (N, K/8, 8): values k = 8j + 0..7
    q = np.zeros((n, k // 8), dtype=np.uint32)              # (N, K/8)
    for i in range(8):                                      # nibble slot i <- value 8j + PERM[i]
        q |= groups[:, :, INT4_PERM[i]] << np.uint32(4 * i)
    return q


def unpack_int4_reference(qweight: np.ndarray) -> np.ndarray:
    """qweight uint32 (N, K//8)  ->  u codes uint8 (N, K) in 0..15."""
    q = np.asarray(qweight)
    if q.ndim != 2 or q.dtype != np.uint32:
        raise ValueError(f"qweight: expected 2-D uint32 (N, K/8), found {q.dtype} {q.shape}")
    n, w = q.shape
    u = np.zeros((n, w, 8), dtype=np.uint8)                 # (N, K/8, 8)
    for i in range(8):
        u[:, :, INT4_PERM[i]] = (q >> np.uint32(4 * i)) & np.uint32(0xF)
    return u.reshape(n, w * 8)


def dequantize_int4_reference(qweight: np.ndarray, scales: np.ndarray, group_size: int) -> np.ndarray:
    """qweight uint32 (N, K//8), scales float16 (N, K//g)  ->  float32 (N, K): float32(s) * (u - 8)."""
    u = unpack_int4_reference(qweight)
    n, k = u.shape
    s = np.asarray(scales)
    if s.dtype != np.float16 or s.shape != (n, k // group_size) or k % group_size != 0:
        raise ValueError(f"scales: expected float16 {(n, k // group_size)} for group_size {group_size}, "
                         f"found {s.dtype} {s.shape}")
    s_full = np.repeat(s.astype(np.float32), group_size, axis=1)   # (N, K)
    return s_full * (u.astype(np.float32) - np.float32(INT4_ZERO_CODE))


def dequantize_int4_asym_reference(qweight: np.ndarray, scales: np.ndarray, zeros: np.ndarray,
                                   group_size: int) -> np.ndarray:
    """Layout 2: qweight uint32 (N, K//8), scales float16 (N, K//g), zeros uint8 (N, K//g) in 0..15  ->  float32
    (N, K): float32(s) * float32(u - z), one binary32 multiply of exact inputs (u - z is in -15..15)."""
    u = unpack_int4_reference(qweight)
    n, k = u.shape
    s = np.asarray(scales)
    z = np.asarray(zeros)
    want = (n, k // group_size)
    if s.dtype != np.float16 or s.shape != want or k % group_size != 0:
        raise ValueError(f"scales: expected float16 {want} for group_size {group_size}, found {s.dtype} {s.shape}")
    if z.dtype != np.uint8 or z.shape != want:
        raise ValueError(f"zeros: expected uint8 {want} for group_size {group_size}, found {z.dtype} {z.shape}")
    if z.size and z.max() > INT4_MAX_CODE:
        raise ValueError(f"zeros: expected values 0..{INT4_MAX_CODE}, found max {z.max()}")
    s_full = np.repeat(s.astype(np.float32), group_size, axis=1)                     # (N, K)
    z_full = np.repeat(z.astype(np.int16), group_size, axis=1)                       # (N, K)
    return s_full * (u.astype(np.int16) - z_full).astype(np.float32)
