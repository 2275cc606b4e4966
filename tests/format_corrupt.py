"""Corrupt .nanoqwen files, one (or more) per validation rule of spec §12.

`Mutator` sets header / config / entry fields by their spec offsets and can re-compute the header CRC, so that a
mutation reaches the rule it targets instead of stopping at rule 9. `corrupt_cases()` lists every case with the
error it must raise. The same corpus can be written out for other implementations (the C++ loader):

    python tests/format_corrupt.py OUT_DIR     # OUT_DIR/<case>.nanoqwen + OUT_DIR/expected.json {case: error}
"""
from __future__ import annotations

import json
import math
import os
import struct
import sys

import crc32c

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from format_helpers import make_random_file  # noqa: E402

from nanoqwen_format import BlobKind, DType, ModelConfig, open_file  # noqa: E402
from nanoqwen_format import errors as E  # noqa: E402

HEADER_FIELDS = {"magic": (0, "8s"), "version": (8, "I"), "header_size": (12, "I"), "file_size": (16, "Q"),
                 "data_offset": (24, "Q"), "n_tensors": (32, "I"), "n_blobs": (36, "I"), "header_crc32c": (40, "I"),
                 "flags": (44, "I")}
CONFIG_FIELDS = {"arch": (0, "I"), "n_layers": (4, "I"), "hidden_size": (8, "I"), "intermediate_size": (12, "I"),
                 "n_heads": (16, "I"), "n_kv_heads": (20, "I"), "head_dim": (24, "I"), "vocab_rows": (28, "I"),
                 "max_positions": (32, "I"), "config_flags": (36, "I"), "rope_theta": (40, "d"),
                 "rope_scaling_type": (48, "I"), "rope_scaling_factor": (52, "f"),
                 "rope_original_max_positions": (56, "I"), "rms_norm_eps": (60, "f"), "bos_token_id": (64, "i"),
                 "eos_token_id": (68, "i"), "pad_token_id": (72, "i")}
TENSOR_FIELDS = {"name": (0, "64s"), "dtype": (64, "I"), "layout_id": (68, "I"), "group_size": (72, "I"),
                 "ndim": (76, "I"), "shape0": (80, "Q"), "shape1": (88, "Q"), "shape2": (96, "Q"),
                 "shape3": (104, "Q"), "offset": (112, "Q"), "nbytes": (120, "Q"), "crc32c": (128, "I"),
                 "reserved": (132, "I")}
BLOB_FIELDS = {"kind": (0, "I"), "encoding": (4, "I"), "offset": (8, "Q"), "nbytes": (16, "Q"), "crc32c": (24, "I")}


class Mutator:
    """A mutable copy of a file's bytes with typed field setters."""

    def __init__(self, raw: bytes):
        self.b = bytearray(raw)

    def _set(self, pos: int, fmt: str, value) -> "Mutator":
        struct.pack_into("<" + fmt, self.b, pos, value)
        return self

    def get_header(self, field):
        pos, fmt = HEADER_FIELDS[field]
        return struct.unpack_from("<" + fmt, self.b, pos)[0]

    def header(self, field, value):
        pos, fmt = HEADER_FIELDS[field]
        return self._set(pos, fmt, value)

    def config(self, field, value):
        pos, fmt = CONFIG_FIELDS[field]
        return self._set(48 + pos, fmt, value)

    def tensor_base(self, i: int) -> int:
        return 256 + 136 * i

    def get_tensor(self, i, field):
        pos, fmt = TENSOR_FIELDS[field]
        return struct.unpack_from("<" + fmt, self.b, self.tensor_base(i) + pos)[0]

    def tensor(self, i, field, value):
        pos, fmt = TENSOR_FIELDS[field]
        if field == "name" and isinstance(value, str):
            value = value.encode("ascii")
        return self._set(self.tensor_base(i) + pos, fmt, value)

    def blob_base(self, j: int) -> int:
        return 256 + 136 * self.get_header("n_tensors") + 64 * j

    def get_blob(self, j, field):
        pos, fmt = BLOB_FIELDS[field]
        return struct.unpack_from("<" + fmt, self.b, self.blob_base(j) + pos)[0]

    def blob(self, j, field, value):
        pos, fmt = BLOB_FIELDS[field]
        return self._set(self.blob_base(j) + pos, fmt, value)

    def byte(self, pos: int, value: int):
        self.b[pos] = value
        return self

    def fix_crc(self) -> "Mutator":
        """Recompute header_crc32c over [0, header_size) (when that range is inside the file)."""
        hs = self.get_header("header_size")
        if 256 <= hs <= len(self.b):
            head = bytearray(self.b[:hs])
            head[40:44] = b"\0\0\0\0"
            struct.pack_into("<I", self.b, 40, crc32c.crc32c(bytes(head)))
        return self

    def fix_item_crc(self, kind: str, idx: int) -> "Mutator":
        """Recompute a tensor's / blob's CRC from its current bytes, then the header CRC."""
        get = self.get_tensor if kind == "tensor" else self.get_blob
        off, nb = get(idx, "offset"), get(idx, "nbytes")
        crc = crc32c.crc32c(bytes(self.b[off:off + nb]))
        (self.tensor if kind == "tensor" else self.blob)(idx, "crc32c", crc)
        return self.fix_crc()

    def bytes(self) -> bytes:
        return bytes(self.b)


def header_only_file(n_tensors: int = 1) -> bytes:
    """A file that ends right after its directory (all-zero entries): header_size = 256 + 136*n_tensors,
    file_size = header_size, data_offset = align128(header_size), valid config and header CRC."""
    hs = 256 + 136 * n_tensors
    b = bytearray(hs)
    struct.pack_into("<8sIIQQIIII", b, 0, b"NANOQWEN", 1, hs, hs, (hs + 127) // 128 * 128, n_tensors, 0, 0, 0)
    struct.pack_into("<10IdIfIf3i", b, 48, 1, 1, 32, 64, 2, 1, 16, 40, 64, 0, 1e6, 0, 1.0, 0, 1e-6, -1, -1, -1)
    struct.pack_into("<I", b, 40, crc32c.crc32c(bytes(b)))
    return bytes(b)


# vocab_rows 81: lm_head int4g (81, 64) g32 has qweight 2592 B + 96 B zero padding before its scales;
# k/v biases f16 (32,) are 64 B, so 64 B of inter-item padding follow them; the directory ends at 4056, so
# 40 B of padding precede data_offset 4096.
BASE_CFG = ModelConfig(arch="qwen2", n_layers=2, hidden_size=64, intermediate_size=96, n_heads=4, n_kv_heads=2,
                       head_dim=16, vocab_rows=81, max_positions=128, rope_theta=1e6, rms_norm_eps=1e-6,
                       tied_embeddings=False, qkv_bias=True, bos_token_id=-1, eos_token_id=5, pad_token_id=7)


def base_dtypes(name, shape):
    if "proj.weight" in name or name == "lm_head.weight":
        return DType.INT4G, 32
    if "embed" in name:
        return DType.BF16, 0
    if "norm" in name:
        return DType.F32, 0
    return DType.F16, 0


def T(base, name):
    return base["idx"][name]


L0 = "model.layers.0."
KB = L0 + "self_attn.k_proj.bias"
QP = L0 + "self_attn.q_proj.weight"


def corrupt_cases():
    """[(id, mutate(base) -> bytes, error class, substring the message must contain)], one or more per rule."""
    c = []

    def add(id_, fn, err, sub):
        c.append((id_, fn, err, sub))

    M = lambda b: Mutator(b["raw"])  # noqa: E731
    # --- header (rules 1-13)
    add("magic", lambda b: M(b).byte(7, ord("M")).bytes(), E.BadMagic, "magic")
    add("magic-zero-file", lambda b: bytes(1000), E.BadMagic, "magic")
    add("short-4-bytes", lambda b: b["raw"][:4], E.HeaderTooShort, "file")
    add("short-200-bytes", lambda b: b["raw"][:200], E.HeaderTooShort, "256")
    add("header-size-below-256", lambda b: M(b).header("header_size", 200).fix_crc().bytes(), E.HeaderTooShort,
        "header_size")
    add("version-2", lambda b: M(b).header("version", 2).fix_crc().bytes(), E.UnsupportedVersion, "version")
    add("version-0", lambda b: M(b).header("version", 0).fix_crc().bytes(), E.UnsupportedVersion, "version")
    add("n-tensors-cap", lambda b: M(b).header("n_tensors", 65537).bytes(), E.HeaderTooLarge, "n_tensors")
    add("n-tensors-u32-max", lambda b: M(b).header("n_tensors", 2**32 - 1).bytes(), E.HeaderTooLarge, "n_tensors")
    add("n-blobs-cap", lambda b: M(b).header("n_blobs", 65).bytes(), E.HeaderTooLarge, "n_blobs")
    add("header-size-cap", lambda b: M(b).header("header_size", 16 * 2**20 + 8).bytes(), E.HeaderTooLarge,
        "header_size")
    add("header-size-mismatch", lambda b: M(b).header("header_size", 4056 + 136).fix_crc().bytes(),
        E.HeaderSizeMismatch, "header_size")
    add("n-tensors-mismatch", lambda b: M(b).header("n_tensors", 26).fix_crc().bytes(), E.HeaderSizeMismatch,
        "header_size")
    add("truncated-in-directory", lambda b: b["raw"][:1000], E.TruncatedFile, "header_size")
    add("header-crc", lambda b: M(b).config("max_positions", 129).bytes(), E.ChecksumMismatch, "header_crc32c")
    add("directory-crc", lambda b: M(b).tensor(3, "crc32c", 1).bytes(), E.ChecksumMismatch, "header_crc32c")
    add("flags", lambda b: M(b).header("flags", 1).fix_crc().bytes(), E.NonZeroReserved, "flags")
    add("header-reserved", lambda b: M(b).byte(200, 1).fix_crc().bytes(), E.NonZeroReserved, "reserved")
    add("config-reserved", lambda b: M(b).byte(48 + 100, 9).fix_crc().bytes(), E.NonZeroReserved, "reserved")
    add("config-flags-bit4", lambda b: M(b).config("config_flags", 2 | 16).fix_crc().bytes(), E.NonZeroReserved,
        "config_flags")
    # --- config values (rule 11)
    for field, value, sub in [("arch", 3, "arch"), ("rope_scaling_type", 7, "rope_scaling_type"),
                              ("n_layers", 0, "n_layers"), ("n_kv_heads", 3, "n_kv_heads"),
                              ("head_dim", 8, "head_dim"), ("rope_scaling_factor", 2.0, "rope_scaling_factor"),
                              ("rope_original_max_positions", 5, "rope_original_max_positions"),
                              ("rope_theta", math.nan, "rope_theta"), ("rope_theta", -1.0, "rope_theta"),
                              ("rms_norm_eps", 0.0, "rms_norm_eps"), ("rms_norm_eps", math.inf, "rms_norm_eps"),
                              ("eos_token_id", 81, "eos_token_id"), ("pad_token_id", -2, "pad_token_id"),
                              ("vocab_rows", 0, "vocab_rows"), ("hidden_size", 0, "hidden_size")]:
        add(f"config-{field}-{value}", lambda b, f=field, v=value: M(b).config(f, v).fix_crc().bytes(),
            E.ConfigMismatch, sub)
    add("config-yarn-without-orig", lambda b: M(b).config("rope_scaling_type", 2).config("rope_scaling_factor", 2.0)
        .fix_crc().bytes(), E.ConfigMismatch, "rope_original_max_positions")
    add("config-vs-shape", lambda b: M(b).config("intermediate_size", 128).fix_crc().bytes(), E.ConfigMismatch,
        "gate_proj")
    # --- file size / data offset (rules 12-16)
    add("truncated-data", lambda b: b["raw"][:-1], E.TruncatedFile, "file_size")
    add("truncated-half", lambda b: b["raw"][:len(b["raw"]) // 2], E.TruncatedFile, "file_size")
    add("appended-byte", lambda b: b["raw"] + b"\0", E.TrailingBytes, "file_size")
    add("data-offset-misaligned", lambda b: M(b).header("data_offset", 4096 + 8).fix_crc().bytes(),
        E.MisalignedOffset, "data_offset")
    add("data-offset-overlaps", lambda b: M(b).header("data_offset", 3968).fix_crc().bytes(), E.OverlappingTensors,
        "data_offset")
    add("data-offset-hole", lambda b: M(b).header("data_offset", 4224).fix_crc().bytes(), E.HoleInData,
        "data_offset")
    add("data-offset-beyond-file", lambda b: header_only_file(1), E.OffsetOutOfRange, "data_offset")
    add("padding-after-directory", lambda b: M(b).byte(4060, 1).bytes(), E.NonZeroPadding, "directory")
    # --- tensor entries (rules 17-28)
    add("name-non-ascii", lambda b: M(b).tensor(0, "name", b"model.embed\xc3\xa9").fix_crc().bytes(),
        E.BadTensorName, "ASCII")
    add("name-space", lambda b: M(b).tensor(0, "name", b"model.embed tokens.weight").fix_crc().bytes(),
        E.BadTensorName, "ASCII")
    add("name-no-nul", lambda b: M(b).tensor(0, "name", b"a" * 64).fix_crc().bytes(), E.BadTensorName, "NUL")
    add("name-empty", lambda b: M(b).tensor(0, "name", b"").fix_crc().bytes(), E.BadTensorName, "empty")
    add("name-junk-after-nul", lambda b: M(b).tensor(0, "name", b"model.norm.weight\0x").fix_crc().bytes(),
        E.BadTensorName, "padding")
    add("duplicate-name", lambda b: M(b).tensor(1, "name", M(b).get_tensor(0, "name")).fix_crc().bytes(),
        E.DuplicateName, "model.embed_tokens.weight")
    add("dtype-4", lambda b: M(b).tensor(0, "dtype", 4).fix_crc().bytes(), E.UnknownDType, "dtype")
    add("dtype-u32-max", lambda b: M(b).tensor(0, "dtype", 2**32 - 1).fix_crc().bytes(), E.UnknownDType, "dtype")
    add("ndim-0", lambda b: M(b).tensor(0, "ndim", 0).fix_crc().bytes(), E.BadShape, "ndim")
    add("ndim-5", lambda b: M(b).tensor(0, "ndim", 5).fix_crc().bytes(), E.BadShape, "ndim")
    add("unused-shape-slot", lambda b: M(b).tensor(0, "shape3", 5).fix_crc().bytes(), E.NonZeroReserved, "shape")
    add("entry-reserved", lambda b: M(b).tensor(0, "reserved", 1).fix_crc().bytes(), E.NonZeroReserved, "reserved")
    add("layout-int4-2", lambda b: M(b).tensor(T(b, QP), "layout_id", 2).fix_crc().bytes(), E.UnknownLayout,
        "layout_id")
    add("layout-plain-1", lambda b: M(b).tensor(0, "layout_id", 1).fix_crc().bytes(), E.UnknownLayout, "layout_id")
    add("dim-zero", lambda b: M(b).tensor(0, "shape0", 0).fix_crc().bytes(), E.BadShape, "dimension")
    add("int4-ndim-3", lambda b: M(b).tensor(T(b, QP), "ndim", 3).tensor(T(b, QP), "shape2", 1).fix_crc().bytes(),
        E.BadShape, "int4g ndim")
    for g in (0, 16, 48, 512):
        add(f"group-size-{g}", lambda b, g=g: M(b).tensor(T(b, QP), "group_size", g).fix_crc().bytes(),
            E.BadGroupSize, "group_size")
    add("group-size-not-dividing-K", lambda b: M(b).tensor(T(b, QP), "group_size", 128).fix_crc().bytes(),
        E.BadGroupSize, "K=64")
    add("group-size-on-plain", lambda b: M(b).tensor(0, "group_size", 32).fix_crc().bytes(), E.BadGroupSize,
        "group_size")
    add("shape-overflow", lambda b: M(b).tensor(0, "shape0", 2**62).fix_crc().bytes(), E.SizeOverflow, "2^64")
    add("offset-overflow", lambda b: M(b).tensor(0, "offset", 2**64 - 128).fix_crc().bytes(), E.SizeOverflow,
        "2^64")
    add("nbytes-short", lambda b: M(b).tensor(T(b, KB), "nbytes", 62).fix_crc().bytes(), E.ByteLengthMismatch,
        "nbytes")
    add("nbytes-int4-without-padding",
        lambda b: M(b).tensor(T(b, "lm_head.weight"), "nbytes", 2592 + 81 * 2 * 2).fix_crc().bytes(),
        E.ByteLengthMismatch, "lm_head.weight")
    add("offset-misaligned", lambda b: M(b).tensor(1, "offset", M(b).get_tensor(1, "offset") + 8).fix_crc().bytes(),
        E.MisalignedOffset, "offset")
    add("offset-overlaps", lambda b: M(b).tensor(1, "offset", M(b).get_tensor(0, "offset")).fix_crc().bytes(),
        E.OverlappingTensors, "overlapping")
    add("offset-hole", lambda b: M(b).tensor(1, "offset", M(b).get_tensor(1, "offset") + 128).fix_crc().bytes(),
        E.HoleInData, "hole")
    add("padding-between-items",
        lambda b: M(b).byte(b["info"][KB].offset + 64 + 3, 0x55).bytes(), E.NonZeroPadding, "padding before")
    add("int4-internal-padding",
        lambda b: M(b).byte(b["info"]["lm_head.weight"].offset + 2592 + 5, 1).bytes(), E.NonZeroPadding,
        "between qweight and scales")
    # --- blob entries (rules 29-33)
    add("blob-kind-6", lambda b: M(b).blob(0, "kind", 6).fix_crc().bytes(), E.UnknownBlobKind, "kind")
    add("blob-kind-0", lambda b: M(b).blob(0, "kind", 0).fix_crc().bytes(), E.UnknownBlobKind, "kind")
    add("blob-duplicate-kind", lambda b: M(b).blob(1, "kind", 1).fix_crc().bytes(), E.DuplicateName, "TOKENIZER_JSON")
    add("blob-encoding", lambda b: M(b).blob(0, "encoding", 2).fix_crc().bytes(), E.BadBlobEncoding, "encoding")
    add("blob-reserved", lambda b: M(b).byte(M(b).blob_base(1) + 40, 1).fix_crc().bytes(), E.NonZeroReserved,
        "reserved")
    add("blob-out-of-range", lambda b: M(b).blob(1, "nbytes", M(b).get_blob(1, "nbytes") + 1000).fix_crc().bytes(),
        E.OffsetOutOfRange, "CHAT_TEMPLATE")
    add("blob-offset-overflow", lambda b: M(b).blob(1, "offset", 2**64 - 16).fix_crc().bytes(), E.SizeOverflow,
        "2^64")
    # --- end of file and tensor set (rules 34-37)
    add("hole-at-end", lambda b: Mutator(b["raw"] + bytes(128)).header("file_size", len(b["raw"]) + 128)
        .fix_crc().bytes(), E.HoleInData, "file_size")
    add("unknown-name", lambda b: M(b).tensor(T(b, "model.norm.weight"), "name", "model.norm.bias").fix_crc().bytes(),
        E.UnknownTensorName, "model.norm.bias")
    add("missing-tensor", lambda b: M(b).config("n_layers", 3).fix_crc().bytes(), E.MissingTensor,
        "model.layers.2.")
    add("tied-flag-makes-lm-head-unknown", lambda b: M(b).config("config_flags", 3).fix_crc().bytes(),
        E.UnknownTensorName, "lm_head.weight")
    # --- item checksums (rule 38)
    add("tensor-data-crc", lambda b: M(b).byte(b["info"][QP].offset + 17, M(b).b[b["info"][QP].offset + 17] ^ 4)
        .bytes(), E.ChecksumMismatch, QP)
    add("blob-data-crc", lambda b: M(b).byte(Mutator(b["raw"]).get_blob(0, "offset") + 2, ord("x")).bytes(),
        E.ChecksumMismatch, "TOKENIZER_JSON")
    # --- int4g scales (rule 39), tensor CRC re-computed so that only the scale rule fails
    for bits, label in ((0x7C00, "inf"), (0x7E00, "nan"), (0xBC00, "negative"), (0x8000, "minus-zero")):
        add(f"scale-{label}", lambda b, v=bits: _set_scale(b, QP, 3, v), E.BadScale, QP)
    return c


def _set_scale(b, name, index, bits):
    """Overwrite scale number `index` of int4g tensor `name` with f16 `bits`, fix its CRC and the header CRC."""
    t = b["info"][name]
    n, k = t.shape
    pos = t.offset + (n * k // 2 + 127) // 128 * 128 + 2 * index
    m = Mutator(b["raw"])
    m.b[pos:pos + 2] = bits.to_bytes(2, "little")
    return m.fix_item_crc("tensor", b["idx"][name]).bytes()


def build_base(path) -> dict:
    """Write the valid base file of the corpus; returns {"raw": bytes, "idx": {name: entry index}, "info": ...}."""
    make_random_file(path, cfg=BASE_CFG, seed=11, dtype_for=base_dtypes,
                     blobs={BlobKind.TOKENIZER_JSON: b'{"model": {"type": "BPE"}, "added_tokens": []}',
                            BlobKind.CHAT_TEMPLATE: b"{{ messages[0]['content'] }} and more text"})
    with open_file(path) as f:
        names = list(f.tensors)
        infos = dict(f.tensors)
        assert f.header_size == 4056 and f.data_offset == 4096
    with open(path, "rb") as fh:
        raw = fh.read()
    return {"raw": raw, "idx": {n: i for i, n in enumerate(names)}, "info": infos}


def write_corpus(out_dir) -> dict:
    """Write base.nanoqwen, every case as <id>.nanoqwen and expected.json {id: error class name}."""
    os.makedirs(out_dir, exist_ok=True)
    base = build_base(os.path.join(out_dir, "base.nanoqwen"))
    expected = {}
    for case_id, fn, err, _ in corrupt_cases():
        with open(os.path.join(out_dir, case_id + ".nanoqwen"), "wb") as fh:
            fh.write(fn(base))
        expected[case_id] = err.__name__
    with open(os.path.join(out_dir, "expected.json"), "w") as fh:
        json.dump(expected, fh, indent=1, sort_keys=True)
    return expected


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/format_corrupt.py OUT_DIR")
    print(f"{len(write_corpus(sys.argv[1]))} corrupt files written to {sys.argv[1]}")
