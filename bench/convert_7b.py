#!/usr/bin/env python3
"""Synthesize a full-size Qwen2.5-Coder-7B-Instruct-shaped bf16 Hugging Face checkpoint (random weights, real
Qwen2 tokenizer) and, with --convert, time `nanoqwen-convert` on it (wall time, peak RSS of the converter).

    python3 bench/convert_7b.py [--dir /tmp/nanoqwen-7b] [--layers 28] [--convert] [--mode rtn] [--keep]
                               [--threads N] [--json results.json]

* config.json: identical to Qwen2.5-Coder-7B-Instruct's (hidden 3584, intermediate 18944, 28 layers, 28 heads,
  4 kv heads, vocab 152064, rope_theta 1e6, max_position_embeddings 32768, rms 1e-6, untied, q/k/v biases).
* weights: 4 bf16 shards + model.safetensors.index.json (~15.2 GB), streamed in row blocks: nothing near the
  size of a tensor is held in memory. Values are windows of a fixed pool of 64 Mi bf16 normals (std 0.02 for
  matrices, 1 + 0.1 z for norms, 0.1 z for biases) at random offsets — generation costs a memcpy, not an RNG.
* tokenizer.json built from vocab.json + merges.txt (+ added_tokens.json) of /work/shared/qwen2-tokenizer or
  bench/assets/qwen2-tokenizer with `tokenizers` (Qwen2's pre-tokenizer regex, byte-level), tokenizer_config.json
  and generation_config.json copied.
Needs only numpy + tokenizers for the synthesis (runs on the GPU machine too); --convert needs the nanoqwen
package (numba, click, tqdm, crc32c, safetensors). The checkpoint and the output are deleted unless --keep.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from synth import SafetensorsStreamWriter, f32_to_bf16_bits, qwen2_bpe_tokenizer, tensor_shapes  # noqa: E402

QWEN25_CODER_7B_INSTRUCT_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "hidden_size": 3584,
    "initializer_range": 0.02,
    "intermediate_size": 18944,
    "max_position_embeddings": 32768,
    "max_window_layers": 28,
    "model_type": "qwen2",
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "sliding_window": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.43.1",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 152064,
}
TOKENIZER_DIRS = [Path("/work/shared/qwen2-tokenizer"), ROOT / "bench" / "assets" / "qwen2-tokenizer"]
POOL = 64 * 1024 * 1024           # bf16 values in the random pool (128 MiB)
BLOCK = 16 * 1024 * 1024          # values written per block
N_SHARDS = 4


def find_tokenizer_dir() -> Path:
    for d in TOKENIZER_DIRS:
        if (d / "vocab.json").exists() and (d / "merges.txt").exists():
            return d
    raise SystemExit(f"no Qwen2 tokenizer found in {[str(d) for d in TOKENIZER_DIRS]}")


def build_tokenizer_json(tok_dir: Path) -> str:
    """tokenizer.json equivalent to Qwen2's, from the slow-tokenizer files."""
    from tokenizers import AddedToken
    tok = qwen2_bpe_tokenizer(tok_dir)
    added = {}
    if (tok_dir / "added_tokens.json").exists():
        added = json.loads((tok_dir / "added_tokens.json").read_text())
    for content, idx in sorted(added.items(), key=lambda kv: kv[1]):
        tok.add_special_tokens([AddedToken(content, special=True, normalized=False)])
        got = tok.token_to_id(content)
        if got != idx:
            raise SystemExit(f"added token {content!r}: expected id {idx}, got {got}")
    return tok.to_str()


def synthesize(d: Path, n_layers: int, seed: int = 0) -> float:
    """Write the checkpoint into d; returns seconds taken."""
    t0 = time.perf_counter()
    d.mkdir(parents=True, exist_ok=True)
    cfg = dict(QWEN25_CODER_7B_INSTRUCT_CONFIG, num_hidden_layers=n_layers, max_window_layers=n_layers)
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
    tok_dir = find_tokenizer_dir()
    (d / "tokenizer.json").write_text(build_tokenizer_json(tok_dir))
    for f in ("tokenizer_config.json", "generation_config.json"):
        if (tok_dir / f).exists():
            shutil.copy(tok_dir / f, d / f)
    shapes = tensor_shapes(hidden=cfg["hidden_size"], intermediate=cfg["intermediate_size"], n_layers=n_layers,
                           n_heads=cfg["num_attention_heads"], n_kv_heads=cfg["num_key_value_heads"],
                           vocab=cfg["vocab_size"], tied=False, qkv_bias=True)
    rng = np.random.default_rng(seed)
    z = rng.standard_normal(POOL, dtype=np.float32)                       # (POOL,) N(0, 1)
    pools = {"w": f32_to_bf16_bits(0.02 * z), "norm": f32_to_bf16_bits(1 + 0.1 * z),
             "bias": f32_to_bf16_bits(0.1 * z)}                            # (POOL,) bf16 bits each
    del z
    sizes = [int(np.prod(s)) * 2 for _, s in shapes]
    total = sum(sizes)
    # split into N_SHARDS files of about equal size, in state-dict order, like HF's save_pretrained
    bounds, acc, k = [0], 0, 1
    for i, n in enumerate(sizes):
        acc += n
        if k < N_SHARDS and acc >= total * k / N_SHARDS:
            bounds.append(i + 1)
            k += 1
    bounds.append(len(shapes))
    bounds = sorted(set(bounds))
    n_files = len(bounds) - 1
    weight_map = {}
    for fi in range(n_files):
        fname = f"model-{fi + 1:05d}-of-{n_files:05d}.safetensors"
        group = shapes[bounds[fi]:bounds[fi + 1]]
        with SafetensorsStreamWriter(d / fname, [(nm, "bf16", sh) for nm, sh in group]) as w:
            for nm, sh in group:
                pool = pools["norm"] if nm.endswith("norm.weight") else pools["bias"] if nm.endswith(".bias") \
                    else pools["w"]
                left = int(np.prod(sh))
                while left:
                    n = min(left, BLOCK)
                    off = int(rng.integers(0, POOL - n + 1))
                    w.write_part(pool[off:off + n])
                    left -= n
                weight_map[nm] = fname
        print(f"  wrote {fname}", file=sys.stderr)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (d / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return time.perf_counter() - t0


# Runs the converter CLI and records the child's own peak RSS (VmHWM of its address space). ru_maxrss is not used:
# Linux carries the pre-exec image's peak (the forking parent's, under vfork) into the child's ru_maxrss.
_CHILD = """
import os, sys
from nanoqwen_quant.convert import main
try:
    main(sys.argv[1:])
finally:
    with open('/proc/self/status') as st:
        hwm = next(line.split()[1] for line in st if line.startswith('VmHWM'))
    with open(os.environ['NQ_HWM_FILE'], 'w') as fh:
        fh.write(hwm)
"""


def run_convert(d: Path, out: Path, mode: str, threads: int | None) -> dict:
    """Run nanoqwen-convert in a child process; wall time and the child's peak RSS."""
    hwm_file = Path(f"{out}.hwm")
    cmd = [sys.executable, "-c", _CHILD, str(d), "-o", str(out), "--force", "--mode", mode, "--quiet"]
    if threads:
        cmd += ["--threads", str(threads)]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               NQ_HWM_FILE=str(hwm_file))
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"nanoqwen-convert failed with exit {r.returncode}")
    peak_kib = int(hwm_file.read_text())
    hwm_file.unlink()
    return {"convert_wall_s": round(wall, 2), "convert_peak_rss_gb": round(peak_kib * 1024 / 1e9, 3),
            "output_gb": round(out.stat().st_size / 1e9, 3), "mode": mode}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/tmp/nanoqwen-7b", help="where the checkpoint goes")
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--convert", action="store_true", help="also time nanoqwen-convert on it")
    ap.add_argument("--out", default=None, help="output .nanoqwen (default DIR.nanoqwen)")
    ap.add_argument("--mode", choices=["rtn", "mse"], default="rtn")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--keep", action="store_true", help="keep the checkpoint and the output")
    ap.add_argument("--json", default=None, help="write the measurements here")
    a = ap.parse_args()
    d = Path(a.dir)
    out = Path(a.out or f"{d}.nanoqwen")
    res: dict = {"layers": a.layers}
    try:
        if not (d / "model.safetensors.index.json").exists():
            res["synth_s"] = round(synthesize(d, a.layers), 1)
        res["checkpoint_gb"] = round(sum(p.stat().st_size for p in d.glob("*.safetensors")) / 1e9, 3)
        if a.convert:
            res.update(run_convert(d, out, a.mode, a.threads))
        res["cpu_count"] = os.cpu_count()
        print(json.dumps(res, indent=1))
        if a.json:
            Path(a.json).write_text(json.dumps(res, indent=1))
    finally:
        if not a.keep:
            shutil.rmtree(d, ignore_errors=True)
            if out.exists():
                out.unlink()


if __name__ == "__main__":
    main()
