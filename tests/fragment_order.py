"""numpy reference of the INT4 fragment order (csrc/src/int4_frag.cuh: the device order of layout-1 INT4 weights on
Hopper, repacked at load; the file keeps layout 1).

The order, as the header states it: tile (nb, kb) = W rows 64 nb .. 64 nb + 63 x k 16 kb .. 16 kb + 15. Lane
l = 4 g + t holds 4 words; nibble i of word w holds the code of row 16 w + 8 ((i >> 1) & 1) + g and k 2 t + (i >> 2)
+ 8 (i & 1). Words [N/64][K/16][32][4] uint32; scales [N/64][K/group][8 g][8 j] = scale of row 64 nb + 8 j + g.
The gate/up pair P (2I rows): P row 64 T + 16 q + 8 h + g = (h ? up : gate) row 32 T + 8 q + g.

Used by tests/test_fragment_order.py (CPU: the order's own statements) and tests/test_gpu_frag_repack.py (the device
repack bit for bit against these functions)."""
from __future__ import annotations

import numpy as np

from nanoqwen_format.constants import INT4_PERM

TILE_ROWS, STEP_K = 64, 16
_PERM = np.array(INT4_PERM)


def codes_of(qweight: np.ndarray) -> np.ndarray:
    """Layout-1 qweight uint32 (N, K/8) -> codes u uint8 (N, K): nibble i of word j holds k = 8 j + INT4_PERM[i]."""
    N, K8 = qweight.shape
    nib = (qweight[:, :, None] >> (4 * np.arange(8, dtype=np.uint32))) & 15        # (N, K/8, 8) by nibble
    u = np.empty((N, K8, 8), dtype=np.uint8)
    u[:, :, _PERM] = nib
    return u.reshape(N, K8 * 8)


def nibble_place(lane, w, i):
    """(row within the 64-row tile, k within the 16-k step) of nibble i of word w of lane (arrays broadcast)."""
    row = 16 * w + 8 * ((i >> 1) & 1) + (lane >> 2)
    k = 2 * (lane & 3) + (i >> 2) + 8 * (i & 1)
    return row, k


def to_fragment_order(qweight: np.ndarray, scales: np.ndarray):
    """Layout-1 qweight uint32 (N, K/8) and scales f16 (N, K/g) -> words uint32 (N/64, K/16, 32, 4) and scales f16
    (N/64, K/g, 8, 8)."""
    N, K = qweight.shape[0], qweight.shape[1] * 8
    if N % TILE_ROWS or K % (8 * STEP_K):
        raise ValueError(f"no fragment order for {N} x {K}: needs N % 64 == 0 and K % 128 == 0")
    NB, KB, G = N // TILE_ROWS, K // STEP_K, scales.shape[1]
    u = codes_of(qweight).reshape(NB, TILE_ROWS, KB, STEP_K).transpose(0, 2, 1, 3)   # (NB, KB, 64, 16)
    lane, w, i = np.meshgrid(np.arange(32), np.arange(4), np.arange(8), indexing="ij")
    row, k = nibble_place(lane, w, i)                                               # (32, 4, 8) each
    vals = u[:, :, row, k].astype(np.uint32)                                        # (NB, KB, 32, 4, 8)
    words = np.bitwise_or.reduce(vals << (4 * np.arange(8, dtype=np.uint32)), axis=4).astype(np.uint32)
    s = np.ascontiguousarray(scales.reshape(NB, 8, 8, G).transpose(0, 3, 2, 1))      # [nb][gi][g][j]
    return words, s


def from_fragment_order(words: np.ndarray, scales: np.ndarray):
    """The inverse: (codes u uint8 (N, K), scales f16 (N, K/g))."""
    NB, KB = words.shape[:2]
    G = scales.shape[1]
    lane, w, i = np.meshgrid(np.arange(32), np.arange(4), np.arange(8), indexing="ij")
    row, k = nibble_place(lane, w, i)
    u = np.zeros((NB, KB, TILE_ROWS, STEP_K), dtype=np.uint8)
    u[:, :, row, k] = (words[:, :, :, :, None] >> (4 * i.astype(np.uint32))) & 15
    codes = u.transpose(0, 2, 1, 3).reshape(NB * TILE_ROWS, KB * STEP_K)
    s = scales.transpose(0, 3, 2, 1).reshape(NB * TILE_ROWS, G)
    return codes, s


def interleave_pair(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """Rows of gate and up (I, ...) -> P (2I, ...): P row 64 T + 16 q + 8 h + g = (h ? up : gate) row 32 T + 8 q + g."""
    I = gate.shape[0]
    if I % TILE_ROWS or up.shape != gate.shape:
        raise ValueError(f"no pair order for gate {gate.shape} and up {up.shape}: needs equal shapes, I % 64 == 0")
    rest = gate.shape[1:]
    g = gate.reshape(I // 32, 4, 1, 8, *rest)
    u = up.reshape(I // 32, 4, 1, 8, *rest)
    return np.concatenate([g, u], axis=2).reshape(2 * I, *rest)


def split_pair(P: np.ndarray):
    """The inverse of interleave_pair: (gate, up)."""
    I = P.shape[0] // 2
    rest = P.shape[1:]
    v = P.reshape(I // 32, 4, 2, 8, *rest)
    return v[:, :, 0].reshape(I, *rest), v[:, :, 1].reshape(I, *rest)


def pair_fragment_order(q_gate, s_gate, q_up, s_up):
    """The pair P in the fragment order: words (I/32, K/16, 32, 4) and scales (I/32, K/g, 8, 8); tiles 0 .. I/64 - 1
    lie in gate's bytes on the device, the rest in up's."""
    return to_fragment_order(interleave_pair(q_gate, q_up), interleave_pair(s_gate, s_up))


def unpack_word(word: int):
    """The kernels' unpack of one word through its masks (frag::unpack_word): four (code, code) pairs: (row 16w+g: k
    2t, 2t+1), (row 16w+g: k 2t+8, 2t+9), (row 16w+8+g: k 2t, 2t+1), (row 16w+8+g: k 2t+8, 2t+9)."""
    def lo(x):   # (x & 0x000F000F): codes at bits 0-3 and 16-19
        return (x & 15, (x >> 16) & 15)

    def hi(x):   # (x & 0x00F000F0) / 16: codes at bits 4-7 and 20-23
        return ((x >> 4) & 15, (x >> 20) & 15)
    return [lo(word), hi(word), lo(word >> 8), hi(word >> 8)]
