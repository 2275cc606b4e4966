"""What the bench's measurements share: BenchError, torch + CUDA access, CUDA-event timing, and the per-layer GEMV
shapes. Both measure.py and peers.py import it (and not each other's internals)."""
from __future__ import annotations

import statistics
from typing import Callable

__all__ = ["BenchError", "torch_cuda", "time_cuda_ms", "summary", "gpu_name", "gemv_shapes"]


class BenchError(RuntimeError):
    """The benchmark cannot run here (no torch / no CUDA / bad arguments); the message says which."""


# -- shapes ----------------------------------------------------------------------------------------
def gemv_shapes(cfg) -> list[tuple[str, int, int]]:
    """The 7 per-layer linear shapes (name, N=out_features, K=in_features) of a Qwen2/Llama config."""
    q_out = cfg.n_heads * cfg.head_dim
    kv_out = cfg.n_kv_heads * cfg.head_dim
    h, i = cfg.hidden_size, cfg.intermediate_size
    return [("q_proj", q_out, h), ("k_proj", kv_out, h), ("v_proj", kv_out, h), ("o_proj", h, q_out),
            ("gate_proj", i, h), ("up_proj", i, h), ("down_proj", h, i)]


# -- timing helpers --------------------------------------------------------------------------------------
def torch_cuda():
    """torch with a usable CUDA device, or BenchError."""
    try:
        import torch
    except ImportError:
        raise BenchError("torch is not installed: the bandwidth and peer measurements need it") from None
    if not torch.cuda.is_available():
        raise BenchError("torch sees no CUDA device")
    return torch


def time_cuda_ms(fn: Callable[[], object], reps: int = 20, warmup: int = 3) -> list[float]:
    """Run fn warmup times, then time each of reps runs with a pair of CUDA events. Returns ms per run."""
    torch = torch_cuda()
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def summary(ms: list[float]) -> dict:
    return {"median_ms": statistics.median(ms), "min_ms": min(ms), "max_ms": max(ms), "n": len(ms)}


def gpu_name() -> str:
    try:
        torch = torch_cuda()
        return torch.cuda.get_device_name(0)
    except BenchError:
        return "unknown"
