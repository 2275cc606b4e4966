"""Shared helpers for the tests/test_format_*.py files: small random configs and files (never zeros)."""
from __future__ import annotations

import os

import numpy as np

from nanoqwen_format import (BlobKind, DType, ModelConfig, NanoqwenWriter, TensorSpec, expected_tensors,
                             pack_int4_reference)

TINY = ModelConfig(arch="qwen2", n_layers=2, hidden_size=64, intermediate_size=96, n_heads=4, n_kv_heads=2,
                   head_dim=16, vocab_rows=80, max_positions=128, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                   tied_embeddings=False, qkv_bias=True, bos_token_id=-1, eos_token_id=5, pad_token_id=7)


def random_payload(spec: TensorSpec, rng: np.random.Generator):
    """Random, non-zero data of the right numpy type for one spec: an array, or (qweight, scales) for INT4G."""
    if spec.dtype == DType.INT4G:
        n, k = spec.shape
        u = rng.integers(0, 16, size=(n, k), dtype=np.uint8)
        scales = rng.uniform(0.001, 0.1, size=(n, k // spec.group_size)).astype(np.float16)
        return pack_int4_reference(u), scales
    if spec.dtype == DType.F32:
        return rng.standard_normal(spec.shape).astype(np.float32)
    if spec.dtype == DType.F16:
        return rng.standard_normal(spec.shape).astype(np.float16)
    # bf16 bits: a random f32 truncated to its top 16 bits (finite values)
    f = rng.standard_normal(spec.shape).astype(np.float32)
    return (f.view(np.uint32) >> np.uint32(16)).astype(np.uint16)


def specs_for(cfg: ModelConfig, dtype_for=None):
    """TensorSpecs for every expected tensor; dtype_for(name, shape) -> (DType, group_size), default f16."""
    out = []
    for name, shape in expected_tensors(cfg).items():
        dt, g = dtype_for(name, shape) if dtype_for else (DType.F16, 0)
        out.append(TensorSpec(name, dt, shape, group_size=g))
    return out


def mixed_dtypes(name, shape):
    """Every dtype appears: int4g g32 on projections, bf16 embeddings, f32 norms, f16 biases and lm_head."""
    if "proj.weight" in name:
        return DType.INT4G, 32
    if name.endswith("embed_tokens.weight"):
        return DType.BF16, 0
    if "norm" in name:
        return DType.F32, 0
    return DType.F16, 0


def write_file(path, cfg: ModelConfig, specs, payloads, blobs=None):
    blobs = blobs or {}
    with NanoqwenWriter(path, cfg, specs, list(blobs)) as w:
        for s in specs:
            if s.dtype == DType.INT4G:
                w.write_int4(s.name, *payloads[s.name])
            else:
                w.write_tensor(s.name, payloads[s.name])
        for kind, data in blobs.items():
            w.write_blob(kind, data)
    return path


def make_random_file(path, cfg=TINY, seed=0, dtype_for=mixed_dtypes, blobs=None):
    """Write a random valid file; returns (specs, payloads)."""
    rng = np.random.default_rng(seed)
    specs = specs_for(cfg, dtype_for)
    payloads = {s.name: random_payload(s, rng) for s in specs}
    if blobs is None:
        blobs = {BlobKind.TOKENIZER_JSON: b'{"version": "1.0", "model": {"type": "BPE"}}',
                 BlobKind.CHAT_TEMPLATE: "{% for m in messages %}{{ m['content'] }}{% endfor %} é".encode()}
    write_file(os.fspath(path), cfg, specs, payloads, blobs)
    return specs, payloads
