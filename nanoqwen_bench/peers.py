"""The peers `nanoqwen bench` compares the runtime with, on the same GEMV shapes, in the same process:

* torch's int4 weight-only chain: `torch._weight_int4pack_mm` (tinygemm) on weights packed by
  `torch._convert_weight_to_int4pack`, group size 128, bf16 activations — the 7 linear shapes of every layer
  (n_layers x 7 GEMVs) + lm_head, once with an int4 lm_head and once with an fp16 one (our files' layout);
* the cuBLAS fp16 chain: `F.linear` at batch 1 on fp16 weights of the same shapes (+ fp16 lm_head).

Each chain is captured once in a CUDA graph and its replays are timed with CUDA events (warm-up, median of
many). The weights of one chain are GBs, ~50x the L2, so every replay streams them from HBM. Only the GEMVs
are timed: no norms, attention, activations — a lower bound of what a decode step built from them costs.
Before timing, one GEMV of each kind is compared with a float64 reference on the dequantized weights
(fresh random codes and scales) so the numbers are numbers of a correct computation.
"""
from __future__ import annotations

from .timing import BenchError, gemv_shapes, summary, time_cuda_ms, torch_cuda

__all__ = ["run_peers", "check_int4_peer", "check_fp16_peer", "INT4_GROUP_SIZE", "INNER_K_TILES"]

INT4_GROUP_SIZE = 128      # the group size of our files and of gpt-fast's int4 path
INNER_K_TILES = 8          # tinygemm's packing parameter (gpt-fast's default for g128); needs K % (8*16) == 0
# bf16 output (rel. rounding 2^-9) after an fp32 accumulation of bf16-dequantized weights: a correct kernel lands
# near 3e-3; a wrong nibble order or scale layout lands near 1.
INT4_CHECK_RTOL = 1e-2
# fp16 output rounding (2^-11) after fp32 accumulation: a correct GEMV lands near 5e-4.
FP16_CHECK_RTOL = 5e-3


def _rel_err(torch, y, ref) -> float:
    return float(torch.linalg.vector_norm(y.double() - ref) / torch.linalg.vector_norm(ref))


def _int4_weight(torch, n: int, k: int, g: int, gen):
    """Random int4 codes u (n, k) uint8 in 0..15, tinygemm-packed, and scales_and_zeros (k/g, n, 2) bf16.

    Dequantized weight: w[n, k] = (u[n, k] - 8) * scale[k // g, n]  (zeros = 0: symmetric, as our layout).
    Returns (packed, scales_and_zeros, u, scales (k/g, n) bf16).
    """
    u = torch.randint(0, 16, (n, k), dtype=torch.uint8, device="cuda", generator=gen)          # (n, k)
    packed_u8 = (u[:, ::2] << 4) | u[:, 1::2]                                                  # (n, k/2): even k high
    packed = torch.ops.aten._convert_weight_to_int4pack(packed_u8.contiguous(), INNER_K_TILES)
    # scales for unit-variance outputs from unit-variance inputs (E[(u-8)^2] = 21.5), jittered per group
    base = (21.5 * k) ** -0.5
    scales = (base * torch.exp(0.2 * torch.randn(k // g, n, device="cuda", generator=gen) - 0.02)).to(torch.bfloat16)
    sz = torch.stack([scales, torch.zeros_like(scales)], dim=-1).contiguous()                 # (k/g, n, 2) bf16
    return packed, sz, u, scales


def check_int4_peer(n: int = 512, k: int = 3584, g: int = INT4_GROUP_SIZE, seed: int = 1) -> float:
    """torch int4 GEMV vs float64 on the dequantized weights; returns the relative error (raises if > rtol)."""
    torch = torch_cuda()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    packed, sz, u, scales = _int4_weight(torch, n, k, g, gen)
    x = torch.randn(1, k, device="cuda", generator=gen).to(torch.bfloat16)                    # (1, k)
    y = torch.ops.aten._weight_int4pack_mm(x, packed, g, sz)                                  # (1, n) bf16
    w = (u.double() - 8.0) * scales.double().t().repeat_interleave(g, dim=1)                  # (n, k) f64
    ref = x.double() @ w.t()
    err = _rel_err(torch, y, ref)
    if not err < INT4_CHECK_RTOL:
        raise BenchError(f"torch int4 peer disagrees with its dequantized reference: rel err {err:.3e} "
                         f"> {INT4_CHECK_RTOL} (shape {n}x{k}, g {g})")
    return err


def check_fp16_peer(n: int = 512, k: int = 3584, seed: int = 2) -> float:
    """F.linear fp16 at batch 1 vs float64; returns the relative error (raises if > rtol)."""
    torch = torch_cuda()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    w = (torch.randn(n, k, device="cuda", generator=gen) * k ** -0.5).half()
    x = torch.randn(1, k, device="cuda", generator=gen).half()
    y = torch.nn.functional.linear(x, w)
    err = _rel_err(torch, y, x.double() @ w.double().t())
    if not err < FP16_CHECK_RTOL:
        raise BenchError(f"cuBLAS fp16 peer disagrees with float64: rel err {err:.3e} > {FP16_CHECK_RTOL}")
    return err


def _graph(torch, fn):
    """Capture fn (already warmed up on a side stream) into a CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def _time_graph(torch, fn, nbytes: int, n_gemv: int, reps: int) -> dict:
    g = _graph(torch, fn)
    ms = time_cuda_ms(g.replay, reps=reps, warmup=3)
    out = summary(ms)
    out.update({"bytes": int(nbytes), "n_gemv": n_gemv, "GBps": nbytes / (out["median_ms"] * 1e-3) / 1e9})
    del g
    return out


def _time_prefill_chain(torch, ws, prompt_tokens: int, nbytes: int, gen, reps: int) -> dict:
    """The prefill's GEMMs on ws [(w (N, K) f16, K)] converted to bf16 in place (one weight at a time: the list's
    entries are replaced, so the peak is one weight more): F.linear of (prompt_tokens, K) bf16 activations, captured
    in a CUDA graph; timing plus TFLOP/s."""
    F = torch.nn.functional
    for i, (w, k) in enumerate(ws):
        ws[i] = (w.to(torch.bfloat16), k)
    xp = {k: torch.randn(prompt_tokens, k, device="cuda", generator=gen, dtype=torch.bfloat16)
          for k in {k for _, k in ws}}                                 # (prompt_tokens, K) per K

    def chain_prefill():
        for w, k in ws:
            F.linear(xp[k], w)

    out = _time_graph(torch, chain_prefill, nbytes, len(ws), reps)
    flops = 2 * prompt_tokens * sum(w.shape[0] * k for w, k in ws)
    out.update({"prompt_tokens": prompt_tokens, "TFLOPs": flops / (out["median_ms"] * 1e-3) / 1e12})
    return out


def run_peers(cfg, reps: int = 30, seed: int = 0, fp16: bool = True, int4: bool = True,
              prompt_tokens: int = 0) -> dict:
    """Time the peer chains on cfg's shapes (n_layers x 7 GEMVs + lm_head (vocab_rows, hidden)). JSON-able dict:

    {"torch_int4": {...}, "torch_int4_f16_lm_head": {...}, "cublas_fp16": {...}, "int4_check_rel_err",
     "fp16_check_rel_err", "shapes", "skipped": {name: reason}} — each chain: median/min/max ms, bytes, GB/s.
    With prompt_tokens > 0 (and fp16), also "cublas_bf16_prefill": the prefill's GEMMs alone, F.linear of
    (prompt_tokens, K) bf16 activations on bf16 weights of the same n_layers x 7 shapes (no lm_head, no attention),
    with its TFLOP/s: the tensor-core peer of the prompt's GEMM work.
    """
    torch = torch_cuda()
    F = torch.nn.functional
    g = INT4_GROUP_SIZE
    shapes = gemv_shapes(cfg)
    head = ("lm_head", cfg.vocab_rows, cfg.hidden_size)
    res: dict = {"torch_version": torch.__version__, "group_size": g, "inner_k_tiles": INNER_K_TILES,
                 "n_layers": cfg.n_layers, "shapes": [list(s) for s in shapes + [head]], "skipped": {}}
    gen = torch.Generator(device="cuda").manual_seed(seed)
    xs = {}                                                   # K -> (1, K) activations, both dtypes
    for _, _, k in shapes + [head]:
        if k not in xs:
            x = torch.randn(1, k, device="cuda", generator=gen)
            xs[k] = (x.to(torch.bfloat16), x.half())
    fp16_head = (torch.randn(head[1], head[2], device="cuda", generator=gen) * head[2] ** -0.5).half()
    fp16_head_bytes = 2 * head[1] * head[2]

    int4_ok = int4 and all(n % 8 == 0 and k % (INNER_K_TILES * 16) == 0 and k % g == 0
                           for _, n, k in shapes + [head])
    if int4 and not int4_ok:
        res["skipped"]["torch_int4"] = f"a shape is not tinygemm-packable (N % 8, K % {INNER_K_TILES * 16}, K % {g})"
    if int4_ok:
        res["int4_check_rel_err"] = check_int4_peer(g=g)
        layers = []                                           # [(packed, sz, K)] for all layers x 7
        nbytes = 0
        for _ in range(cfg.n_layers):
            for _, n, k in shapes:
                packed, sz, _, _ = _int4_weight(torch, n, k, g, gen)
                layers.append((packed, sz, k))
                nbytes += n * k // 2 + (k // g) * n * 4
        hp, hsz, _, _ = _int4_weight(torch, head[1], head[2], g, gen)
        head_bytes = head[1] * head[2] // 2 + (head[2] // g) * head[1] * 4

        def chain_int4(int4_head: bool):
            def fn():
                for packed, sz, k in layers:
                    torch.ops.aten._weight_int4pack_mm(xs[k][0], packed, g, sz)
                if int4_head:
                    torch.ops.aten._weight_int4pack_mm(xs[head[2]][0], hp, g, hsz)
                else:
                    F.linear(xs[head[2]][1], fp16_head)
            return fn

        n_gemv = len(layers) + 1
        res["torch_int4"] = _time_graph(torch, chain_int4(True), nbytes + head_bytes, n_gemv, reps)
        res["torch_int4_f16_lm_head"] = _time_graph(torch, chain_int4(False), nbytes + fp16_head_bytes, n_gemv, reps)
        del layers, hp, hsz
        torch.cuda.empty_cache()

    if fp16:
        res["fp16_check_rel_err"] = check_fp16_peer()
        ws = []
        nbytes = 0
        for _ in range(cfg.n_layers):
            for _, n, k in shapes:
                ws.append((torch.randn(n, k, device="cuda", generator=gen, dtype=torch.float16) * k ** -0.5, k))
                nbytes += 2 * n * k

        def chain_fp16():
            for w, k in ws:
                F.linear(xs[k][1], w)
            F.linear(xs[head[2]][1], fp16_head)

        res["cublas_fp16"] = _time_graph(torch, chain_fp16, nbytes + fp16_head_bytes, len(ws) + 1, reps)
        if prompt_tokens > 0:
            try:
                res["cublas_bf16_prefill"] = _time_prefill_chain(torch, ws, prompt_tokens, nbytes, gen,
                                                                 max(3, reps // 3))
            except (RuntimeError, torch.cuda.OutOfMemoryError) as e:   # an optional peer: say why, keep the rest
                res["skipped"]["cublas_bf16_prefill"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        del ws
    del fp16_head, xs
    torch.cuda.empty_cache()
    return res
