"""CPU backend: the reference forward pass of Qwen2 / Llama over a .nanoqwen file (numpy + numba).

Weights stay in the mmap'd file (zero-copy views) and are read by the streaming kernels of kernels.py;
only the 1-D tensors (norm weights, biases: a few KB per layer) are widened to float32 copies. int4g weights of
both layouts run the same kernels: layout 2's stored zero points, or for layout 1 its constant 8 as a shared
read-only array (kernels.symmetric_zeros), which gives layout 1's numbers bit for bit.
Numerics (the `numerics` argument, fixed for the backend's life):
  * "oracle" (the default): every activation and accumulation is float32, weights widened exactly. The tests, the
    GPU backend's comparisons (LOGIT_ATOL) and nanoqwen-verify use it; nothing here is traded for speed.
  * "fast" (what Engine serves with on the CPU): the int4 products round each token's input to int16 per weight
    group and sum exact integer products (fast_kernels.py: a GEMV for one token, a GEMM for a prompt, the same
    products per token), and the lm_head is rounded once, at load, to int8 per row and group (a copy in memory:
    vocab x hidden bytes + 4 bytes per group, e.g. 140 MB for Qwen2.5-0.5B; the stored matrix is still read for the
    embedding gather). f16 / bf16 linear weights other than the lm_head run the oracle's float32 kernels.
    tests/test_cpu_fast.py bounds the difference; bench/NOTES.md measures it (perplexity, agreement) and the speed.
The KV cache is float32 (or float16 with kv_dtype="f16"),
shaped (n_layers, n_kv_heads, capacity, head_dim): it starts at KV_INITIAL_POSITIONS positions and doubles (up to
max_context) when a prefill/decode needs more, so the first token of a fresh process does not page-fault in a
cache sized for the whole context. Every allocation is filled with NaN, so a read of a slot that was never
written poisons the logits instead of passing silently.
"""
from __future__ import annotations

import os

import numpy as np

from ..base import Backend, BackendError, SequenceKv, resolve_max_context
from .fast_kernels import (gemm_int4_q16_multi, gemv_i8, gemv_int4_q16_multi, lm_head_group, quantize_rows_i8,
                           warmup_fast_kernels)
from .kernels import (BF16_LUT, F16_LUT, attention, attention_prefill, blas_single_threaded, gemm_int4_multi,
                      gemv_int4_multi,
                      matmul_int4, matmul_u16, rms_norm, rows_u16, silu_mul, symmetric_zeros, warmup_kernels)
from ...rope import apply_rope, cos_sin, rope_parameters
from nanoqwen_format.shapes import KV_PAGE_TOKENS

__all__ = ["CPUBackend", "PagedKv", "available", "Linear", "NUMERICS", "LmHeadI8"]

#: the CPU backend's numerics (module docstring): "oracle" float32 throughout, "fast" integer one-token products
NUMERICS = ("oracle", "fast")

# Positions the KV cache holds before its first growth: a typical prompt plus its answer, a few MB even for a 7B
# model, so a short request never pays for a context-sized allocation.
KV_INITIAL_POSITIONS = 256


def available() -> bool:
    return True


class Linear:
    """y = x @ W.T (+ b) over one stored weight (N, K). x: f32 (T, K) → f32 (T, N)."""

    def __init__(self, f, name: str, bias: str | None = None):
        from nanoqwen_format import LAYOUT_INT4_ROWMAJOR_K8_ASYM, DType
        info = f.tensors[name]
        self.name = name
        self.dtype = DType(info.dtype)
        if self.dtype == DType.INT4G:
            self.group_size = int(info.group_size)
            self.N, self.K = int(info.shape[0]), int(info.shape[1])
            if info.layout_id == LAYOUT_INT4_ROWMAJOR_K8_ASYM:
                qw, sc, zeros = f.int4_asym(name)
            else:                                              # layout 1: its constant zero point 8, shared
                qw, sc = f.int4(name)
                zeros = symmetric_zeros(self.N, self.K // self.group_size)
            self.qweight = qw                                  # u32 (N, K/8)
            self.qbytes = qw.view(np.uint8)                    # u8 (N, K/2): the same bytes (fast numerics)
            self.scale_bits = sc.view(np.uint16)               # u16 (N, K/g) f16 bits
            self.zeros = zeros                                 # u8 (N, K/g) zero points, read-only
        elif self.dtype in (DType.F16, DType.BF16):
            a = f.array(name)
            self.bits = a.view(np.uint16)                      # u16 (N, K)
            self.is_bf16 = self.dtype == DType.BF16
            self.N, self.K = a.shape
        elif self.dtype == DType.F32:
            self.w = f.array(name)                             # f32 (N, K)
            self.N, self.K = self.w.shape
        else:
            raise BackendError(f"{name}: dtype {self.dtype.name} is not supported for a linear weight")
        self.kind = self.dtype.name                                # "INT4G" | "F16" | "BF16" | "F32" (hot path)
        self.bias = f.float32(bias).reshape(-1) if bias is not None else None   # f32 (N,)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        T = x.shape[0]
        if self.kind == "F32":
            y = x @ self.w.T
        else:
            y = np.full((T, self.N), np.nan, dtype=np.float32)     # (T, N) poisoned: every entry must be written
            if self.kind == "INT4G":
                matmul_int4(x, self.qweight, self.scale_bits, self.group_size, y, self.zeros)
            else:
                matmul_u16(x, self.bits, self.is_bf16, y)
        if self.bias is not None:
            y += self.bias
        return y


def project(lins: tuple[Linear, ...], x: np.ndarray, fast: bool = False) -> list[np.ndarray]:
    """[lin(x) for lin in lins]; over int4 weights of one K and group (q/k/v, gate/up) the products run together:
    for one token as one parallel region (gemv_int4_multi), for a prompt as one work list of dequantized tiles
    (gemm_int4_multi); fast (the backend's "fast" numerics): with each token's input rounded to int16 per group and
    exact integer sums, gemv_int4_q16_multi for one token, gemm_int4_q16_multi for a prompt."""
    first = lins[0]
    if not all(type(l) is Linear and l.kind == "INT4G" and l.group_size == first.group_size for l in lins):
        return [l(x) for l in lins]             # (also any callable standing in for a Linear: calibration's)
    T = x.shape[0]
    ys = [np.full((T, l.N), np.nan, dtype=np.float32) for l in lins]          # (T, N) each, poisoned
    scales, zeros = [l.scale_bits for l in lins], [l.zeros for l in lins]
    if T > 1 and fast:
        gemm_int4_q16_multi(np.ascontiguousarray(x, dtype=np.float32), [l.qbytes for l in lins], scales,
                            first.group_size, ys, zeros)
    elif T > 1:
        gemm_int4_multi(np.ascontiguousarray(x, dtype=np.float32), [l.qweight for l in lins], scales,
                        first.group_size, ys, zeros)
    elif fast:
        x0 = np.ascontiguousarray(x[0], dtype=np.float32)
        gemv_int4_q16_multi(x0, [l.qbytes for l in lins], scales, first.group_size, [y[0] for y in ys], zeros)
    else:
        gemv_int4_multi(np.ascontiguousarray(x[0], dtype=np.float32), [l.qweight for l in lins], scales,
                        first.group_size, [y[0] for y in ys], zeros)
    for l, y in zip(lins, ys):
        if l.bias is not None:
            y += l.bias
    return ys


class LmHeadI8:
    """The lm_head of the fast numerics: the stored (f16 / bf16 / f32) matrix rounded once to int8 per row and group
    of `group_size` (fast_kernels.quantize_rows_i8); rows of h multiplied one at a time (gemv_i8)."""

    def __init__(self, lin: Linear, group_size: int):
        src, kind = ((lin.bits, 1 if lin.is_bf16 else 0) if lin.kind in ("F16", "BF16") else (lin.w, 2))
        self.q, self.steps = quantize_rows_i8(src, kind, group_size)     # int8 (N, K), f32 (N, K/g)
        self.group_size = group_size
        self.N = lin.N
        self.bias = lin.bias

    @property
    def nbytes(self) -> int:
        return self.q.nbytes + self.steps.nbytes

    def __call__(self, h: np.ndarray) -> np.ndarray:
        y = np.full((h.shape[0], self.N), np.nan, dtype=np.float32)       # (T, N) poisoned
        for t in range(h.shape[0]):
            gemv_i8(np.ascontiguousarray(h[t], dtype=np.float32), self.q, self.steps, self.group_size, y[t])
        if self.bias is not None:
            y += self.bias
        return y


class _Layer:
    def __init__(self, f, i: int, qkv_bias: bool):
        p = f"model.layers.{i}."
        self.in_norm = f.float32(p + "input_layernorm.weight")              # f32 (hidden,)
        self.post_norm = f.float32(p + "post_attention_layernorm.weight")   # f32 (hidden,)
        a = p + "self_attn."
        self.q = Linear(f, a + "q_proj.weight", a + "q_proj.bias" if qkv_bias else None)
        self.k = Linear(f, a + "k_proj.weight", a + "k_proj.bias" if qkv_bias else None)
        self.v = Linear(f, a + "v_proj.weight", a + "v_proj.bias" if qkv_bias else None)
        self.o = Linear(f, a + "o_proj.weight")
        m = p + "mlp."
        self.gate = Linear(f, m + "gate_proj.weight")
        self.up = Linear(f, m + "up_proj.weight")
        self.down = Linear(f, m + "down_proj.weight")


class CPUBackend(Backend):
    """numpy + numba backend (see module docstring). kv_dtype: "f32" (default) or "f16"; numerics: "oracle"
    (default) or "fast" (NUMERICS)."""

    name = "cpu"

    def __init__(self, path: str | os.PathLike, *, max_context: int | None = None, file=None,
                 kv_dtype: str = "f32", numerics: str = "oracle"):
        from nanoqwen_format import DType, open_file
        if numerics not in NUMERICS:
            raise ValueError(f"numerics must be one of {', '.join(map(repr, NUMERICS))}, got {numerics!r}")
        self.numerics = numerics
        self._fast = numerics == "fast"
        self._own_file = file is None
        self._file = open_file(os.fspath(path)) if file is None else file
        f = self._file
        try:
            cfg = self.config = f.config
            self.max_context = resolve_max_context(cfg, max_context)
            self.inv_freq, self.rope_scaling = rope_parameters(cfg)
            emb_info = f.tensors["model.embed_tokens.weight"]
            self._emb_dtype = DType(emb_info.dtype)
            if self._emb_dtype == DType.INT4G:
                raise BackendError("model.embed_tokens.weight stored as int4 is not supported (gather needs rows)")
            self._emb = f.array("model.embed_tokens.weight")          # (vocab_rows, hidden) f32/f16/u16 bits
            self.layers = [_Layer(f, i, cfg.qkv_bias) for i in range(cfg.n_layers)]
            self.final_norm = f.float32("model.norm.weight")           # f32 (hidden,)
            if cfg.tied_embeddings:
                self.lm_head = Linear(f, "model.embed_tokens.weight")
            else:
                self.lm_head = Linear(f, "lm_head.weight")
            # the lm_head the forward pass multiplies by: the stored one, or (fast) its int8 copy
            self._lm_head_fast: LmHeadI8 | None = None
            group = lm_head_group(self.lm_head.K)
            if self._fast and self.lm_head.kind != "INT4G" and group is not None:
                self._lm_head_fast = LmHeadI8(self.lm_head, group)
            if kv_dtype not in ("f32", "f16"):
                raise ValueError(f"kv_dtype must be 'f32' or 'f16', got {kv_dtype!r}")
            self._kv_dtype = np.float32 if kv_dtype == "f32" else np.float16
            # k_cache, v_cache: (n_layers, n_kv_heads, capacity, head_dim), capacity ≤ max_context (see _reserve)
            self.k_cache = self.v_cache = np.empty((cfg.n_layers, cfg.n_kv_heads, 0, cfg.head_dim), self._kv_dtype)
            self._pos = 0
            self._reserve(min(KV_INITIAL_POSITIONS, self.max_context))
            self._warmup()
        except BaseException:
            self.close()
            raise

    def _warmup(self) -> None:
        """JIT / cache-load every kernel variant this model uses (one of each weight kind), so TTFT excludes it."""
        lins = [self.lm_head] + [l for L in self.layers for l in (L.q, L.k, L.v, L.o, L.gate, L.up, L.down)]
        warmup_kernels({lin.kind for lin in lins})
        if self._fast:
            warmup_fast_kernels({l.group_size for l in lins if l.kind == "INT4G"},
                                None if self._lm_head_fast is None else self._lm_head_fast.group_size)
        if self._emb_dtype.name != "F32":
            self._embed(np.zeros(1, dtype=np.int32))

    # -- state ----------------------------------------------------------------------------------------
    @property
    def position(self) -> int:
        return self._pos

    def reset(self) -> None:
        self._pos = 0

    def poison(self) -> None:
        """Fill the KV cache with NaN (tests; every new allocation is filled already)."""
        self.k_cache.fill(np.nan)
        self.v_cache.fill(np.nan)

    @property
    def kv_capacity(self) -> int:
        """Positions the KV cache holds now (grows on demand up to max_context)."""
        return self.k_cache.shape[2]

    def _reserve(self, n: int) -> None:
        """Make the cache hold at least n ≤ max_context positions: double (at least), copy the positions in use,
        NaN everywhere else."""
        cap = self.kv_capacity
        if n <= cap:
            return
        new_cap = min(self.max_context, max(n, 2 * cap))
        cfg = self.config
        shape = (cfg.n_layers, cfg.n_kv_heads, new_cap, cfg.head_dim)
        k = np.full(shape, np.nan, dtype=self._kv_dtype)
        v = np.full(shape, np.nan, dtype=self._kv_dtype)
        k[:, :, :self._pos] = self.k_cache[:, :, :self._pos]
        v[:, :, :self._pos] = self.v_cache[:, :, :self._pos]
        self.k_cache, self.v_cache = k, v

    def close(self) -> None:
        f = getattr(self, "_file", None)
        if f is not None and self._own_file and hasattr(f, "close"):
            f.close()
        self._file = None

    def describe(self) -> str:
        dts = sorted({l.dtype.name for layer in getattr(self, "layers", []) for l in
                      (layer.q, layer.k, layer.v, layer.o, layer.gate, layer.up, layer.down)})
        head = self.lm_head.dtype.name if self._lm_head_fast is None else \
            f"int8 (from {self.lm_head.dtype.name}, group {self._lm_head_fast.group_size})"
        return (f"cpu (numpy+numba, {self.numerics} numerics), linear weights {'/'.join(dts)}, lm_head {head}, "
                f"kv {self.k_cache.dtype}, max_context {self.max_context}")

    # -- forward --------------------------------------------------------------------------------------
    def _embed(self, ids: np.ndarray) -> np.ndarray:
        T = ids.shape[0]
        if self._emb_dtype.name == "F32":
            return np.array(self._emb[ids], dtype=np.float32)
        out = np.full((T, self.config.hidden_size), np.nan, dtype=np.float32)   # (T, hidden)
        lut = F16_LUT if self._emb_dtype.name == "F16" else BF16_LUT
        rows_u16(self._emb.view(np.uint16), ids, lut, out)
        return out

    def _attention(self, q: np.ndarray, p0: int, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        """q: f32 (T, n_heads, hd) already rotated; k, v: f32 (G, p0+T, hd), the keys and values of positions
        [0, p0+T). → f32 (T, n_heads*hd)."""
        T, H, hd = q.shape
        out = np.full((T, H * hd), np.nan, dtype=np.float32)
        (attention if T == 1 else attention_prefill)(q, k, v, p0, out)
        return out

    def _norm(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        out = np.full_like(x, np.nan)
        rms_norm(x, w, self.config.rms_norm_eps, out)
        return out

    def _forward(self, ids: np.ndarray) -> np.ndarray:
        """Run ids at positions [pos, pos+T) (checked by the Backend edge: in range, within max_context); write the
        KV cache; return the final-normed hidden f32 (T, hidden)."""
        p0 = self._pos
        self._reserve(p0 + ids.shape[0])
        h = self._run(ids, p0, _ContiguousKv(self))
        self._pos = p0 + ids.shape[0]
        return h

    def _run(self, ids: np.ndarray, p0: int, kv) -> np.ndarray:
        """The forward pass of ids at positions [p0, p0+T) over the KV rows of `kv` (_ContiguousKv: this backend's
        one sequence; PagedKv: one sequence of a batch); returns the final-normed hidden f32 (T, hidden)."""
        if ids.shape[0] == 1:
            return self._layers(ids, p0, kv)
        with blas_single_threaded():         # the prompt's BLAS products run on the backend's workers, one each
            return self._layers(ids, p0, kv)

    def _layers(self, ids: np.ndarray, p0: int, kv) -> np.ndarray:
        cfg = self.config
        T = ids.shape[0]
        fast = self._fast
        H, G, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        cos, sin = cos_sin(self.inv_freq, self.rope_scaling, np.arange(p0, p0 + T))   # (T, hd) each
        x = self._embed(ids)                                                         # (T, hidden)
        for li, L in enumerate(self.layers):
            h = self._norm(x, L.in_norm)
            q, k, v = project((L.q, L.k, L.v), h, fast)
            q = apply_rope(q.reshape(T, H, hd), cos, sin)                            # (T, H, hd)
            k = apply_rope(k.reshape(T, G, hd), cos, sin)                            # (T, G, hd)
            kv.store(li, p0, k, v.reshape(T, G, hd))
            x += project((L.o,), self._attention(q, p0, *kv.load(li, p0 + T)), fast)[0]
            h = self._norm(x, L.post_norm)
            g, u = project((L.gate, L.up), h, fast)
            silu_mul(g, u, g)                                                        # g ← silu(gate) * up
            x += project((L.down,), g, fast)[0]
        return self._norm(x, self.final_norm)

    def _head(self, h: np.ndarray) -> np.ndarray:
        """Logits f32 (T, vocab_rows) of final-normed hidden rows h (T, hidden), with this backend's numerics."""
        if self._lm_head_fast is not None:
            return self._lm_head_fast(h)
        if self._fast:
            return np.concatenate([project((self.lm_head,), h[t:t + 1], True)[0] for t in range(h.shape[0])])
        return self.lm_head(h)

    def _prefill(self, ids: np.ndarray) -> np.ndarray:
        h = self._forward(ids)
        return self._head(h[-1:])[0]

    def _decode(self, token_id: int) -> np.ndarray:
        h = self._forward(np.array([token_id], dtype=np.int32))
        return self._head(h)[0]

    def _logits_all(self, ids: np.ndarray) -> np.ndarray:
        self.reset()
        return self._head(self._forward(ids))

    # -- many sequences ------------------------------------------------------------------------------
    def sequence_kv(self, n_pages: int) -> "PagedKv":
        """The KV store of the batched API: n_pages pages of KV_PAGE_TOKENS positions (see PagedKv)."""
        return PagedKv(self, n_pages)


class _ContiguousKv:
    """The single sequence's KV rows: backend.k_cache / v_cache (n_layers, G, capacity, hd), positions in order."""

    def __init__(self, be: CPUBackend):
        self.be = be

    def store(self, li: int, p0: int, k: np.ndarray, v: np.ndarray) -> None:
        """k, v: f32 (T, G, hd) of positions [p0, p0+T)."""
        T = k.shape[0]
        self.be.k_cache[li, :, p0:p0 + T] = k.transpose(1, 0, 2)
        self.be.v_cache[li, :, p0:p0 + T] = v.transpose(1, 0, 2)

    def load(self, li: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """f32 (G, n, hd) keys and values of positions [0, n) (views when the cache is f32)."""
        return (self.be.k_cache[li, :, :n].astype(np.float32, copy=False),
                self.be.v_cache[li, :, :n].astype(np.float32, copy=False))


class PagedKv(SequenceKv):
    """KV rows of many sequences in pages (nanoqwen_rt.kv_pool owns the page bookkeeping): k, v are f32
    (n_layers, n_pages, G, KV_PAGE_TOKENS, hd); a sequence's page table (SequencePages.pages) maps its position p
    to page pages[p // P], slot p % P. Pages are NaN when allocated and poisoned again when the pool hands one
    out, so a read of a row nobody wrote poisons the logits. The CPU oracle runs the sequences of a step one
    after another (forward is per sequence) with the same kernels as the single-sequence path; a prefix-cache
    hit reuses the cached pages' rows (shares_pages), so its prefill computes only the rest of the prompt."""

    shares_pages = True

    def __init__(self, be: CPUBackend, n_pages: int):
        cfg = be.config
        self.be = be
        self.page_tokens = KV_PAGE_TOKENS
        shape = (cfg.n_layers, int(n_pages), cfg.n_kv_heads, KV_PAGE_TOKENS, cfg.head_dim)
        self.k = np.full(shape, np.nan, dtype=np.float32)
        self.v = np.full(shape, np.nan, dtype=np.float32)
        self._pages = np.zeros(0, dtype=np.int64)     # the page table of the sequence being computed

    @staticmethod
    def page_bytes(config) -> int:
        """Bytes one page takes (keys and values, all layers)."""
        return 2 * config.n_layers * config.n_kv_heads * KV_PAGE_TOKENS * config.head_dim * 4

    def poison(self, pages) -> None:
        idx = np.asarray(pages, dtype=np.int64)
        self.k[:, idx] = np.nan
        self.v[:, idx] = np.nan

    def open(self, seq, capacity: int) -> None:
        """Nothing to set up: a sequence's rows live in the pages its page table lists."""

    def close(self, seq) -> None:
        """Nothing to free here: the pool takes the pages back."""

    def forward(self, seq, p0: int, ids: np.ndarray) -> np.ndarray:
        """Run ids (int32 (T,), checked) at positions [p0, p0+T) of `seq` (its page table covers them); return the
        float32 (vocab_rows,) logits after the last one."""
        self._pages = np.asarray(seq.pages, dtype=np.int64)
        h = self.be._run(ids, p0, self)
        return self.be._head(h[-1:])[0]

    def store(self, li: int, p0: int, k: np.ndarray, v: np.ndarray) -> None:
        pos = np.arange(p0, p0 + k.shape[0])
        pg, sl = self._pages[pos // KV_PAGE_TOKENS], pos % KV_PAGE_TOKENS
        self.k[li, pg, :, sl] = k                        # (T, G, hd) rows, one per position
        self.v[li, pg, :, sl] = v

    def load(self, li: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        used = self._pages[:-(-n // KV_PAGE_TOKENS)]
        G, hd = self.k.shape[2], self.k.shape[4]
        k = self.k[li, used].transpose(1, 0, 2, 3).reshape(G, -1, hd)[:, :n]       # (G, n, hd) gathered copy
        v = self.v[li, used].transpose(1, 0, 2, 3).reshape(G, -1, hd)[:, :n]
        return k, v
