"""Reading Hugging Face checkpoints: local dir or hub id → config.json → ModelConfig, and safetensors tensors
streamed one tensor (or one row block) at a time.

Safetensors headers are validated with `safetensors.safe_open` and parsed here for the byte offsets; data is
read with plain `readinto` into buffers we own (safe_open's numpy framework cannot return bfloat16, and reading
row blocks keeps the peak RSS of a 7B conversion near one tensor's f16 copy).
"""
from __future__ import annotations

import json
import math
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nanoqwen_format import ModelConfig, NanoqwenFormatError, expected_tensors
from nanoqwen_format.config import validate_config
from nanoqwen_format.constants import INT4_LAYOUTS

from .cast import bf16_to_f32

SUPPORTED_ARCHS = {"Qwen2ForCausalLM": "qwen2", "LlamaForCausalLM": "llama"}
MODEL_TYPES = {"qwen2": "qwen2", "llama": "llama"}
SOURCE_DTYPES = {"BF16": (np.dtype("<u2"), 2), "F16": (np.dtype("<f2"), 2), "F32": (np.dtype("<f4"), 4)}
HUB_PATTERNS = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                "vocab.json", "merges.txt", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
                "*.safetensors", "model.safetensors.index.json"]
# bytes per element of every safetensors dtype (only SOURCE_DTYPES can be converted; others may sit unused)
SAFETENSORS_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2,
                        "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024      # safetensors' own limit on the JSON header
YARN_DEFAULTS = {"beta_fast": 32.0, "beta_slow": 1.0}  # transformers' defaults: the only values our runtime implements
# tensors a checkpoint may carry that the runtime recomputes: ignored
IGNORED_TENSOR = re.compile(r"^model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq$")
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


class ConvertError(Exception):
    """A checkpoint we cannot read or convert. The message is one line, meant for the user."""


# ------------------------------------------------------------------------------------------------ source
@dataclass
class Source:
    """Where a checkpoint came from (goes into the provenance blob)."""
    path: Path                         # local directory holding the files
    source: str                        # what the user gave: a path or a hub repo id
    is_hub: bool = False
    revision: str | None = None        # requested revision (hub)
    commit: str | None = None          # resolved commit hash (hub snapshots live in snapshots/<commit>/)


GGUF_MAGIC = b"GGUF"


def is_gguf_file(p: Path) -> bool:
    """A GGUF file is recognised by its magic, whatever its name (Ollama stores models as sha256-... blobs)."""
    try:
        with open(p, "rb") as fh:
            return fh.read(4) == GGUF_MAGIC
    except OSError:
        return False


def resolve_source(src: str | os.PathLike, revision: str | None = None) -> Source:
    """A local checkpoint directory, or a hub repo id fetched with huggingface_hub.snapshot_download."""
    p = Path(src).expanduser()
    if p.is_dir() or (p.is_file() and is_gguf_file(p)):
        if revision:
            raise ConvertError(f"--revision {revision!r} given but {str(src)!r} is a local "
                               f"{'directory' if p.is_dir() else 'file'}")
        return Source(path=p.resolve(), source=str(p.resolve()))
    if p.exists():
        raise ConvertError(f"{str(src)!r} is a file but not a GGUF file; expected a checkpoint directory, "
                           f"a .gguf file (or Ollama blob) or a hub repo id")
    s = str(src)
    if not _HUB_ID.match(s):
        raise ConvertError(f"{s!r}: no such directory, and not a hub repo id of the form owner/name")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # pragma: no cover - a declared dependency
        raise ConvertError(f"{s!r}: no such directory, and huggingface_hub is not installed to fetch it") from None
    try:
        local = snapshot_download(repo_id=s, revision=revision, allow_patterns=HUB_PATTERNS)
    except Exception as e:  # offline, unknown repo/revision, auth, disk: all become one line
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConvertError(f"{s!r} is not a local directory, and fetching it from the Hugging Face hub "
                           f"(revision {revision or 'main'}) failed: {type(e).__name__}: {reason}") from None
    local = Path(local)
    commit = local.name if re.fullmatch(r"[0-9a-f]{40}", local.name) else None
    return Source(path=local, source=s, is_hub=True, revision=revision, commit=commit)


# ------------------------------------------------------------------------------------------------ config
def _get(cfg: dict, key: str, default: Any = None, *, required: bool = False) -> Any:
    if key in cfg and cfg[key] is not None:
        return cfg[key]
    if required:
        raise ConvertError(f"config.json: missing required field {key!r}")
    return default


def _int(cfg: dict, key: str, default: Any = None, *, required: bool = False) -> int:
    v = _get(cfg, key, default, required=required)
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ConvertError(f"config.json: {key} must be a positive integer, found {v!r}")
    return v


def _token_id(v: Any, key: str, vocab_rows: int) -> int:
    if isinstance(v, list):
        v = v[0] if v else None
    if v is None:
        return -1
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < vocab_rows:
        raise ConvertError(f"config.json: {key} must be a token id in 0..{vocab_rows - 1}, found {v!r}")
    return v


def _rope(cfg: dict, max_positions: int) -> tuple[float, str, float, int]:
    """(rope_theta, scaling type, factor, original_max_positions) from transformers 4.x (`rope_theta`,
    `rope_scaling`) or 5.x (`rope_parameters`) style configs."""
    params = cfg.get("rope_parameters")
    scaling = cfg.get("rope_scaling")
    if isinstance(params, dict) and "full_attention" in params and isinstance(params["full_attention"], dict):
        params = params["full_attention"]     # per-layer-type form (transformers 5.x)
    theta = cfg.get("rope_theta")
    inner = params.get("rope_theta") if isinstance(params, dict) else None
    if theta is not None and inner is not None and theta != inner:
        # transformers 5 reads rope_parameters' value, 4.x the top-level one: the file would follow one of them
        raise ConvertError(f"config.json: rope_theta {theta!r} and rope_parameters.rope_theta {inner!r} disagree")
    if theta is None:
        theta = inner
    if theta is None:
        theta = 10000.0                        # transformers' default for Qwen2Config and LlamaConfig
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not math.isfinite(theta) or theta <= 0:
        raise ConvertError(f"config.json: rope_theta must be a positive number, found {theta!r}")
    spec = scaling if isinstance(scaling, dict) else (params if isinstance(params, dict) else None)
    if scaling is not None and not isinstance(scaling, dict):
        raise ConvertError(f"config.json: rope_scaling must be an object or null, found {scaling!r}")
    if not spec:
        return float(theta), "none", 1.0, 0
    kind = spec.get("rope_type", spec.get("type", "default"))
    if kind in (None, "default"):
        return float(theta), "none", 1.0, 0
    factor = spec.get("factor")
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor):
        raise ConvertError(f"config.json: rope scaling {kind!r} needs a numeric factor, found {factor!r}")
    if kind == "linear":
        if factor <= 0:
            raise ConvertError(f"config.json: linear rope scaling factor must be > 0, found {factor!r}")
        return float(theta), "linear", float(factor), 0
    if kind == "yarn":
        if factor < 1:
            raise ConvertError(f"config.json: yarn rope scaling factor must be >= 1, found {factor!r}")
        orig = spec.get("original_max_position_embeddings") or cfg.get("original_max_position_embeddings")
        if orig is None:
            orig = max_positions
        if isinstance(orig, bool) or not isinstance(orig, int) or orig <= 0:
            raise ConvertError(f"config.json: yarn original_max_position_embeddings must be a positive integer, "
                               f"found {orig!r}")
        for k, want in YARN_DEFAULTS.items():
            if spec.get(k) is not None and float(spec[k]) != want:
                raise ConvertError(f"config.json: yarn {k}={spec[k]!r} is not supported (only {want})")
        for k in ("attention_factor", "mscale", "mscale_all_dim"):
            if spec.get(k) is not None:
                raise ConvertError(f"config.json: yarn {k} is not supported")
        if spec.get("truncate", True) is not True:   # the runtime rounds the correction range (transformers' default)
            raise ConvertError(f"config.json: yarn truncate={spec['truncate']!r} is not supported (only true)")
        return float(theta), "yarn", float(factor), orig
    raise ConvertError(f"config.json: unsupported rope scaling type {kind!r} (supported: none, linear, yarn)")


def model_config_from_hf(cfg: dict, gen_cfg: dict | None = None) -> ModelConfig:
    """config.json (dict) → ModelConfig, refusing what the runtime cannot run with a one-line ConvertError."""
    archs = cfg.get("architectures") or []
    if archs:
        if not isinstance(archs, list) or archs[0] not in SUPPORTED_ARCHS:
            raise ConvertError(f"config.json: unsupported architecture {archs!r} "
                               f"(supported: {', '.join(SUPPORTED_ARCHS)})")
        arch = SUPPORTED_ARCHS[archs[0]]
    else:
        mt = cfg.get("model_type")
        if mt not in MODEL_TYPES:
            raise ConvertError(f"config.json: unsupported model_type {mt!r} and no architectures field "
                               f"(supported: {', '.join(SUPPORTED_ARCHS)})")
        arch = MODEL_TYPES[mt]
    if cfg.get("quantization_config"):
        raise ConvertError("config.json: checkpoint is already quantized (quantization_config present); "
                           "convert the original bf16/f16/f32 checkpoint")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ConvertError(f"config.json: hidden_act {act!r} is not supported (only silu)")
    if cfg.get("use_sliding_window"):
        raise ConvertError("config.json: use_sliding_window=true is not supported")
    if arch == "llama" and cfg.get("mlp_bias"):
        raise ConvertError("config.json: mlp_bias=true is not supported")
    hidden = _int(cfg, "hidden_size", required=True)
    n_heads = _int(cfg, "num_attention_heads", required=True)
    n_kv = _int(cfg, "num_key_value_heads", n_heads)
    if hidden % n_heads and cfg.get("head_dim") is None:
        raise ConvertError(f"config.json: hidden_size {hidden} is not a multiple of num_attention_heads {n_heads}")
    head_dim = _int(cfg, "head_dim", hidden // n_heads)
    if arch == "qwen2" and head_dim * n_heads != hidden:
        raise ConvertError(f"config.json: head_dim {head_dim} x num_attention_heads {n_heads} != hidden_size "
                           f"{hidden} (Qwen2 requires head_dim = hidden_size / num_attention_heads)")
    if n_heads % n_kv:
        raise ConvertError(f"config.json: num_attention_heads {n_heads} is not a multiple of "
                           f"num_key_value_heads {n_kv}")
    vocab = _int(cfg, "vocab_size", required=True)
    max_pos = _int(cfg, "max_position_embeddings", 32768 if arch == "qwen2" else 2048)
    theta, rs_type, rs_factor, rs_orig = _rope(cfg, max_pos)
    if arch == "llama" and cfg.get("attention_bias"):
        raise ConvertError("config.json: attention_bias=true for llama (o_proj bias) is not supported")
    qkv_bias = arch == "qwen2"
    eps = _get(cfg, "rms_norm_eps", 1e-6)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps <= 0:
        raise ConvertError(f"config.json: rms_norm_eps must be a positive number, found {eps!r}")
    gen_cfg = gen_cfg or {}
    ids = {k: cfg.get(k) if cfg.get(k) is not None else gen_cfg.get(k)     # config.json first, then generation
           for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    bos, eos, pad = (_token_id(ids[k], k, vocab) for k in ("bos_token_id", "eos_token_id", "pad_token_id"))
    tied = cfg.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        raise ConvertError(f"config.json: tie_word_embeddings must be true or false, found {tied!r}")
    mc = ModelConfig(arch=arch, n_layers=_int(cfg, "num_hidden_layers", required=True), hidden_size=hidden,
                     intermediate_size=_int(cfg, "intermediate_size", required=True), n_heads=n_heads,
                     n_kv_heads=n_kv, head_dim=head_dim, vocab_rows=vocab, max_positions=max_pos,
                     rope_theta=theta, rope_scaling_type=rs_type, rope_scaling_factor=rs_factor,
                     rope_original_max_positions=rs_orig, rms_norm_eps=float(eps), tied_embeddings=tied,
                     qkv_bias=qkv_bias, bos_token_id=bos, eos_token_id=eos, pad_token_id=pad)
    try:
        validate_config(mc)
    except NanoqwenFormatError as e:
        raise ConvertError(f"config.json: {e}") from None
    return mc


# ------------------------------------------------------------------------------------------------ tensors
@dataclass(frozen=True)
class SourceTensor:
    name: str
    dtype: str                  # "BF16" | "F16" | "F32"
    shape: tuple[int, ...]
    file: Path
    offset: int                 # absolute byte offset of the data in `file`
    nbytes: int

    @property
    def row_bytes(self) -> int:
        return self.nbytes // self.shape[0] if self.shape and self.shape[0] else self.nbytes


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConvertError(f"{what}: {path} not found") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ConvertError(f"{what}: cannot parse {path}: {e}".splitlines()[0]) from None


def parse_safetensors_header(path: Path) -> dict[str, SourceTensor]:
    """Validate one .safetensors file (safe_open + our own checks) and return its tensors' locations."""
    try:
        from safetensors import safe_open
        with safe_open(str(path), framework="numpy") as f:
            keys = set(f.keys())
    except FileNotFoundError:
        raise ConvertError(f"{path}: file not found") from None
    except Exception as e:  # SafetensorError: header too large, invalid JSON, incomplete buffer, ...
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConvertError(f"{path}: not a valid safetensors file ({msg})") from None
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise ConvertError(f"{path}: not a valid safetensors file (shorter than 8 bytes)")
        (hlen,) = struct.unpack("<Q", head)
        if hlen > min(MAX_SAFETENSORS_HEADER, size - 8):
            raise ConvertError(f"{path}: not a valid safetensors file (header length {hlen} > file)")
        try:
            header = json.loads(fh.read(hlen))
        except ValueError as e:
            raise ConvertError(f"{path}: not a valid safetensors file (header JSON: {e})") from None
    base = 8 + hlen
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dt = meta.get("dtype")
        if dt not in SAFETENSORS_ITEMSIZE:
            raise ConvertError(f"{path}: tensor {name!r} has unknown safetensors dtype {dt!r}")
        shape = tuple(int(d) for d in meta["shape"])
        a, b = (int(x) for x in meta["data_offsets"])
        nbytes = int(np.prod(shape, dtype=np.int64)) * SAFETENSORS_ITEMSIZE[dt]
        if b - a != nbytes or base + b > size:
            raise ConvertError(f"{path}: tensor {name!r} data range [{a}, {b}) does not match its shape {shape} "
                               f"or lies beyond the file (truncated?)")
        out[name] = SourceTensor(name, dt, shape, path, base + a, nbytes)
    if set(out) != keys:
        raise ConvertError(f"{path}: safetensors header disagrees with safe_open")
    return out


def discover_tensors(d: Path) -> dict[str, SourceTensor]:
    """All tensors of a checkpoint dir: via model.safetensors.index.json when present, else model.safetensors
    (or every *.safetensors)."""
    index = d / INDEX_NAME
    tensors: dict[str, SourceTensor] = {}
    if index.exists():
        idx = _read_json(index, "safetensors index")
        wm = idx.get("weight_map") if isinstance(idx, dict) else None
        if not isinstance(wm, dict) or not wm:
            raise ConvertError(f"{index}: missing or empty weight_map")
        bad = next(((k, v) for k, v in wm.items() if not isinstance(v, str) or not v), None)
        if bad is not None:
            raise ConvertError(f"{index}: weight_map[{bad[0]!r}] must be a shard file name, found {bad[1]!r}")
        files = sorted(set(wm.values()))
        for fname in files:
            fp = d / fname
            if not fp.exists():
                raise ConvertError(f"{index}: shard {fname} listed in the index is missing")
            tensors.update(parse_safetensors_header(fp))
        for name, fname in wm.items():
            if name not in tensors or tensors[name].file.name != fname:
                raise ConvertError(f"{index}: tensor {name!r} is not in shard {fname}")
        return tensors
    files = [d / SINGLE_NAME] if (d / SINGLE_NAME).exists() else sorted(d.glob("*.safetensors"))
    if not files:
        raise ConvertError(f"{d}: no model.safetensors, shards or {INDEX_NAME} found "
                           f"(only safetensors checkpoints are supported)")
    for fp in files:
        for name, t in parse_safetensors_header(fp).items():
            if name in tensors:
                raise ConvertError(f"{d}: tensor {name!r} appears in two files")
            tensors[name] = t
    return tensors


def read_source_rows(t: SourceTensor, start: int, stop: int) -> np.ndarray:
    """Rows [start, stop) of a source tensor in its dtype (uint16 bf16 bits / float16 / float32), shape (rows, ...).
    Reads only those bytes."""
    dt, item = SOURCE_DTYPES[t.dtype]
    inner = tuple(t.shape[1:])
    per_row = int(np.prod(inner, dtype=np.int64)) if inner else 1
    raw = np.empty((stop - start) * per_row, dtype=dt)          # (rows * per_row,)
    off = t.offset + start * per_row * item
    try:
        with open(t.file, "rb") as fh:
            fh.seek(off)
            got = fh.readinto(memoryview(raw).cast("B"))
    except OSError as e:
        raise ConvertError(f"{t.file}: cannot read tensor {t.name!r}: {e}") from None
    if got != raw.nbytes:
        raise ConvertError(f"{t.file}: tensor {t.name!r} is truncated (read {got} of {raw.nbytes} bytes)")
    return raw.reshape((stop - start,) + inner)


def same_values(a: SourceTensor, b: SourceTensor, chunk_bytes: int = 64 << 20) -> bool:
    """Whether two source tensors hold the same values (shape, then float32 values), read in row chunks."""
    if tuple(a.shape) != tuple(b.shape) or a.dtype not in SOURCE_DTYPES or b.dtype not in SOURCE_DTYPES:
        return False
    rows = a.shape[0] if a.shape else 1
    step = max(1, chunk_bytes // max(1, a.row_bytes))
    for r in range(0, rows, step):
        e = min(rows, r + step)
        if not np.array_equal(to_float32(read_source_rows(a, r, e), a.dtype),
                              to_float32(read_source_rows(b, r, e), b.dtype)):
            return False
    return True


def to_float32(raw: np.ndarray, dtype: str) -> np.ndarray:
    """Raw source values (uint16 bf16 bits / float16 / float32) → float32 (exact)."""
    if dtype == "BF16":
        return bf16_to_f32(raw)          # numba, parallel; == (raw.astype(uint32) << 16).view(float32)
    return raw.astype(np.float32, copy=False)


@dataclass
class Checkpoint:
    source: Source
    hf_config: dict
    config: ModelConfig
    tensors: dict[str, SourceTensor]     # exactly the tensors the config needs (aliases resolved)
    extras: dict[str, Path] = field(default_factory=dict)   # tokenizer.json etc. that exist

    @property
    def dir(self) -> Path:
        return self.source.path

    def read_raw_rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) in the source dtype (uint16 bf16 bits / float16 / float32), shape (rows, ...).
        Reads only those bytes."""
        return read_source_rows(self.tensors[name], start, stop)

    def read_rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) of a tensor as float32 (a 1-D tensor: elements)."""
        return to_float32(self.read_raw_rows(name, start, stop), self.tensors[name].dtype)

    def int4_tensor(self, name: str, group_size: int, mode: str, layouts=INT4_LAYOUTS
                    ) -> tuple[np.ndarray, ...] | None:
        """The int4 parts of `name` when the source itself stores it quantized (imported GPTQ / AWQ / GGUF
        checkpoints, nanoqwen_quant.sources): layout-1 (qweight, scales) or, where `layouts` (int4g layout ids)
        allows an exact asymmetric repack, layout-2 (qweight, scales, zeros); None for plain checkpoints
        (the converter quantizes)."""
        return None

    def exact_int4(self, name: str, layouts=INT4_LAYOUTS) -> tuple[int, int] | None:
        """(group size, layout id) at which int4_tensor(name, ...) is a lossless repack of the source, among
        `layouts`; None: none."""
        return None

    def read_f32(self, name: str) -> np.ndarray:
        t = self.tensors[name]
        return self.read_rows(name, 0, t.shape[0])

    @property
    def source_nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


EXTRA_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def checked_tensor(d: Path, found: dict[str, SourceTensor], name: str, shape, missing_hint: str = "") -> SourceTensor:
    """found[name], the tensor config.json requires; a ConvertError if it is missing (`missing_hint` ends that
    message), has another shape than config.json implies, or a dtype that is not a supported source dtype."""
    t = found.get(name)
    if t is None:
        raise ConvertError(f"{d}: tensor {name!r} required by config.json is missing from the checkpoint"
                           f"{missing_hint}")
    if tuple(t.shape) != tuple(shape):
        raise ConvertError(f"{d}: tensor {name!r} has shape {t.shape}, config.json implies {shape}")
    if t.dtype not in SOURCE_DTYPES:
        raise ConvertError(f"{t.file}: tensor {name!r} has dtype {t.dtype}; supported sources are "
                           f"{', '.join(SOURCE_DTYPES)}")
    return t


def read_hf_config(source: Source) -> dict:
    """config.json of a checkpoint directory, as a JSON object."""
    d = source.path
    cfg = _read_json(d / "config.json", "config")
    if not isinstance(cfg, dict):
        raise ConvertError(f"{d / 'config.json'}: expected a JSON object")
    return cfg


def load_hf(source: Source, cfg: dict) -> Checkpoint:
    """An unquantized Hugging Face checkpoint directory: config, tensor locations, checked against the config.
    (nanoqwen_quant.load.load_checkpoint picks this reader or one of nanoqwen_quant.sources.)"""
    d = source.path
    gen = _read_json(d / "generation_config.json", "generation config") \
        if (d / "generation_config.json").exists() else None
    mc = model_config_from_hf(cfg, gen if isinstance(gen, dict) else None)
    found = discover_tensors(d)
    want = expected_tensors(mc)
    tensors = {}
    for name, shape in want.items():
        tensors[name] = checked_tensor(d, found, name, shape)
    head, embed = found.get("lm_head.weight"), found.get("model.embed_tokens.weight")
    if mc.tied_embeddings and head is not None and not (embed is not None and same_values(head, embed)):
        # transformers warns and keeps the two apart: tying them here would change the logits without a word
        raise ConvertError(f"{d}: config.json ties the embeddings (tie_word_embeddings: true), but the checkpoint's "
                           f"lm_head.weight differs from model.embed_tokens.weight; transformers would use them "
                           f"untied: set tie_word_embeddings to false to convert them so")
    extra = [n for n in found if n not in want and not IGNORED_TENSOR.match(n)
             and not (mc.tied_embeddings and n == "lm_head.weight")]
    if extra:
        raise ConvertError(f"{d}: unexpected tensor {extra[0]!r} (and {len(extra) - 1} more) for a "
                           f"{mc.arch} config; unsupported variant?")
    extras = {f: d / f for f in EXTRA_FILES if (d / f).exists()}
    return Checkpoint(source=source, hf_config=cfg, config=mc, tensors=tensors, extras=extras)
