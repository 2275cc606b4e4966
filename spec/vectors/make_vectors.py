#!/usr/bin/env python3
"""Deterministic generator of everything in spec/vectors/ (spec/vectors/README.md describes the files).

    python spec/vectors/make_vectors.py           # (re)write the golden vectors, decoded/ and corrupt/
    python spec/vectors/make_vectors.py --check   # regenerate into a temp dir, compare file sets and bytes

Tensor values come from a 64-bit LCG seeded with crc32c(name) (defined below; no numpy RNG, so another
implementation can reproduce them from the spec text). The <name>.json description states what a reader must
decode: config, every directory entry (offsets computed here from the spec's placement rule, independently of
nanoqwen_format's reader), CRCs of the payload bytes, the first values of every tensor, and the blobs.
decoded/<name>/ holds whole decoded tensors (computed here from the generated payloads, not read back), and
corrupt/ one corrupt file per validation rule (make_corrupt.py).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # repo root, for running from a clone
sys.path.insert(0, HERE)                                     # make_corrupt.py

from nanoqwen_format import (BlobKind, DType, ModelConfig, NanoqwenWriter, TensorSpec,  # noqa: E402
                             expected_tensors, pack_int4_reference, unpack_int4_reference)
from nanoqwen_format.constants import LAYOUT_INT4_ROWMAJOR_K8, LAYOUT_INT4_ROWMAJOR_K8_ASYM  # noqa: E402
from nanoqwen_format.crc import crc32c  # noqa: E402

LCG_MUL = 6364136223846793005
LCG_ADD = 1442695040888963407
N_FIRST = 4  # values per tensor recorded in the JSON
DECODED_DIR = "decoded"
CORRUPT_DIR = "corrupt"


def lcg_stream(seed: int, count: int) -> np.ndarray:
    """count outputs (uint32 values < 2^31) of x <- (x*LCG_MUL + LCG_ADD) mod 2^64, output x >> 33, x0 = seed."""
    out = np.empty(count, dtype=np.uint64)
    x = seed
    for i in range(count):
        x = (x * LCG_MUL + LCG_ADD) & 0xFFFFFFFFFFFFFFFF
        out[i] = x >> 33
    return out


def uniform(seed: int, count: int) -> np.ndarray:
    """float64 in [-1, 1): out / 2^30 - 1."""
    return lcg_stream(seed, count).astype(np.float64) / float(1 << 30) - 1.0


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits, round to nearest even (inputs finite)."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def make_payload(name: str, dtype: DType, shape, group_size: int, layout_id: int = LAYOUT_INT4_ROWMAJOR_K8):
    """Deterministic tensor data. Norm weights: 1 + 0.25*u; others: 0.5*u (u uniform in [-1, 1)).
    INT4G: codes u = lcg & 15 (seed crc32c(name)), scales = f16(0.01 + 0.045*(1+v)) with v from seed+1;
    layout 2 adds zero points z = lcg & 15 from seed+2."""
    seed = crc32c(name.encode("ascii"))
    count = int(np.prod(shape))
    if dtype == DType.INT4G:
        n, k = shape
        codes = (lcg_stream(seed, n * k) & np.uint64(15)).astype(np.uint8).reshape(n, k)
        v = uniform(seed + 1, n * (k // group_size))
        scales = (0.01 + 0.045 * (1.0 + v)).astype(np.float16).reshape(n, k // group_size)
        if layout_id == LAYOUT_INT4_ROWMAJOR_K8_ASYM:
            zeros = (lcg_stream(seed + 2, n * (k // group_size)) & np.uint64(15)).astype(np.uint8)
            return pack_int4_reference(codes), scales, zeros.reshape(n, k // group_size)
        return pack_int4_reference(codes), scales
    u = uniform(seed, count)
    vals = (1.0 + 0.25 * u) if "norm" in name else 0.5 * u
    vals = vals.reshape(shape)
    if dtype == DType.F32:
        return vals.astype(np.float32)
    if dtype == DType.F16:
        return vals.astype(np.float16)
    return f32_to_bf16_bits(vals.astype(np.float32))


# ----------------------------------------------------------------------------------------- the vectors
def _dtype_rule(rule):
    """rule: list of (substring, dtype name, group_size[, int4g layout id, default 1]); first match wins; the last
    entry should be ('', ...). Returns name -> (DType, group_size, layout_id)."""
    def f(name):
        for sub, dt, g, *layout in rule:
            if sub in name:
                dtype = DType[dt]
                return dtype, g, ((layout or [LAYOUT_INT4_ROWMAJOR_K8])[0] if dtype == DType.INT4G else 0)
        raise KeyError(name)
    return f


VECTORS = [
    {
        "name": "tiny_f16",
        "about": "qwen2, 1 layer, every tensor f16, q/k/v bias, untied lm_head, no blobs",
        "config": dict(arch="qwen2", n_layers=1, hidden_size=32, intermediate_size=64, n_heads=2, n_kv_heads=1,
                       head_dim=16, vocab_rows=40, max_positions=64, rope_theta=1000000.0,
                       rope_scaling_type="none", rope_scaling_factor=1.0, rope_original_max_positions=0,
                       rms_norm_eps=1e-6, tied_embeddings=False, qkv_bias=True, bos_token_id=-1,
                       eos_token_id=2, pad_token_id=1),
        "dtypes": [("", "F16", 0)],
        "blobs": [],
    },
    {
        "name": "tiny_int4_tied",
        "about": "llama, 1 layer, tied int4g g32 embeddings (qweight 1600 B + 64 B padding), attention int4g g32, "
                 "MLP int4g g64, norms f32",
        "config": dict(arch="llama", n_layers=1, hidden_size=64, intermediate_size=128, n_heads=4, n_kv_heads=2,
                       head_dim=16, vocab_rows=50, max_positions=128, rope_theta=500000.0,
                       rope_scaling_type="linear", rope_scaling_factor=2.0, rope_original_max_positions=0,
                       rms_norm_eps=1e-5, tied_embeddings=True, qkv_bias=False, bos_token_id=0,
                       eos_token_id=1, pad_token_id=-1),
        "dtypes": [("self_attn", "INT4G", 32), ("mlp", "INT4G", 64), ("embed", "INT4G", 32), ("", "F32", 0)],
        "blobs": [],
    },
    {
        "name": "tiny_blobs",
        "about": "qwen2, 2 layers, f32 + bf16, yarn rope scaling, all five blob kinds",
        "config": dict(arch="qwen2", n_layers=2, hidden_size=16, intermediate_size=32, n_heads=2, n_kv_heads=2,
                       head_dim=8, vocab_rows=24, max_positions=256, rope_theta=10000.0,
                       rope_scaling_type="yarn", rope_scaling_factor=4.0, rope_original_max_positions=64,
                       rms_norm_eps=1e-6, tied_embeddings=False, qkv_bias=True, bos_token_id=-1,
                       eos_token_id=23, pad_token_id=22),
        "dtypes": [("proj.weight", "BF16", 0), ("", "F32", 0)],
        "blobs": [
            ("TOKENIZER_JSON", '{"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}}}'),
            ("CHAT_TEMPLATE", "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"),
            ("GENERATION_CONFIG", '{"temperature": 0.7, "top_p": 0.8}'),
            ("PROVENANCE", '{"source": "spec/vectors/make_vectors.py", "note": "caf\u00e9 \u2615"}'),
            ("TOKENIZER_CONFIG", '{"eos_token": "<|im_end|>"}'),
        ],
    },
    {
        "name": "tiny_mixed",
        "about": "qwen2, 1 layer, every dtype: int4g g32 projections and lm_head (qweight 320 B + 64 B padding), "
                 "bf16 embeddings, f32 norms, f16 biases (k/v: 32 B + 96 B inter-item padding); 72 B of padding "
                 "after the directory; three blobs. The base of the corrupt vectors (corrupt/)",
        "config": dict(arch="qwen2", n_layers=1, hidden_size=32, intermediate_size=32, n_heads=2, n_kv_heads=1,
                       head_dim=16, vocab_rows=20, max_positions=64, rope_theta=1000000.0,
                       rope_scaling_type="none", rope_scaling_factor=1.0, rope_original_max_positions=0,
                       rms_norm_eps=1e-6, tied_embeddings=False, qkv_bias=True, bos_token_id=-1,
                       eos_token_id=2, pad_token_id=1),
        "dtypes": [("proj.weight", "INT4G", 32), ("lm_head", "INT4G", 32), ("embed", "BF16", 0),
                   ("norm", "F32", 0), ("", "F16", 0)],
        "blobs": [
            ("TOKENIZER_JSON", '{"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, '
                               '"merges": []}}'),
            ("PROVENANCE", '{"source": "spec/vectors/make_vectors.py", "scale": 1.5, "count": 12345678}'),
            ("CHAT_TEMPLATE", "{% for m in messages %}{{ m['content'] }}{% endfor %}"),
        ],
    },
    {
        "name": "tiny_int4_asym",
        "about": "qwen2, 1 layer, int4g layout 2 (asymmetric, zero points): q/k/v g32 (q_proj: qweight 512 B, "
                 "scales 64 B + 64 B padding, zeros 32 B), MLP gate/up g32, down g64, lm_head g32 (qweight 320 B "
                 "+ 64 B padding); o_proj int4g layout 1 g32 (layouts mix in one file); f16 embeddings and biases, "
                 "f32 norms. The base of the layout-2 corrupt vectors (corrupt/)",
        "config": dict(arch="qwen2", n_layers=1, hidden_size=32, intermediate_size=64, n_heads=2, n_kv_heads=1,
                       head_dim=16, vocab_rows=20, max_positions=64, rope_theta=1000000.0,
                       rope_scaling_type="none", rope_scaling_factor=1.0, rope_original_max_positions=0,
                       rms_norm_eps=1e-6, tied_embeddings=False, qkv_bias=True, bos_token_id=-1,
                       eos_token_id=2, pad_token_id=1),
        "dtypes": [("self_attn.q_proj.weight", "INT4G", 32, 2), ("self_attn.k_proj.weight", "INT4G", 32, 2),
                   ("self_attn.v_proj.weight", "INT4G", 32, 2), ("self_attn.o_proj.weight", "INT4G", 32, 1),
                   ("down_proj", "INT4G", 64, 2), ("mlp", "INT4G", 32, 2), ("lm_head", "INT4G", 32, 2), ("norm", "F32", 0), ("", "F16", 0)],
        "blobs": [],
    },
]

ENCODING = {"TOKENIZER_JSON": 1, "CHAT_TEMPLATE": 2, "GENERATION_CONFIG": 1, "PROVENANCE": 1, "TOKENIZER_CONFIG": 1}


def specs_of(v) -> list:
    cfg = ModelConfig(**v["config"])
    rule = _dtype_rule(v["dtypes"])
    out = []
    for name, shape in expected_tensors(cfg).items():
        dt, g, layout = rule(name)
        out.append(TensorSpec(name, dt, shape, group_size=g, layout_id=layout))
    return out


def build(v, path: str) -> None:
    """Write vector v to path with NanoqwenWriter."""
    cfg = ModelConfig(**v["config"])
    specs = specs_of(v)
    kinds = [BlobKind[k] for k, _ in v["blobs"]]
    with NanoqwenWriter(path, cfg, specs, kinds) as w:
        for s in specs:
            p = make_payload(s.name, s.dtype, s.shape, s.group_size, s.layout_id)
            if s.dtype == DType.INT4G:
                w.write_int4(s.name, *p)
            else:
                w.write_tensor(s.name, p)
        for kind, text in v["blobs"]:
            w.write_blob(BlobKind[kind], text.encode("utf-8"))


def _a128(n):
    return (n + 127) // 128 * 128


def decoded_tensors(v) -> dict:
    """{tensor name: {suffix: array}} of the tensors whose whole decoding is shipped: the first tensor of each
    (dtype, group_size, layout_id) in directory order. Plain dtypes: "f32", the values as float32 (f16 and bf16
    widened exactly); int4g: "f32", the dequantized values (§9.1 / §9.6), and "codes", the stored codes u (uint8
    0..15) in logical (n, k) order; layout 2 also "zeros", the zero points (uint8 (n, k/g)). Computed from the
    generated payloads, not read back from the file."""
    out, seen = {}, set()
    for s in specs_of(v):
        if (s.dtype, s.group_size, s.layout_id) in seen:
            continue
        seen.add((s.dtype, s.group_size, s.layout_id))
        p = make_payload(s.name, s.dtype, s.shape, s.group_size, s.layout_id)
        if s.dtype == DType.INT4G:
            codes = unpack_int4_reference(p[0])
            scales = np.repeat(p[1].astype(np.float32), s.group_size, axis=1)
            if s.layout_id == LAYOUT_INT4_ROWMAJOR_K8_ASYM:
                zeros = np.repeat(p[2].astype(np.float32), s.group_size, axis=1)
                out[s.name] = {"f32": scales * (codes.astype(np.float32) - zeros), "codes": codes, "zeros": p[2]}
            else:
                out[s.name] = {"f32": scales * (codes.astype(np.float32) - np.float32(8)), "codes": codes}
        elif s.dtype == DType.BF16:
            out[s.name] = {"f32": (p.astype(np.uint32) << np.uint32(16)).view(np.float32)}
        else:
            out[s.name] = {"f32": p.astype(np.float32)}
    return out


def decoded_path(vector_name: str, tensor_name: str, suffix: str) -> str:
    """Relative to spec/vectors/."""
    return f"{DECODED_DIR}/{vector_name}/{tensor_name}.{suffix}.npy"


def describe(v, path: str) -> dict:
    """The expected decoded description. Placement and item CRCs are computed here from the spec's rules and the
    payload bytes; only sha256 and header_crc32c are taken from the written file."""
    specs = specs_of(v)
    decoded = decoded_tensors(v)
    raw = open(path, "rb").read()
    n_t, n_b = len(specs), len(v["blobs"])
    header_size = 256 + 136 * n_t + 64 * n_b
    pos = _a128(header_size)
    data_offset = pos
    tensors = []
    for s in specs:
        p = make_payload(s.name, s.dtype, s.shape, s.group_size, s.layout_id)
        ent = {"name": s.name, "dtype": s.dtype.name, "shape": list(s.shape), "group_size": s.group_size,
               "layout_id": s.layout_id, "offset": pos}
        if s.dtype == DType.INT4G:
            n, k = s.shape
            qb = p[0].astype("<u4").tobytes()
            body = qb + bytes(_a128(len(qb)) - len(qb)) + p[1].astype("<f2").tobytes()
            ent["first_qweight_words"] = [f"{int(x):#010x}" for x in p[0].reshape(-1)[:2]]
            ent["first_scales"] = [float(x) for x in p[1].reshape(-1)[:N_FIRST]]
            ent["first_codes"] = [int(x) for x in unpack_int4_reference(p[0]).reshape(-1)[:16]]
            if s.layout_id == LAYOUT_INT4_ROWMAJOR_K8_ASYM:
                body += bytes(_a128(len(body)) - len(body)) + p[2].astype("u1").tobytes()
                ent["first_zeros"] = [int(x) for x in p[2].reshape(-1)[:N_FIRST]]
        else:
            body = p.astype({DType.F32: "<f4", DType.F16: "<f2", DType.BF16: "<u2"}[s.dtype]).tobytes()
            if s.dtype == DType.BF16:
                ent["first_bf16_bits"] = [f"{int(x):#06x}" for x in p.reshape(-1)[:N_FIRST]]
                first = p.reshape(-1)[:N_FIRST].astype(np.uint32) << np.uint32(16)
                ent["first_values"] = [float(x) for x in first.view(np.float32)]
            else:
                ent["first_values"] = [float(x) for x in p.reshape(-1)[:N_FIRST]]
        if s.name in decoded:
            ent["decoded"] = {suffix: decoded_path(v["name"], s.name, suffix) for suffix in decoded[s.name]}
        ent["nbytes"] = len(body)
        ent["crc32c"] = f"{crc32c(body):#010x}"
        tensors.append(ent)
        pos = _a128(pos + len(body))
    blobs = []
    for kind, text in v["blobs"]:
        b = text.encode("utf-8")
        blobs.append({"kind": kind, "kind_id": int(BlobKind[kind]), "encoding": ENCODING[kind], "offset": pos,
                      "nbytes": len(b), "crc32c": f"{crc32c(b):#010x}", "text": text})
        pos = _a128(pos + len(b))
    last_end = (blobs[-1]["offset"] + blobs[-1]["nbytes"]) if blobs else (tensors[-1]["offset"] +
                                                                        tensors[-1]["nbytes"])
    return {
        "name": v["name"], "about": v["about"], "file": v["name"] + ".nanoqwen",
        "sha256": hashlib.sha256(raw).hexdigest(),
        "header": {"magic": "NANOQWEN", "version": 1, "header_size": header_size, "file_size": last_end,
                   "data_offset": data_offset, "n_tensors": n_t, "n_blobs": n_b,
                   "header_crc32c": f"{int.from_bytes(raw[40:44], 'little'):#010x}", "flags": 0},
        "config": v["config"], "dtypes": v["dtypes"], "tensors": tensors, "blobs": blobs,
        "generator": "spec/vectors/make_vectors.py (LCG seeded with crc32c(name); see make_payload)",
    }


def write_all(out_dir: str) -> list:
    """Write every file of spec/vectors/ (but the scripts and README) under out_dir; returns their paths."""
    import make_corrupt   # spec/vectors/make_corrupt.py, beside this file
    for sub in (DECODED_DIR, CORRUPT_DIR):   # generated folders: nothing stale survives a regeneration
        shutil.rmtree(os.path.join(out_dir, sub), ignore_errors=True)
    written = []
    for v in VECTORS:
        path = os.path.join(out_dir, v["name"] + ".nanoqwen")
        build(v, path)
        desc = describe(v, path)
        jpath = os.path.join(out_dir, v["name"] + ".json")
        with open(jpath, "w", encoding="utf-8") as fh:
            json.dump(desc, fh, indent=1, ensure_ascii=False)
            fh.write("\n")
        written += [path, jpath]
        for tname, arrays in decoded_tensors(v).items():
            for suffix, arr in arrays.items():
                npy = os.path.join(out_dir, decoded_path(v["name"], tname, suffix))
                os.makedirs(os.path.dirname(npy), exist_ok=True)
                np.save(npy, np.ascontiguousarray(arr), allow_pickle=False)
                written.append(npy)
    written += make_corrupt.write_corpus(os.path.join(out_dir, CORRUPT_DIR),
                                         os.path.join(out_dir, make_corrupt.BASE_VECTOR + ".nanoqwen"))
    return written


GENERATOR_FILES = {"make_vectors.py", "make_corrupt.py", "README.md"}


def _tree(root: str) -> set:
    """Relative paths of every file under root but the generator scripts, README and caches."""
    out = set()
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x != "__pycache__"]
        for f in files:
            rel = os.path.relpath(os.path.join(d, f), root)
            if rel not in GENERATOR_FILES:
                out.add(rel)
    return out


def check(target: str = HERE) -> list:
    """Regenerate into a temp dir; returns the differences from target (missing, extra or differing files)."""
    problems = []
    with tempfile.TemporaryDirectory() as d:
        write_all(d)
        want, have = _tree(d), _tree(target)
        problems += [f"MISSING: {p}" for p in sorted(want - have)]
        problems += [f"EXTRA (not generated): {p}" for p in sorted(have - want)]
        for rel in sorted(want & have):
            with open(os.path.join(d, rel), "rb") as a, open(os.path.join(target, rel), "rb") as b:
                if a.read() != b.read():
                    problems.append(f"DIFFERS: {rel}")
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="regenerate into a temp dir and compare with spec/vectors")
    args = ap.parse_args(argv)
    if not args.check:
        for p in write_all(HERE):
            print(os.path.relpath(p, HERE))
        return 0
    problems = check()
    for p in problems:
        print(p, file=sys.stderr)
    print("ok" if not problems else f"{len(problems)} differences")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
