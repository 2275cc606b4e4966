"""Tiny synthetic Hugging Face checkpoints (Qwen2 / Llama) for tests, written with numpy + json only.

`make_checkpoint(path, ...)` writes a directory that `transformers.Qwen2ForCausalLM.from_pretrained` (or
`LlamaForCausalLM`) loads: config.json, model.safetensors (or shards + model.safetensors.index.json),
tokenizer.json (a small byte-level BPE trained with `tokenizers`), tokenizer_config.json with a ChatML chat
template like Qwen's, generation_config.json.

The safetensors files are written by a tiny streaming writer of our own (`SafetensorsStreamWriter`) because
numpy has no bfloat16: bf16 tensors are given as float32 and rounded to bf16 bits (round-to-nearest-even) here.
The same writer streams the 7B-shaped benchmark checkpoint (bench/convert_7b.py) one tensor at a time.
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

# ---------------------------------------------------------------- dtypes
SAFETENSORS_DTYPE = {"bf16": "BF16", "f16": "F16", "f32": "F32"}
TORCH_DTYPE_NAME = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}
ITEMSIZE = {"bf16": 2, "f16": 2, "f32": 4}

# Qwen's ChatML template (the one Qwen2.5 ships, minus tool calling: system default + im_start/im_end turns).
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if loop.first and message['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# The pre-tokenizer split regex of Qwen2's tokenizer.json.
QWEN2_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TRAIN_TEXT = [
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "import numpy as np\nx = np.zeros((3, 4), dtype=np.float32)\nprint(x.shape)\n",
    "for i in range(10):\n    print(i, i * i)\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "The quick brown fox jumps over the lazy dog. Hello, world!\n",
    "with open('data.txt') as f:\n    lines = [line.strip() for line in f]\n",
]


def f32_to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 array → uint16 bf16 bit patterns, round-to-nearest-even (NaN kept quiet)."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    u = a.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(a)
    if nan.any():
        rounded[nan] = 0x7FC0
    return rounded


def bf16_bits_to_f32(b: np.ndarray) -> np.ndarray:
    """uint16 bf16 bit patterns → float32 (exact)."""
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def encode_dtype(a_f32: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values → the array whose raw bytes are the safetensors payload of `dtype`."""
    if dtype == "bf16":
        return f32_to_bf16_bits(a_f32)
    if dtype == "f16":
        return np.asarray(a_f32, dtype=np.float16)
    if dtype == "f32":
        return np.asarray(a_f32, dtype=np.float32)
    raise ValueError(f"unknown dtype {dtype!r}; expected bf16, f16 or f32")


# ---------------------------------------------------------------- safetensors writer (streaming)
class SafetensorsStreamWriter:
    """Writes one .safetensors file whose tensor list is known up front; data streamed tensor by tensor.

    specs: list of (name, dtype "bf16"|"f16"|"f32", shape). `write(name, raw)` must follow specs order; `raw` is the
    encoded array (see `encode_dtype`) or a bytes-like object of the exact size; several `write_part` calls may
    stream one tensor in row blocks.
    """

    def __init__(self, path: str | os.PathLike, specs: list[tuple[str, str, tuple[int, ...]]],
                 metadata: dict[str, str] | None = None):
        self.path = Path(path)
        self.specs = list(specs)
        header: dict[str, object] = {"__metadata__": metadata or {"format": "pt"}}
        off = 0
        self._sizes = []
        for name, dt, shape in self.specs:
            n = int(np.prod(shape, dtype=np.int64)) * ITEMSIZE[dt]
            header[name] = {"dtype": SAFETENSORS_DTYPE[dt], "shape": list(shape), "data_offsets": [off, off + n]}
            self._sizes.append(n)
            off += n
        hb = json.dumps(header, separators=(",", ":")).encode()
        hb += b" " * ((-len(hb)) % 8)  # the reference implementation pads the header to 8 bytes with spaces
        self._f = open(self.path, "wb")
        self._f.write(struct.pack("<Q", len(hb)) + hb)
        self._i = 0
        self._written = 0

    def write_part(self, raw) -> None:
        """Append bytes of the current tensor (call repeatedly for row blocks)."""
        mv = memoryview(np.ascontiguousarray(raw)).cast("B") if isinstance(raw, np.ndarray) else memoryview(raw)
        self._f.write(mv)
        self._written += mv.nbytes
        need = self._sizes[self._i]
        if self._written > need:
            raise ValueError(f"{self.specs[self._i][0]}: wrote {self._written} bytes, expected {need}")
        if self._written == need:
            self._i += 1
            self._written = 0

    def write(self, name: str, raw) -> None:
        if self.specs[self._i][0] != name:
            raise ValueError(f"expected tensor {self.specs[self._i][0]!r}, got {name!r}")
        self.write_part(raw)

    def close(self) -> None:
        if self._i != len(self.specs):
            self._f.close()
            raise ValueError(f"{self.path}: only {self._i} of {len(self.specs)} tensors written")
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb):
        if et is None:
            self.close()
        else:
            self._f.close()


# ---------------------------------------------------------------- tensor list
def tensor_shapes(*, hidden: int, intermediate: int, n_layers: int, n_heads: int, n_kv_heads: int, vocab: int,
                  tied: bool, qkv_bias: bool, head_dim: int | None = None) -> list[tuple[str, tuple[int, ...]]]:
    """HF tensor names and shapes in the order transformers' state_dict lists them."""
    hd = head_dim or hidden // n_heads
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(n_layers):
        p = f"model.layers.{i}."
        out += [(p + "self_attn.q_proj.weight", (n_heads * hd, hidden))]
        if qkv_bias:
            out += [(p + "self_attn.q_proj.bias", (n_heads * hd,))]
        out += [(p + "self_attn.k_proj.weight", (n_kv_heads * hd, hidden))]
        if qkv_bias:
            out += [(p + "self_attn.k_proj.bias", (n_kv_heads * hd,))]
        out += [(p + "self_attn.v_proj.weight", (n_kv_heads * hd, hidden))]
        if qkv_bias:
            out += [(p + "self_attn.v_proj.bias", (n_kv_heads * hd,))]
        out += [
            (p + "self_attn.o_proj.weight", (hidden, n_heads * hd)),
            (p + "mlp.gate_proj.weight", (intermediate, hidden)),
            (p + "mlp.up_proj.weight", (intermediate, hidden)),
            (p + "mlp.down_proj.weight", (hidden, intermediate)),
            (p + "input_layernorm.weight", (hidden,)),
            (p + "post_attention_layernorm.weight", (hidden,)),
        ]
    out.append(("model.norm.weight", (hidden,)))
    if not tied:
        out.append(("lm_head.weight", (vocab, hidden)))
    return out


def random_tensor(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """float32 values shaped like a trained model's: norms ≈ 1 ± noise, biases and weights small normals."""
    if name.endswith("layernorm.weight") or name == "model.norm.weight":
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    if name.endswith(".bias"):
        return (0.1 * rng.standard_normal(shape)).astype(np.float32)
    if "embed_tokens" in name or name == "lm_head.weight":
        return (0.05 * rng.standard_normal(shape)).astype(np.float32)
    fan_in = shape[-1]
    std = max(0.02, min(0.1, 1.0 / np.sqrt(fan_in)))
    return (std * rng.standard_normal(shape)).astype(np.float32)


# ---------------------------------------------------------------- tokenizer
def qwen2_bpe_tokenizer(tok_dir: Path):
    """Qwen2's byte-level BPE from the slow-tokenizer files tok_dir/vocab.json + merges.txt (NFC, Qwen2's split
    regex, byte-level pre-tokenizer and decoder), before any added token: a `tokenizers.Tokenizer`."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    bpe = models.BPE.from_file(str(Path(tok_dir) / "vocab.json"), str(Path(tok_dir) / "merges.txt"), unk_token=None,
                               fuse_unk=False, byte_fallback=False)
    tok = Tokenizer(bpe)
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    return tok


def build_tiny_tokenizer_json(vocab_size: int) -> str:
    """Train a byte-level BPE (Qwen2-style pre-tokenizer) on a few lines; specials appended last. Deterministic."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    n_bpe = vocab_size - len(SPECIAL_TOKENS)
    trainer = trainers.BpeTrainer(vocab_size=n_bpe, min_frequency=1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(_TRAIN_TEXT * 4, trainer=trainer)
    base = tok.get_vocab_size()
    tok.add_special_tokens(SPECIAL_TOKENS)
    assert tok.token_to_id(SPECIAL_TOKENS[0]) == base
    return tok.to_str()


def tokenizer_config(eos: str = "<|im_end|>", pad: str = "<|endoftext|>", first_special_id: int = 0) -> dict:
    added = {str(first_special_id + i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                        "single_word": False, "special": True}
             for i, t in enumerate(SPECIAL_TOKENS)}
    return {
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "chat_template": CHATML_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": eos,
        "errors": "replace",
        "model_max_length": 32768,
        "pad_token": pad,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


# ---------------------------------------------------------------- config
def hf_config(*, arch: str, hidden: int, intermediate: int, n_layers: int, n_heads: int, n_kv_heads: int,
              vocab: int, tied: bool, qkv_bias: bool, rope_theta: float, dtype: str, bos: int | None,
              eos: int | None, max_positions: int = 32768, rms_eps: float = 1e-6,
              rope_scaling: dict | None = None, config_style: str = "hf4", head_dim: int | None = None) -> dict:
    """config.json as transformers writes it. hf4: `torch_dtype`, top-level `rope_theta`/`rope_scaling`
    (what hub checkpoints such as Qwen2.5 ship); hf5: `dtype`, `rope_parameters` (transformers 5.x save_pretrained)."""
    if arch == "qwen2":
        cfg = {
            "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": bos,
            "eos_token_id": eos, "hidden_act": "silu", "hidden_size": hidden, "initializer_range": 0.02,
            "intermediate_size": intermediate, "max_position_embeddings": max_positions,
            "max_window_layers": n_layers, "model_type": "qwen2", "num_attention_heads": n_heads,
            "num_hidden_layers": n_layers, "num_key_value_heads": n_kv_heads, "rms_norm_eps": rms_eps,
            "sliding_window": None, "tie_word_embeddings": tied, "use_cache": True,
            "use_sliding_window": False, "vocab_size": vocab,
        }
        if not qkv_bias:
            raise ValueError("qwen2 always has q/k/v biases; use arch='llama' for none")
    elif arch == "llama":
        cfg = {
            "architectures": ["LlamaForCausalLM"], "attention_bias": qkv_bias, "attention_dropout": 0.0,
            "bos_token_id": bos, "eos_token_id": eos, "head_dim": head_dim or hidden // n_heads,
            "hidden_act": "silu", "hidden_size": hidden, "initializer_range": 0.02,
            "intermediate_size": intermediate, "max_position_embeddings": max_positions, "mlp_bias": False,
            "model_type": "llama", "num_attention_heads": n_heads, "num_hidden_layers": n_layers,
            "num_key_value_heads": n_kv_heads, "pretraining_tp": 1, "rms_norm_eps": rms_eps,
            "tie_word_embeddings": tied, "use_cache": True, "vocab_size": vocab,
        }
    else:
        raise ValueError(f"unknown arch {arch!r}")
    if config_style == "hf4":
        cfg["rope_scaling"] = rope_scaling
        cfg["rope_theta"] = float(rope_theta)
        cfg["torch_dtype"] = TORCH_DTYPE_NAME[dtype]
        cfg["transformers_version"] = "4.43.1"
    elif config_style == "hf5":
        rp = {"rope_theta": float(rope_theta), "rope_type": "default"}
        if rope_scaling:
            rp.update(rope_scaling)
            rp["rope_type"] = rope_scaling.get("rope_type", rope_scaling.get("type"))
        cfg["rope_parameters"] = rp
        cfg["dtype"] = TORCH_DTYPE_NAME[dtype]
        cfg["transformers_version"] = "5.24.0"
    else:
        raise ValueError(f"unknown config_style {config_style!r}")
    return dict(sorted(cfg.items()))


# ---------------------------------------------------------------- checkpoint
def write_weights(path: Path, shapes: list[tuple[str, tuple[int, ...]]], dtype: str,
                  tensor_fn: Callable[[str, tuple[int, ...]], np.ndarray], sharded: bool | int) -> list[str]:
    """Write model.safetensors, or shards + model.safetensors.index.json. Returns the file names written.

    sharded: False → one file; True → one shard per ~third of the tensors (at least 2); int n → n shards.
    """
    if not sharded:
        groups = [shapes]
        names = ["model.safetensors"]
    else:
        n = 3 if sharded is True else int(sharded)
        n = max(2, min(n, len(shapes)))
        bounds = np.linspace(0, len(shapes), n + 1).astype(int)
        groups = [shapes[bounds[i]:bounds[i + 1]] for i in range(n)]
        names = [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    weight_map, total = {}, 0
    for fname, group in zip(names, groups):
        with SafetensorsStreamWriter(path / fname, [(nm, dtype, sh) for nm, sh in group]) as w:
            for nm, sh in group:
                w.write(nm, encode_dtype(tensor_fn(nm, sh), dtype))
                weight_map[nm] = fname
                total += int(np.prod(sh)) * ITEMSIZE[dtype]
    if sharded:
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return names


def make_checkpoint(path, *, hidden: int = 256, intermediate: int = 512, n_layers: int = 2, n_heads: int = 4,
                    n_kv_heads: int = 2, vocab: int = 512, tied: bool = False, qkv_bias: bool = True,
                    rope_theta: float = 1e6, dtype: str = "bf16", sharded: bool | int = False,
                    arch: str = "qwen2", seed: int = 0, tokenizer: bool = True, config_style: str = "hf4",
                    rope_scaling: dict | None = None, max_positions: int = 32768, rms_eps: float = 1e-6,
                    head_dim: int | None = None,
                    tensor_fn: Callable[[str, tuple[int, ...]], np.ndarray] | None = None) -> Path:
    """Write a tiny HF-format checkpoint directory at `path` (created) and return it.

    vocab is the number of embedding rows; the tokenizer (when `tokenizer`) has min(vocab, 320) tokens
    (317 BPE + 3 specials), so rows beyond it are padding rows as in Qwen's real checkpoints.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if dtype not in SAFETENSORS_DTYPE:
        raise ValueError(f"dtype {dtype!r} not one of {list(SAFETENSORS_DTYPE)}")
    if (hidden % n_heads and head_dim is None) or n_heads % n_kv_heads:
        raise ValueError("hidden must divide by n_heads (unless head_dim is given) and n_heads by n_kv_heads")
    if head_dim is not None and arch == "qwen2" and head_dim * n_heads != hidden:
        raise ValueError("qwen2 requires head_dim = hidden / n_heads")
    if arch == "qwen2" and not qkv_bias:
        raise ValueError("qwen2 always has q/k/v biases")
    bos = eos = None
    if tokenizer:
        if vocab < 300:
            raise ValueError("vocab must be >= 300 rows to hold the byte-level tokenizer (256 bytes + merges + specials)")
        n_tok = min(vocab, 320)
        tj = build_tiny_tokenizer_json(n_tok)
        (path / "tokenizer.json").write_text(tj)
        first_special = n_tok - len(SPECIAL_TOKENS)
        eot, im_end = first_special, first_special + 2
        bos, eos = eot, im_end
        (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(first_special_id=first_special), indent=2))
        gen = {"bos_token_id": eot, "do_sample": True, "eos_token_id": [im_end, eot], "pad_token_id": eot,
               "repetition_penalty": 1.05, "temperature": 0.7, "top_k": 20, "top_p": 0.8,
               "transformers_version": "4.43.1"}
        (path / "generation_config.json").write_text(json.dumps(gen, indent=2))
    cfg = hf_config(arch=arch, hidden=hidden, intermediate=intermediate, n_layers=n_layers, n_heads=n_heads,
                    n_kv_heads=n_kv_heads, vocab=vocab, tied=tied, qkv_bias=qkv_bias, rope_theta=rope_theta,
                    dtype=dtype, bos=bos, eos=eos, max_positions=max_positions, rms_eps=rms_eps,
                    rope_scaling=rope_scaling, config_style=config_style, head_dim=head_dim)
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    shapes = tensor_shapes(hidden=hidden, intermediate=intermediate, n_layers=n_layers, n_heads=n_heads,
                           n_kv_heads=n_kv_heads, vocab=vocab, tied=tied, qkv_bias=qkv_bias, head_dim=head_dim)
    rng = np.random.default_rng(seed)
    fn = tensor_fn or (lambda nm, sh: random_tensor(nm, sh, rng))
    write_weights(path, shapes, dtype, fn, sharded)
    return path


def load_source_f32(path) -> dict[str, np.ndarray]:
    """Read every tensor of a checkpoint made by make_checkpoint back as float32 (test helper; whole model in RAM)."""
    path = Path(path)
    files = sorted(path.glob("*.safetensors"))
    out = {}
    inv = {v: k for k, v in SAFETENSORS_DTYPE.items()}
    for fp in files:
        raw = fp.read_bytes()
        (hl,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8:8 + hl])
        base = 8 + hl
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            a, b = meta["data_offsets"]
            dt = inv[meta["dtype"]]
            buf = raw[base + a: base + b]
            if dt == "bf16":
                arr = bf16_bits_to_f32(np.frombuffer(buf, np.uint16))
            elif dt == "f16":
                arr = np.frombuffer(buf, np.float16).astype(np.float32)
            else:
                arr = np.frombuffer(buf, np.float32).copy()
            out[name] = arr.reshape(meta["shape"])
    return out


def convert_cases(directory: Path, cases: dict) -> dict:
    """For each name -> (make_checkpoint kwargs, convert_checkpoint kwargs) of `cases`: a bf16 checkpoint in
    directory/name and its .nanoqwen conversion; returns name -> the .nanoqwen path."""
    from nanoqwen_quant.convert import convert_checkpoint
    out = {}
    for name, (mk, cv) in cases.items():
        make_checkpoint(directory / name, dtype="bf16", **mk)
        out[name] = convert_checkpoint(directory / name, directory / f"{name}.nanoqwen", **cv)
    return out


def rel_rows(a, b) -> np.ndarray:
    """Relative error of each row of a against b (float64 norms)."""
    a, b = np.atleast_2d(a).astype(np.float64), np.atleast_2d(b).astype(np.float64)
    return np.linalg.norm(a - b, axis=-1) / np.linalg.norm(b, axis=-1)


def pack_int4_layout1(u: np.ndarray) -> np.ndarray:
    """Independent INT4 layout-1 packer for kernel tests (spec §9.2): codes u uint8 (N, K), K % 8 == 0 -> uint32
    (N, K/8) words, nibble i of word j <- u[:, 8j + INT4_PERM[i]]."""
    from nanoqwen_format.constants import INT4_PERM
    N, K = u.shape
    out = np.zeros((N, K // 8), dtype=np.uint32)
    for i in range(8):
        out |= (u[:, INT4_PERM[i]::8].astype(np.uint32) << np.uint32(4 * i))
    return out


# ---------------------------------------------------------------- bench/make_7b_file.py as a module
def make_7b_file_module():
    """bench/make_7b_file.py imported once (it is a script, not a package module): random .nanoqwen files of any
    Qwen2.5 size's widths (make_file, shape_config) for the tests that need full-width shapes."""
    import importlib.util
    import sys
    mod = sys.modules.get("make_7b_file")
    if mod is None:
        path = Path(__file__).resolve().parents[1] / "bench" / "make_7b_file.py"
        spec = importlib.util.spec_from_file_location("make_7b_file", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["make_7b_file"] = mod
        spec.loader.exec_module(mod)
    return mod
