"""`nanoqwen bench FILE`: bandwidth ceilings, load / TTFT / decode of an Engine, bytes per token, MBU, and the
torch peers (nanoqwen_bench.peers) in the same process.

    result = run_bench("model.nanoqwen", prompt_tokens=512, new_tokens=128, peers=True)   # -> dict (JSON-able)
    print(format_table(result))

Everything GPU-side is timed with CUDA events (or host clocks after a synchronising call), after a warm-up,
as the median of several repeats; buffers are several times the 60 MB L2 of an H200 so no number is a cache
number. torch is needed for the bandwidth and peer measurements (it is imported lazily: the rest of nanoqwen
does not depend on it); the decode measurement needs only the Engine.

Definitions (the table and RESULTS.md use them):
* copy_GBps: device-to-device copy, bytes read + bytes written / time.
* read_GBps: read-only stream over >= 4 GiB, bytes read / time: the decode ceiling, since decode reads weights
  and writes almost nothing. Probe: nq_bench_read_bandwidth of the testing library (libnanoqwen_testing.so: 16-byte
  non-allocating loads, many in flight) when it is built; else the best of two torch reductions, which reads
  ~3 % below what a kernel can, so it flatters MBU. `read_probe` names the probe used (and why, for the fallback).
* bytes_per_token: every tensor of the file read once per decode step (all linear weights incl. their int4
  scales, norms, biases, lm_head) + one embedding row + the fp16 K and V of every cached position, at the mean
  context of the measured decode steps.
* mbu: bytes_per_token / (ms_per_token) / read_GBps;  mbu_vs_copy: the same over copy_GBps.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping

import numpy as np

from nanoqwen_format.shapes import QWEN25_SHAPES

from .timing import BenchError, gemv_shapes, gpu_name, summary, time_cuda_ms, torch_cuda

__all__ = ["BenchError", "QWEN25_CODER_7B", "KV_BYTES_PER_ELEMENT", "gemv_shapes", "bytes_per_token",
           "measure_bandwidth", "library_read_bandwidth", "measure_engine", "run_bench", "format_table", "main"]


#: Qwen2.5-Coder-7B(-Instruct) hyper-parameters, as nanoqwen_format.ModelConfig keyword arguments
#: (bench/make_7b_file.py and bench/peers.py use it). The shape fields come from the one Qwen2.5 shape table,
#: nanoqwen_format.shapes.QWEN25_SHAPES; the rest (RoPE, token ids, context) are the 7B's config.json values.
_7B = QWEN25_SHAPES["7B"]
QWEN25_CODER_7B = dict(
    arch="qwen2", n_layers=_7B.n_layers, hidden_size=_7B.hidden, intermediate_size=_7B.intermediate,
    n_heads=_7B.n_heads, n_kv_heads=_7B.n_kv_heads, head_dim=_7B.head_dim, vocab_rows=_7B.vocab,
    max_positions=32768, rope_theta=1_000_000.0, rope_scaling_type="none", rope_scaling_factor=1.0,
    rope_original_max_positions=0, rms_norm_eps=1e-6, tied_embeddings=_7B.tied, qkv_bias=True,
    bos_token_id=151643, eos_token_id=151645, pad_token_id=151643)

#: the paged KV cache holds fp16 K and V (csrc, issue 5)
KV_BYTES_PER_ELEMENT = 2

#: default size of each bandwidth buffer: 4 GiB, ~70x the H200's 60 MB L2
BANDWIDTH_BYTES = 4 << 30


# -- bytes ---------------------------------------------------------------------------------------------------
EMBED_NAME = "model.embed_tokens.weight"


def bytes_per_token(tensor_nbytes: Mapping[str, int], cfg, context: float) -> dict:
    """Bytes one decode step reads from device memory, from the file's tensor sizes.

    tensor_nbytes: {name: nbytes} of every tensor of the file. context: number of cached positions the step's
    attention reads (K and V of each, every layer, fp16). Every tensor is read once, except the embedding
    matrix, of which one row is read — unless the embeddings are tied, when it is also the lm_head and read whole.
    Returns {"weights", "embed_row", "kv", "total"} in bytes (ints; kv rounded).
    """
    if EMBED_NAME not in tensor_nbytes:
        raise BenchError(f"the file has no {EMBED_NAME}")
    if context < 0:
        raise BenchError(f"context must be >= 0, got {context}")
    emb = int(tensor_nbytes[EMBED_NAME])
    weights = sum(int(n) for name, n in tensor_nbytes.items() if name != EMBED_NAME)
    if cfg.tied_embeddings:
        weights += emb
        embed_row = 0
    else:
        embed_row = emb // cfg.vocab_rows
    kv_per_position = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * KV_BYTES_PER_ELEMENT   # K and V
    kv = int(round(kv_per_position * context))
    return {"weights": weights, "embed_row": embed_row, "kv": kv, "total": weights + embed_row + kv}


def mean_decode_context(prompt_tokens: int, new_tokens: int) -> float:
    """Mean number of positions attended by the decode steps measured after a prompt of prompt_tokens.

    Token t (t = 1..new_tokens) is decoded at position prompt_tokens + t - 1 and attends to prompt_tokens + t
    positions (itself included); the mean over t is prompt_tokens + (new_tokens + 1) / 2.
    """
    return prompt_tokens + (new_tokens + 1) / 2


# -- bandwidth ceilings ------------------------------------------------------------------------------------
#: the testing library's read-bandwidth probe: int nq_bench_read_bandwidth(uint64_t bytes, int32_t iters, float* gbps)
READ_PROBE_SYMBOL = "nq_bench_read_bandwidth"


def testing_library_path() -> Path:
    """$NANOQWEN_TESTING_LIB, else build/lib/libnanoqwen_testing.so of this checkout (scripts/build_native.sh)."""
    env = os.environ.get("NANOQWEN_TESTING_LIB")
    return Path(env) if env else Path(__file__).resolve().parents[1] / "build" / "lib" / "libnanoqwen_testing.so"


def library_read_bandwidth(nbytes: int, iters: int) -> tuple[float | None, str]:
    """(GB/s, probe description) from the testing library's nq_bench_read_bandwidth, or (None, why it could not
    be used): the library absent, not loadable, without the symbol, or the call failed (its message)."""
    path = testing_library_path()
    if not path.is_file():
        return None, f"testing library not found at {path}"
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        return None, f"cannot load {path}: {e}"
    fn = getattr(lib, READ_PROBE_SYMBOL, None)
    if fn is None:
        return None, f"{path} has no {READ_PROBE_SYMBOL}"
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_uint64, ctypes.c_int32, ctypes.POINTER(ctypes.c_float)]
    gbps = ctypes.c_float(float("nan"))                      # poisoned: the call must write it
    rc = fn(int(nbytes), int(iters), ctypes.byref(gbps))
    if rc != 0:
        err = getattr(lib, "nq_last_error", None)
        msg = ""
        if err is not None:
            err.restype = ctypes.c_char_p
            raw = err()                                      # same thread as the failing call
            msg = raw.decode("utf-8", "replace") if raw else ""
        return None, f"{READ_PROBE_SYMBOL} failed (status {rc}): {msg or 'no message'}"
    if not (np.isfinite(gbps.value) and gbps.value > 0):
        return None, f"{READ_PROBE_SYMBOL} returned {gbps.value} GB/s"
    return float(gbps.value), f"{READ_PROBE_SYMBOL} ({path.name})"


def measure_bandwidth(nbytes: int = BANDWIDTH_BYTES, reps: int = 20) -> dict:
    """Device-to-device copy and read-only stream bandwidths, GB/s (1e9 bytes/s), on buffers of nbytes.

    copy_GBps counts bytes read + bytes written (torch copy). read_GBps: the fastest read-only stream of this run:
    the testing library's probe when it is built, and two torch read-only reductions (torch.sum over float32,
    torch.amax over float16); read_probe says which won, and for the fallback why. Data are random (never zeros).
    """
    torch = torch_cuda()
    n32 = nbytes // 4
    src = torch.randn(n32, dtype=torch.float32, device="cuda")            # (n32,) f32, nbytes
    dst = torch.empty_like(src)
    copy_ms = time_cuda_ms(lambda: dst.copy_(src), reps)
    if not torch.equal(dst[:1 << 20], src[:1 << 20]):
        raise BenchError("device copy produced wrong data")
    del dst
    sum_ms = time_cuda_ms(lambda: torch.sum(src), reps)
    h = src.view(torch.float16)                                            # (2*n32,) f16 view, same bytes
    amax_ms = time_cuda_ms(lambda: torch.amax(h), reps)
    ref = float(src[: 1 << 20].double().sum())                             # sanity: the reduction is real
    got = float(torch.sum(src[: 1 << 20]))
    if not np.isfinite(got) or abs(got - ref) > 1e-3 * (1 + abs(ref)) + 1e-2:  # f32 sum of 1M N(0,1): |err|<<1e-2
        raise BenchError(f"torch.sum check failed: {got} vs {ref}")
    del src, h
    torch.cuda.empty_cache()
    b = float(n32 * 4)
    copy = 2 * b / (statistics.median(copy_ms) * 1e-3) / 1e9
    rsum = b / (statistics.median(sum_ms) * 1e-3) / 1e9
    ramax = b / (statistics.median(amax_ms) * 1e-3) / 1e9
    out = {"nbytes": int(b), "copy_GBps": copy, "read_sum_f32_GBps": rsum, "read_amax_f16_GBps": ramax,
           "copy_ms": summary(copy_ms), "sum_ms": summary(sum_ms), "amax_ms": summary(amax_ms)}
    lib_gbps, probe = library_read_bandwidth(int(b), reps)
    if lib_gbps is not None:
        # the ceiling is the fastest read-only stream measured in this run, whichever probe that was
        fastest = max((lib_gbps, probe), (rsum, "torch sum f32"), (ramax, "torch amax f16"))
        out.update(read_GBps=fastest[0], read_library_GBps=lib_gbps,
                   read_probe=fastest[1] if fastest[1] == probe else f"{fastest[1]} (faster than {probe} this run)")
    else:
        out.update(read_GBps=max(rsum, ramax),
                   read_probe=f"torch sum f32 / amax f16 (fallback: {probe}; flatters MBU by ~3 %)")
    return out


# -- the engine ----------------------------------------------------------------------------------------------
def _warm_page_cache(path: str, chunk: int = 64 << 20) -> float:
    """Read the whole file once (so the load is timed from the page cache, as the target says). Seconds."""
    t = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(chunk)
        while f.readinto(buf):
            pass
    return time.perf_counter() - t


def measure_engine(path: str, prompt_tokens: int = 512, new_tokens: int = 128, repeats: int = 3,
                   device: str = "cuda", seed: int = 0) -> dict:
    """Load time, TTFT and decode speed of Engine(path, device) on a prompt of prompt_tokens random ids.

    load_s: Engine construction with checksums off, file in the page cache (open_verify_s: open_file with
    checksums on, separately). Each repeat runs backend.generate_ids greedily for new_tokens + 1 tokens with no
    stop ids: ttft = call → first token; ms_per_token = (last token - first token) / new_tokens. One warm-up
    generation first (graph capture etc.). Medians over repeats; `deterministic` = every repeat produced the
    same greedy tokens.
    """
    from nanoqwen_format import open_file

    from nanoqwen_rt.engine import Engine
    from nanoqwen_rt.sampling import SamplingParams

    if prompt_tokens < 1 or new_tokens < 1 or repeats < 1:
        raise BenchError("prompt_tokens, new_tokens and repeats must be >= 1")
    out: dict = {"path": os.path.abspath(path), "file_size": os.path.getsize(path)}
    out["page_cache_read_s"] = _warm_page_cache(path)
    t = time.perf_counter()
    with open_file(path, verify_checksums=True) as f:
        out["open_verify_s"] = time.perf_counter() - t
        cfg = f.config
        nbytes = {name: info.nbytes for name, info in f.tensors.items()}
    max_context = prompt_tokens + new_tokens + 1
    if max_context > cfg.max_positions:
        raise BenchError(f"prompt_tokens + new_tokens + 1 = {max_context} exceeds max_positions {cfg.max_positions}")
    t = time.perf_counter()
    eng = Engine(path, device=device, max_context=max_context, verify_checksums=False)
    out["load_s"] = time.perf_counter() - t
    try:
        be = eng.backend
        out["backend"] = be.describe()
        rng = np.random.default_rng(seed)
        # ids below Qwen2's first special id (151643) on a Qwen vocabulary; eos is no stop here (stop ids = ())
        hi = min(cfg.vocab_rows, 151643)
        ids = rng.integers(0, hi, size=prompt_tokens, dtype=np.int64).astype(np.int32)   # (prompt_tokens,)
        greedy = SamplingParams(temperature=0.0)
        list(be.generate_ids(ids[: min(16, prompt_tokens)], greedy, 4, ()))             # warm-up
        list(be.generate_ids(ids, greedy, 8, ()))
        ttfts, per_tok, token_runs = [], [], []
        for _ in range(repeats):
            toks, stamps = [], []
            t0 = time.perf_counter()
            for tok in be.generate_ids(ids, greedy, new_tokens + 1, ()):
                stamps.append(time.perf_counter())
                toks.append(int(tok))
            if len(toks) != new_tokens + 1:
                raise BenchError(f"generate_ids yielded {len(toks)} tokens, expected {new_tokens + 1}")
            ttfts.append(stamps[0] - t0)
            per_tok.append((stamps[-1] - stamps[0]) / new_tokens)
            token_runs.append(toks)
        ms = statistics.median(per_tok) * 1e3
        out.update({
            "prompt_tokens": prompt_tokens, "new_tokens": new_tokens, "repeats": repeats,
            "ttft_ms": statistics.median(ttfts) * 1e3, "ttft_ms_all": [x * 1e3 for x in ttfts],
            "ms_per_token": ms, "ms_per_token_all": [x * 1e3 for x in per_tok],
            "tokens_per_s": 1e3 / ms, "deterministic": all(r == token_runs[0] for r in token_runs),
            "distinct_tokens": len(set(token_runs[0])), "first_tokens": token_runs[0][:8]})
    finally:
        eng.close()
    ctx = mean_decode_context(prompt_tokens, new_tokens)
    out["mean_context"] = ctx
    out["bytes_per_token"] = bytes_per_token(nbytes, cfg, ctx)
    out["config"] = cfg.to_dict()
    return out


# -- everything ------------------------------------------------------------------------------------------
def _git_commit() -> str:
    """$NANOQWEN_COMMIT when set (a copied tree, e.g. on a lent GPU machine, whose .git may be stale or absent:
    bench/gpu_check.sh sets it from .commit); else the short HEAD of the checkout this module lives in; else
    "unknown"."""
    env = os.environ.get("NANOQWEN_COMMIT")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        r = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                           timeout=5)
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def run_bench(path, prompt_tokens: int = 512, new_tokens: int = 128, peers: bool = True,
              device: str = "auto", repeats: int = 3) -> dict:
    """The whole `nanoqwen bench FILE` measurement as a JSON-able dict (see the module docstring).

    Order: bandwidth ceilings, torch peers on the file's shapes (their memory freed), then the Engine. Without
    torch/CUDA the ceilings and peers are skipped (the reason is under "skipped") and no MBU is computed; the
    Engine part still runs on whatever backend `device` selects.
    """
    from nanoqwen_format import open_file

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise BenchError(f"no such file: {path}")
    res: dict = {"gpu": gpu_name(), "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
                 "commit": _git_commit(), "skipped": {}}
    try:
        res["bandwidth"] = measure_bandwidth()
    except BenchError as e:
        res["skipped"]["bandwidth"] = str(e)
    if peers and "bandwidth" in res:
        from .peers import run_peers
        with open_file(path, verify_checksums=False) as f:
            cfg = f.config
        res["peers"] = run_peers(cfg, prompt_tokens=prompt_tokens)
    elif peers:
        res["skipped"]["peers"] = res["skipped"]["bandwidth"]
    eng = measure_engine(path, prompt_tokens, new_tokens, repeats=repeats, device=device)
    bpt = eng["bytes_per_token"]["total"]
    s = eng["ms_per_token"] * 1e-3
    eng["achieved_GBps"] = bpt / s / 1e9
    bw = res.get("bandwidth")
    if bw:
        eng["mbu"] = bpt / s / (bw["read_GBps"] * 1e9)
        eng["mbu_vs_copy"] = bpt / s / (bw["copy_GBps"] * 1e9)
        eng["floor_ms_per_token"] = bpt / (bw["read_GBps"] * 1e9) * 1e3
    res["engine"] = eng
    return res


def format_table(result: Mapping) -> str:
    """A short human table of a run_bench (or a peers-only) result."""
    rows: list[tuple[str, str]] = []
    rows.append(("GPU", f"{result.get('gpu', '?')}  ({result.get('date_utc', '?')}, "
                        f"commit {result.get('commit', '?')})"))
    bw = result.get("bandwidth")
    if bw:
        rows.append(("copy bandwidth (read+write)", f"{bw['copy_GBps']:.0f} GB/s"))
        rows.append(("read-only bandwidth", f"{bw['read_GBps']:.0f} GB/s  (probe: {bw.get('read_probe', '?')}; "
                                            f"torch sum f32 {bw['read_sum_f32_GBps']:.0f}, "
                                            f"amax f16 {bw['read_amax_f16_GBps']:.0f})"))
    eng = result.get("engine")
    if eng:
        b = eng["bytes_per_token"]
        rows += [
            ("file", f"{eng['path']}  ({eng['file_size'] / 1e9:.2f} GB, backend {eng.get('backend', '?')})"),
            ("load (page cache -> device)", f"{eng['load_s'] * 1e3:.0f} ms  "
                                            f"(open+verify CRCs {eng['open_verify_s'] * 1e3:.0f} ms)"),
            (f"TTFT ({eng['prompt_tokens']}-token prompt)", f"{eng['ttft_ms']:.1f} ms"),
            (f"decode ({eng['new_tokens']} greedy tokens)", f"{eng['ms_per_token']:.3f} ms/token = "
                                                           f"{eng['tokens_per_s']:.1f} tokens/s"),
            ("bytes read per token", f"{b['total'] / 1e9:.3f} GB  (weights {b['weights'] / 1e9:.3f}, "
                                     f"KV {b['kv'] / 1e6:.1f} MB at context {eng['mean_context']:.1f})"),
        ]
        if "mbu" in eng:
            rows.append(("MBU (vs read-only / vs copy)", f"{eng['mbu'] * 100:.1f}% / {eng['mbu_vs_copy'] * 100:.1f}%  "
                                                         f"(floor {eng['floor_ms_per_token']:.3f} ms/token)"))
        rows.append(("greedy tokens identical across repeats", f"{eng['deterministic']}  "
                                                               f"({eng.get('distinct_tokens', '?')} distinct "
                                                               f"of {eng['new_tokens'] + 1})"))
    peers = result.get("peers")
    if peers:
        for key, label in (("torch_int4", "torch int4 chain (_weight_int4pack_mm, int4 lm_head)"),
                           ("torch_int4_f16_lm_head", "torch int4 chain, fp16 lm_head"),
                           ("cublas_fp16", "cuBLAS fp16 chain (F.linear)")):
            p = peers.get(key)
            if p:
                rows.append((label, f"{p['median_ms']:.3f} ms  ({p['GBps']:.0f} GB/s over {p['bytes'] / 1e9:.2f} GB, "
                                    f"{p['n_gemv']} GEMVs, CUDA graph)"))
        p = peers.get("cublas_bf16_prefill")
        if p:
            rows.append((f"cuBLAS bf16 prefill GEMMs ({p['prompt_tokens']} tokens)",
                         f"{p['median_ms']:.2f} ms  ({p['TFLOPs']:.0f} TFLOP/s; {p['n_gemv']} GEMMs, no attention, "
                         f"CUDA graph)"))
        if "int4_check_rel_err" in peers:
            rows.append(("torch int4 check vs dequantized fp32", f"rel err {peers['int4_check_rel_err']:.2e}"))
    for what, why in (result.get("skipped") or {}).items():
        rows.append((f"{what}: skipped", why))
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(w)}  {v}" for k, v in rows)


def write_json_atomic(path: str, obj) -> None:
    """Write obj as JSON beside the target, then rename: a reader never sees half a file, a failure leaves none."""
    import tempfile
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(obj, indent=1, default=str) + "\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def main(argv: list[str] | None = None) -> int:
    """python -m nanoqwen_bench FILE [--json OUT] [--prompt-tokens N] [--new-tokens N] [--no-peers]."""
    ap = argparse.ArgumentParser(prog="nanoqwen-bench", description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    ap.add_argument("--json", help="also write the result dict here")
    ap.add_argument("--plot", help="also draw the run's figures here (.png/.svg/.pdf; needs matplotlib)")
    a = ap.parse_args(argv)
    from nanoqwen_format import NanoqwenFormatError

    from nanoqwen_rt.engine import EngineError
    from .plot import check_output_path, plot, require_matplotlib
    try:
        if a.plot:            # before the run: a missing matplotlib or a bad path should not cost a whole bench
            check_output_path(a.plot)
            require_matplotlib()
        res = run_bench(a.file, a.prompt_tokens, a.new_tokens, peers=not a.no_peers, device=a.device,
                        repeats=a.repeats)
    except (BenchError, EngineError, NanoqwenFormatError) as e:
        print(f"nanoqwen bench: {e}", file=sys.stderr)
        return 2
    if a.json:
        write_json_atomic(a.json, res)
    print(format_table(res))
    if a.plot:                # after the table and the JSON: a plotting failure loses no measurement
        try:
            plot(res, a.plot)
        except BenchError as e:
            print(f"nanoqwen bench: {e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
