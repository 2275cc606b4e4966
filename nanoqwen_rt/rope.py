"""Rotary position embedding, computed the way Hugging Face transformers computes it (rotate-half convention).

`rope_parameters(cfg)` → (inv_freq float32 (head_dim/2,), attention_scaling float) following transformers'
`modeling_rope_utils` (`_compute_default_rope_parameters`, `_compute_linear_scaling_rope_parameters`,
`_compute_yarn_parameters` with its defaults beta_fast=32, beta_slow=1, truncate=True, attention_factor =
0.1*ln(factor)+1): the same float32 / float64 steps in the same order. `cos_sin(inv_freq, scaling, positions)`
→ float32 (T, head_dim) cos and sin, `emb = cat(freqs, freqs)`, multiplied by attention_scaling (as HF does).
`apply_rope(x, cos, sin)`: x (T, H, head_dim) → x*cos + rotate_half(x)*sin.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["rope_parameters", "cos_sin", "apply_rope", "UnsupportedRope"]

YARN_BETA_FAST = 32.0   # transformers' default (rope_parameters.get("beta_fast") or 32)
YARN_BETA_SLOW = 1.0    # transformers' default (rope_parameters.get("beta_slow") or 1)


class UnsupportedRope(ValueError):
    """The header names a RoPE scaling type this runtime does not implement."""


def _base_pow(theta: float, dim: int) -> np.ndarray:
    """float32 theta ** (arange(0, dim, 2) / dim): exponent in float32 as torch computes it, the power in float64
    rounded once to float32 (matches torch's float32 pow bit for bit on all but ~1 in 300 elements, where it is
    1 ulp off; numpy's own float32 pow is off on ~10%)."""
    expo = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    return (np.float64(theta) ** expo.astype(np.float64)).astype(np.float32)


def rope_parameters(cfg) -> tuple[np.ndarray, float]:
    dim = int(cfg.head_dim)
    theta = float(cfg.rope_theta)
    kind = cfg.rope_scaling_type
    if kind == "none":
        return (np.float32(1.0) / _base_pow(theta, dim)).astype(np.float32), 1.0
    if kind == "linear":
        inv = np.float32(1.0) / _base_pow(theta, dim)
        return (inv / np.float32(cfg.rope_scaling_factor)).astype(np.float32), 1.0
    if kind == "yarn":
        factor = float(cfg.rope_scaling_factor)
        orig = float(cfg.rope_original_max_positions)
        attention_factor = 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0

        def correction_dim(num_rot: float) -> float:
            return (dim * math.log(orig / (num_rot * 2 * math.pi))) / (2 * math.log(theta))

        low = max(math.floor(correction_dim(YARN_BETA_FAST)), 0)
        high = min(math.ceil(correction_dim(YARN_BETA_SLOW)), dim - 1)
        if low == high:
            high += 0.001   # transformers: prevent singularity
        ramp = (np.arange(dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low)
        ramp = np.clip(ramp, np.float32(0), np.float32(1)).astype(np.float32)
        extrap_factor = np.float32(1) - ramp
        pos_freqs = _base_pow(theta, dim)
        inv_extrap = np.float32(1.0) / pos_freqs
        inv_interp = np.float32(1.0) / (np.float32(factor) * pos_freqs)
        inv = inv_interp * (np.float32(1) - extrap_factor) + inv_extrap * extrap_factor
        return inv.astype(np.float32), float(attention_factor)
    raise UnsupportedRope(f"rope_scaling_type {kind!r} is not supported (none, linear, yarn)")


def cos_sin(inv_freq: np.ndarray, attention_scaling: float, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """positions int (T,) → cos, sin float32 (T, head_dim)."""
    freqs = positions.astype(np.float32)[:, None] * inv_freq[None, :]            # (T, head_dim/2) f32
    emb = np.concatenate([freqs, freqs], axis=-1)                                 # (T, head_dim)
    sc = np.float32(attention_scaling)
    return (np.cos(emb) * sc).astype(np.float32), (np.sin(emb) * sc).astype(np.float32)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x float32 (T, H, head_dim); cos/sin (T, head_dim) → rotated (T, H, head_dim)."""
    half = x.shape[-1] // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, None, :] + rot * sin[:, None, :]
