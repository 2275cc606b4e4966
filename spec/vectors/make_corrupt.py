#!/usr/bin/env python3
"""Corrupt NANOQWEN v1 files, one or more per validation rule of spec §12, derived from the golden vector
tiny_mixed.nanoqwen (and, for the int4g layout-2 rules, tiny_int4_asym.nanoqwen). make_vectors.py writes them to spec/vectors/corrupt/ with manifest.json (spec/vectors/README.md
describes it); tests/format_corrupt.py re-exports this module for the test suite.

`Mutator` sets header / config / entry fields by their spec offsets and can re-compute the header CRC (and item
CRCs, and the blob layout), so that a mutation reaches the rule it targets instead of stopping at rule 9.
`corrupt_cases()` lists every case with its rule number and the error it must raise. Nothing here uses the
nanoqwen_format reader: offsets and shapes come from the base vector's JSON description.
"""
from __future__ import annotations

import json
import math
import os
import struct
from collections import namedtuple
from types import SimpleNamespace

import crc32c

BASE_VECTOR = "tiny_mixed"
ASYM_BASE_VECTOR = "tiny_int4_asym"   # the base of the cases marked asym: its attention and MLP use int4g layout 2
MANIFEST = "manifest.json"

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


def align128(n: int) -> int:
    return (n + 127) // 128 * 128


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

    def set_blob_bytes(self, j: int, data: bytes) -> "Mutator":
        """Replace blob j's content and lay the blobs out again (offsets, nbytes, CRCs, file_size, header CRC):
        the file stays valid up to whatever the new content breaks."""
        n_t, n_b = self.get_header("n_tensors"), self.get_header("n_blobs")
        payloads = [bytes(self.b[self.get_blob(i, "offset"):self.get_blob(i, "offset") + self.get_blob(i, "nbytes")])
                    for i in range(n_b)]
        payloads[j] = bytes(data)
        pos = (self.get_tensor(n_t - 1, "offset") + self.get_tensor(n_t - 1, "nbytes") if n_t
               else self.get_header("data_offset"))
        del self.b[pos:]
        for i, p in enumerate(payloads):
            off = align128(pos)
            self.b += bytes(off - pos) + p
            self.blob(i, "offset", off).blob(i, "nbytes", len(p)).blob(i, "crc32c", crc32c.crc32c(p))
            pos = off + len(p)
        return self.header("file_size", pos).fix_crc()

    def bytes(self) -> bytes:
        return bytes(self.b)


def header_only_file(n_tensors: int = 1) -> bytes:
    """A file that ends right after its directory (all-zero entries): header_size = 256 + 136*n_tensors,
    file_size = header_size, data_offset = align128(header_size), valid config and header CRC."""
    hs = 256 + 136 * n_tensors
    b = bytearray(hs)
    struct.pack_into("<8sIIQQIIII", b, 0, b"NANOQWEN", 1, hs, hs, align128(hs), n_tensors, 0, 0, 0)
    struct.pack_into("<10IdIfIf3i", b, 48, 1, 1, 32, 64, 2, 1, 16, 40, 64, 0, 1e6, 0, 1.0, 0, 1e-6, -1, -1, -1)
    struct.pack_into("<I", b, 40, crc32c.crc32c(bytes(b)))
    return bytes(b)


def build_base(path) -> dict:
    """The base of the corpus: {"raw": bytes, "idx": {tensor name: entry index}, "info": {name: entry},
    "blob_idx": {kind name: entry index}, "desc": the JSON description}, from <path> and its .json beside it."""
    path = os.fspath(path)
    with open(path, "rb") as fh:
        raw = fh.read()
    with open(os.path.splitext(path)[0] + ".json", encoding="utf-8") as fh:
        desc = json.load(fh)
    info = {t["name"]: SimpleNamespace(**t) for t in desc["tensors"]}
    base = {"raw": raw, "idx": {t["name"]: i for i, t in enumerate(desc["tensors"])}, "info": info,
            "blob_idx": {b["kind"]: j for j, b in enumerate(desc["blobs"])}, "desc": desc}
    asym_path = os.path.join(os.path.dirname(path), ASYM_BASE_VECTOR + ".nanoqwen")
    if os.path.basename(path) != ASYM_BASE_VECTOR + ".nanoqwen":
        base["asym"] = build_base(asym_path)   # the base of the layout-2 cases
    return base


# rule: the row of spec §12 ("15b", "31b" included); read_blob: None when open_file must raise, else the kind
# name of the blob whose content read must raise (rules 40-41, checked lazily)
# asym: the case mutates the layout-2 base (tiny_int4_asym), not tiny_mixed
Case = namedtuple("Case", "id rule mutate error mentions read_blob asym")

L0 = "model.layers.0."
QP = L0 + "self_attn.q_proj.weight"
QB = L0 + "self_attn.q_proj.bias"
KB = L0 + "self_attn.k_proj.bias"
LM = "lm_head.weight"


def _t(b, name):
    return b["idx"][name]


def corrupt_cases():
    """[Case], at least one per (rule, error) pair of spec §12, plus order cases."""
    c = []

    def add(id_, rule, fn, err, mentions, read_blob=None, asym=False):
        c.append(Case(id_, rule, fn, err, mentions, read_blob, asym))

    M = lambda b: Mutator(b["raw"])  # noqa: E731
    hs = lambda b: M(b).get_header("header_size")  # noqa: E731
    d_off = lambda b: M(b).get_header("data_offset")  # noqa: E731
    # --- file header (rules 1-10)
    add("short-4-bytes", "1", lambda b: b["raw"][:4], "HeaderTooShort", "file")
    add("magic", "2", lambda b: M(b).byte(7, ord("M")).bytes(), "BadMagic", "magic")
    add("magic-zero-file", "2", lambda b: bytes(1000), "BadMagic", "magic")
    add("short-200-bytes", "3", lambda b: b["raw"][:200], "HeaderTooShort", "256")
    add("version-2", "4", lambda b: M(b).header("version", 2).fix_crc().bytes(), "UnsupportedVersion", "version")
    add("version-0", "4", lambda b: M(b).header("version", 0).fix_crc().bytes(), "UnsupportedVersion", "version")
    add("header-size-below-256", "5", lambda b: M(b).header("header_size", 200).fix_crc().bytes(), "HeaderTooShort",
        "header_size")
    add("n-tensors-cap", "6", lambda b: M(b).header("n_tensors", 65537).bytes(), "HeaderTooLarge", "n_tensors")
    add("n-tensors-u32-max", "6", lambda b: M(b).header("n_tensors", 2**32 - 1).bytes(), "HeaderTooLarge",
        "n_tensors")
    add("n-blobs-cap", "6", lambda b: M(b).header("n_blobs", 65).bytes(), "HeaderTooLarge", "n_blobs")
    add("header-size-cap", "6", lambda b: M(b).header("header_size", 16 * 2**20 + 8).bytes(), "HeaderTooLarge",
        "header_size")
    add("header-size-mismatch", "7", lambda b: M(b).header("header_size", hs(b) + 136).fix_crc().bytes(),
        "HeaderSizeMismatch", "header_size")
    add("n-tensors-mismatch", "7", lambda b: M(b).header("n_tensors", M(b).get_header("n_tensors") + 1)
        .fix_crc().bytes(), "HeaderSizeMismatch", "header_size")
    add("truncated-in-directory", "8", lambda b: b["raw"][:1000], "TruncatedFile", "header_size")
    add("header-crc", "9", lambda b: M(b).config("max_positions", 65).bytes(), "ChecksumMismatch", "header_crc32c")
    add("directory-crc", "9", lambda b: M(b).tensor(3, "crc32c", 1).bytes(), "ChecksumMismatch", "header_crc32c")
    add("flags", "10", lambda b: M(b).header("flags", 1).fix_crc().bytes(), "NonZeroReserved", "flags")
    add("header-reserved", "10", lambda b: M(b).byte(200, 1).fix_crc().bytes(), "NonZeroReserved", "reserved")
    # --- config (rule 11)
    add("config-reserved", "11", lambda b: M(b).byte(48 + 100, 9).fix_crc().bytes(), "NonZeroReserved", "reserved")
    add("config-flags-bit4", "11", lambda b: M(b).config("config_flags", 2 | 16).fix_crc().bytes(),
        "NonZeroReserved", "config_flags")
    for field, value in [("arch", 3), ("rope_scaling_type", 7), ("n_layers", 0), ("n_layers", 257),
                         ("n_layers", 2**32 - 1), ("n_kv_heads", 3), ("head_dim", 8), ("rope_scaling_factor", 2.0),
                         ("rope_original_max_positions", 5), ("rope_theta", math.nan), ("rope_theta", -1.0),
                         ("rms_norm_eps", 0.0), ("rms_norm_eps", math.inf), ("eos_token_id", 20),
                         ("pad_token_id", -2), ("vocab_rows", 0), ("hidden_size", 0)]:
        add(f"config-{field}-{value}", "11", lambda b, f=field, v=value: M(b).config(f, v).fix_crc().bytes(),
            "ConfigMismatch", field)
    for value in (math.inf, math.nan, -1.0):
        add(f"config-rope_scaling_factor-{value}-linear", "11",
            lambda b, v=value: M(b).config("rope_scaling_type", 1).config("rope_scaling_factor", v).fix_crc().bytes(),
            "ConfigMismatch", "rope_scaling_factor")
    add("config-yarn-without-orig", "11", lambda b: M(b).config("rope_scaling_type", 2)
        .config("rope_scaling_factor", 2.0).fix_crc().bytes(), "ConfigMismatch", "rope_original_max_positions")
    # --- file size, data offset (rules 12-16)
    add("truncated-data", "12", lambda b: b["raw"][:-1], "TruncatedFile", "file_size")
    add("truncated-half", "12", lambda b: b["raw"][:len(b["raw"]) // 2], "TruncatedFile", "file_size")
    add("appended-byte", "13", lambda b: b["raw"] + b"\0", "TrailingBytes", "file_size")
    add("data-offset-misaligned", "14", lambda b: M(b).header("data_offset", d_off(b) + 8).fix_crc().bytes(),
        "MisalignedOffset", "data_offset")
    add("data-offset-overlaps", "15", lambda b: M(b).header("data_offset", d_off(b) - 128).fix_crc().bytes(),
        "OverlappingTensors", "data_offset")
    add("data-offset-hole", "15", lambda b: M(b).header("data_offset", d_off(b) + 128).fix_crc().bytes(),
        "HoleInData", "data_offset")
    add("data-offset-beyond-file", "15b", lambda b: header_only_file(1), "OffsetOutOfRange", "data_offset")
    add("padding-after-directory", "16", lambda b: M(b).byte(hs(b) + 4, 1).bytes(), "NonZeroPadding", "directory")
    # --- tensor entries (rules 17-28)
    add("name-non-ascii", "17", lambda b: M(b).tensor(0, "name", b"model.embed\xc3\xa9").fix_crc().bytes(),
        "BadTensorName", "ASCII")
    add("name-space", "17", lambda b: M(b).tensor(0, "name", b"model.embed tokens.weight").fix_crc().bytes(),
        "BadTensorName", "ASCII")
    add("name-no-nul", "17", lambda b: M(b).tensor(0, "name", b"a" * 64).fix_crc().bytes(), "BadTensorName", "NUL")
    add("name-empty", "17", lambda b: M(b).tensor(0, "name", b"").fix_crc().bytes(), "BadTensorName", "empty")
    add("name-junk-after-nul", "17", lambda b: M(b).tensor(0, "name", b"model.norm.weight\0x").fix_crc().bytes(),
        "BadTensorName", "padding")
    add("duplicate-name", "18", lambda b: M(b).tensor(1, "name", M(b).get_tensor(0, "name")).fix_crc().bytes(),
        "DuplicateName", "model.embed_tokens.weight")
    add("dtype-4", "19", lambda b: M(b).tensor(0, "dtype", 4).fix_crc().bytes(), "UnknownDType", "dtype")
    add("dtype-u32-max", "19", lambda b: M(b).tensor(0, "dtype", 2**32 - 1).fix_crc().bytes(), "UnknownDType",
        "dtype")
    add("ndim-0", "20", lambda b: M(b).tensor(0, "ndim", 0).fix_crc().bytes(), "BadShape", "ndim")
    add("ndim-5", "20", lambda b: M(b).tensor(0, "ndim", 5).fix_crc().bytes(), "BadShape", "ndim")
    add("unused-shape-slot", "21", lambda b: M(b).tensor(0, "shape3", 5).fix_crc().bytes(), "NonZeroReserved",
        "shape")
    add("entry-reserved", "21", lambda b: M(b).tensor(0, "reserved", 1).fix_crc().bytes(), "NonZeroReserved",
        "reserved")
    add("layout-int4-3", "22", lambda b: M(b).tensor(_t(b, QP), "layout_id", 3).fix_crc().bytes(), "UnknownLayout",
        "layout_id")
    add("layout-plain-1", "22", lambda b: M(b).tensor(0, "layout_id", 1).fix_crc().bytes(), "UnknownLayout",
        "layout_id")
    add("dim-zero", "23", lambda b: M(b).tensor(0, "shape0", 0).fix_crc().bytes(), "BadShape", "dimension")
    add("int4-ndim-3", "23", lambda b: M(b).tensor(_t(b, QP), "ndim", 3).tensor(_t(b, QP), "shape2", 1)
        .fix_crc().bytes(), "BadShape", "int4g ndim")
    for g in (0, 16, 48, 512):
        add(f"group-size-{g}", "24", lambda b, g=g: M(b).tensor(_t(b, QP), "group_size", g).fix_crc().bytes(),
            "BadGroupSize", "group_size")
    add("group-size-not-dividing-K", "24", lambda b: M(b).tensor(_t(b, QP), "group_size", 64).fix_crc().bytes(),
        "BadGroupSize", "K=32")
    add("group-size-on-plain", "24", lambda b: M(b).tensor(0, "group_size", 32).fix_crc().bytes(), "BadGroupSize",
        "group_size")
    add("shape-overflow", "25", lambda b: M(b).tensor(0, "shape0", 2**62).fix_crc().bytes(), "SizeOverflow", "2^64")
    add("nbytes-short", "26", lambda b: M(b).tensor(_t(b, KB), "nbytes", 30).fix_crc().bytes(),
        "ByteLengthMismatch", "nbytes")
    add("nbytes-int4-without-padding", "26",
        lambda b: M(b).tensor(_t(b, LM), "nbytes", 20 * 32 // 2 + 20 * 2).fix_crc().bytes(), "ByteLengthMismatch",
        LM)
    add("offset-overflow", "27", lambda b: M(b).tensor(0, "offset", 2**64 - 128).fix_crc().bytes(), "SizeOverflow",
        "2^64")
    add("offset-misaligned", "27", lambda b: M(b).tensor(1, "offset", M(b).get_tensor(1, "offset") + 8)
        .fix_crc().bytes(), "MisalignedOffset", "offset")
    add("offset-overlaps", "27", lambda b: M(b).tensor(1, "offset", M(b).get_tensor(0, "offset")).fix_crc().bytes(),
        "OverlappingTensors", "overlapping")
    add("offset-hole", "27", lambda b: M(b).tensor(1, "offset", M(b).get_tensor(1, "offset") + 128)
        .fix_crc().bytes(), "HoleInData", "hole")
    big = 2**20   # lm_head rows: its required nbytes then runs past the end of the file
    add("tensor-out-of-range", "27", lambda b: M(b).tensor(_t(b, LM), "shape0", big)
        .tensor(_t(b, LM), "nbytes", align128(big * 32 // 2) + big * 2).fix_crc().bytes(), "OffsetOutOfRange", LM)
    add("padding-between-items", "27", lambda b: M(b).byte(b["info"][KB].offset + 32 + 3, 0x55).bytes(),
        "NonZeroPadding", "padding before")
    add("int4-internal-padding", "28", lambda b: M(b).byte(b["info"][LM].offset + 20 * 32 // 2 + 5, 1).bytes(),
        "NonZeroPadding", "between qweight and scales")
    # int4g layout 2 (base tiny_int4_asym; q_proj (32, 32) g32: qweight 512 B, scales 64 B, 64 B padding, zeros)
    A = lambda b: Mutator(b["asym"]["raw"])  # noqa: E731
    aq = lambda b: b["asym"]["idx"][QP]  # noqa: E731
    add("asym-layout-as-1", "26", lambda b: A(b).tensor(aq(b), "layout_id", 1).fix_crc().bytes(),
        "ByteLengthMismatch", QP, asym=True)
    add("asym-nbytes-without-zeros", "26", lambda b: A(b).tensor(aq(b), "nbytes", 512 + 64).fix_crc().bytes(),
        "ByteLengthMismatch", QP, asym=True)
    add("asym-qweight-padding", "28", lambda b: A(b).byte(b["asym"]["info"][LM].offset + 20 * 32 // 2 + 3, 1)
        .bytes(), "NonZeroPadding", "between qweight and scales", asym=True)
    add("asym-scales-padding", "28", lambda b: A(b).byte(b["asym"]["info"][QP].offset + 512 + 64 + 7, 1).bytes(),
        "NonZeroPadding", "between scales and zeros", asym=True)
    # --- blob entries (rules 29-33); blob 0 TOKENIZER_JSON, 1 PROVENANCE, 2 CHAT_TEMPLATE
    add("blob-kind-6", "29", lambda b: M(b).blob(0, "kind", 6).fix_crc().bytes(), "UnknownBlobKind", "kind")
    add("blob-kind-0", "29", lambda b: M(b).blob(0, "kind", 0).fix_crc().bytes(), "UnknownBlobKind", "kind")
    add("blob-duplicate-kind", "30", lambda b: M(b).blob(1, "kind", 1).fix_crc().bytes(), "DuplicateName",
        "TOKENIZER_JSON")
    add("blob-encoding", "31", lambda b: M(b).blob(0, "encoding", 2).fix_crc().bytes(), "BadBlobEncoding",
        "encoding")
    add("blob-json-empty", "31b", lambda b: M(b).set_blob_bytes(1, b"").bytes(), "BadBlobEncoding", "PROVENANCE")
    add("blob-reserved", "32", lambda b: M(b).byte(M(b).blob_base(1) + 40, 1).fix_crc().bytes(), "NonZeroReserved",
        "reserved")
    add("blob-offset-overflow", "33", lambda b: M(b).blob(1, "offset", 2**64 - 16).fix_crc().bytes(),
        "SizeOverflow", "2^64")
    add("blob-offset-misaligned", "33", lambda b: M(b).blob(1, "offset", M(b).get_blob(1, "offset") + 8)
        .fix_crc().bytes(), "MisalignedOffset", "PROVENANCE")
    add("blob-offset-overlaps", "33", lambda b: M(b).blob(1, "offset", M(b).get_blob(0, "offset")).fix_crc().bytes(),
        "OverlappingTensors", "PROVENANCE")
    add("blob-offset-hole", "33", lambda b: M(b).blob(1, "offset", M(b).get_blob(1, "offset") + 128)
        .fix_crc().bytes(), "HoleInData", "PROVENANCE")
    add("blob-out-of-range", "33", lambda b: M(b).blob(2, "nbytes", M(b).get_blob(2, "nbytes") + 1000)
        .fix_crc().bytes(), "OffsetOutOfRange", "CHAT_TEMPLATE")
    add("padding-before-blob", "33", lambda b: M(b).byte(M(b).get_blob(1, "offset") - 1, 0x20).bytes(),
        "NonZeroPadding", "padding before blob PROVENANCE")
    # --- end of the file, tensor set (rules 34-37)
    add("hole-at-end", "34", lambda b: Mutator(b["raw"] + bytes(128)).header("file_size", len(b["raw"]) + 128)
        .fix_crc().bytes(), "HoleInData", "file_size")
    add("unknown-name", "35", lambda b: M(b).tensor(_t(b, "model.norm.weight"), "name", "model.norm.bias")
        .fix_crc().bytes(), "UnknownTensorName", "model.norm.bias")
    add("layer-index-leading-zero", "35", lambda b: M(b).tensor(_t(b, QB), "name", QB.replace(".0.", ".00."))
        .fix_crc().bytes(), "UnknownTensorName", "model.layers.00.")
    add("tied-flag-makes-lm-head-unknown", "35", lambda b: M(b).config("config_flags", 3).fix_crc().bytes(),
        "UnknownTensorName", LM)
    add("config-vs-shape", "36", lambda b: M(b).config("intermediate_size", 128).fix_crc().bytes(),
        "ConfigMismatch", "gate_proj")
    # order of 35/36: per entry, so the earlier entry decides
    add("order-shape-then-unknown-name", "36", lambda b: M(b).tensor(_t(b, QB), "ndim", 2)
        .tensor(_t(b, QB), "shape0", 2).tensor(_t(b, QB), "shape1", 16)
        .tensor(_t(b, "model.norm.weight"), "name", "model.norm.bias").fix_crc().bytes(), "ConfigMismatch", QB)
    add("order-unknown-name-then-shape", "35", lambda b: M(b).tensor(_t(b, QB), "name", "model.layers.0.extra")
        .tensor(_t(b, "model.norm.weight"), "ndim", 2).tensor(_t(b, "model.norm.weight"), "shape0", 2)
        .tensor(_t(b, "model.norm.weight"), "shape1", 16).fix_crc().bytes(), "UnknownTensorName",
        "model.layers.0.extra")
    add("missing-tensor", "37", lambda b: M(b).config("n_layers", 2).fix_crc().bytes(), "MissingTensor",
        "model.layers.1.")
    add("missing-tensor-max-layers", "37", lambda b: M(b).config("n_layers", 256).fix_crc().bytes(),
        "MissingTensor", "model.layers.1.")
    # --- item checksums (rule 38), int4g scales (rule 39)
    add("tensor-data-crc", "38", lambda b: M(b).byte(b["info"][QP].offset + 17, M(b).b[b["info"][QP].offset + 17] ^ 4)
        .bytes(), "ChecksumMismatch", QP)
    add("blob-data-crc", "38", lambda b: M(b).byte(M(b).get_blob(0, "offset") + 2, ord("x")).bytes(),
        "ChecksumMismatch", "TOKENIZER_JSON")
    for bits, label in ((0x7C00, "inf"), (0x7E00, "nan"), (0xBC00, "negative"), (0x8000, "minus-zero")):
        add(f"scale-{label}", "39", lambda b, v=bits: _set_scale(b, QP, 1, v).bytes(), "BadScale", QP)
    # order of 38/39: every CRC first, so a later tensor's or a blob's CRC wins over an earlier tensor's scale
    add("order-scale-then-tensor-crc", "38", lambda b: _set_scale(b, QP, 1, 0xBC00)
        .byte(b["info"][LM].offset + 3, M(b).b[b["info"][LM].offset + 3] ^ 1).bytes(), "ChecksumMismatch", LM)
    add("order-scale-then-blob-crc", "38", lambda b: _set_scale(b, QP, 1, 0xBC00)
        .byte(M(b).get_blob(2, "offset"), ord("x")).bytes(), "ChecksumMismatch", "CHAT_TEMPLATE")
    # int4g layout-2 zero points (rule 39b): 0..15; per tensor, its scales (39) before its zero points (39b)
    KP = L0 + "self_attn.k_proj.weight"
    for value in (16, 255):
        add(f"asym-zero-{value}", "39b", lambda b, v=value: _set_zero(b["asym"], QP, 3, v).bytes(), "BadZero", QP,
            asym=True)
    add("asym-zero-crc-first", "38", lambda b: _set_zero(b["asym"], QP, 3, 16, fix_crc=False).bytes(),
        "ChecksumMismatch", QP, asym=True)
    add("order-zero-then-same-tensor-scale", "39", lambda b: _set_scale(b["asym"], QP, 5, 0x7C00,
        raw=_set_zero(b["asym"], QP, 3, 16).bytes()).bytes(),
        "BadScale", QP, asym=True)
    add("order-zero-then-later-scale", "39b", lambda b: _set_scale(b["asym"], KP, 0, 0x7C00,
        raw=_set_zero(b["asym"], QP, 3, 16).bytes()).bytes(), "BadZero", QP, asym=True)
    # --- blob content (rules 40-41): the file opens; reading the blob fails
    text = lambda b: _blob_text(b, "CHAT_TEMPLATE")  # noqa: E731
    prov = lambda b: _blob_text(b, "PROVENANCE")  # noqa: E731
    for id_, blob, fn in [
            ("text-bom", 2, lambda b: b"\xef\xbb\xbf" + text(b)),
            ("text-invalid-utf8", 2, lambda b: text(b)[:5] + b"\xff" + text(b)[5:]),
            ("text-surrogate", 2, lambda b: text(b) + b"\xed\xa0\x80"),
            ("text-overlong", 2, lambda b: text(b) + b"\xc0\xaf"),
            ("json-bom", 1, lambda b: b"\xef\xbb\xbf" + prov(b)),
            ("json-invalid-utf8", 1, lambda b: prov(b).replace(b"make_vectors", b"make\xffvectors"))]:
        add(id_, "40", lambda b, j=blob, f=fn: M(b).set_blob_bytes(j, f(b)).bytes(), "BadBlobEncoding",
            ["PROVENANCE", "CHAT_TEMPLATE"][blob - 1], read_blob=["PROVENANCE", "CHAT_TEMPLATE"][blob - 1])
    for id_, fn in [
            ("json-nan", lambda b: prov(b).replace(b"1.5", b"NaN")),
            ("json-infinity", lambda b: prov(b).replace(b"12345678", b"Infinity")),
            ("json-minus-infinity", lambda b: prov(b).replace(b"12345678", b"-Infinity")),
            ("json-duplicate-name", lambda b: prov(b).replace(b'"count"', b'"scale"')),
            ("json-duplicate-name-nested", lambda b: prov(b).replace(b"}", b', "inner": {"a": 1, "a": 2}}')),
            ("json-syntax", lambda b: prov(b)[:-1]),
            ("json-two-values", lambda b: prov(b) + b" {}"),
            ("json-whitespace-only", lambda b: b" \n")]:
        add(id_, "41", lambda b, f=fn: M(b).set_blob_bytes(1, f(b)).bytes(), "BadBlobEncoding", "PROVENANCE",
            read_blob="PROVENANCE")
    return c


def _blob_text(b, kind: str) -> bytes:
    return b["desc"]["blobs"][b["blob_idx"][kind]]["text"].encode("utf-8")


def _set_scale(b, name, index, bits, raw=None) -> Mutator:
    """Overwrite scale number `index` of int4g tensor `name` with f16 `bits` (in `raw`, default the base's bytes),
    fix its CRC and the header CRC."""
    t = b["info"][name]
    n, k = t.shape
    pos = t.offset + align128(n * k // 2) + 2 * index
    m = Mutator(b["raw"] if raw is None else raw)
    m.b[pos:pos + 2] = bits.to_bytes(2, "little")
    return m.fix_item_crc("tensor", b["idx"][name])


def _set_zero(b, name, index, value, fix_crc=True) -> Mutator:
    """Overwrite zero point number `index` of int4g layout-2 tensor `name` with `value`; fix its CRC and the header
    CRC unless fix_crc is False."""
    t = b["info"][name]
    n, k = t.shape
    groups = n * (k // t.group_size)
    pos = t.offset + align128(align128(n * k // 2) + 2 * groups) + index
    m = Mutator(b["raw"])
    m.b[pos] = value
    return m.fix_item_crc("tensor", b["idx"][name]) if fix_crc else m


def case_file(case: Case) -> str:
    num = case.rule.rstrip("b")
    return f"{int(num):02d}{case.rule[len(num):]}-{case.id}.nanoqwen"


def write_corpus(out_dir, base_path) -> list:
    """Write every case to out_dir as <rule>-<id>.nanoqwen, and manifest.json; returns the written paths."""
    os.makedirs(out_dir, exist_ok=True)
    base = build_base(base_path)
    cases = {}
    written = []
    for case in corrupt_cases():
        name = case_file(case)
        assert name not in cases, name
        path = os.path.join(out_dir, name)
        with open(path, "wb") as fh:
            fh.write(case.mutate(base))
        entry = {"rule": case.rule, "error": case.error, "mentions": case.mentions}
        if case.asym:
            entry["base"] = f"../{ASYM_BASE_VECTOR}.nanoqwen"
        if case.read_blob:
            entry["read_blob"] = case.read_blob
        cases[name] = entry
        written.append(path)
    manifest = {"base": f"../{os.path.basename(os.fspath(base_path))}",
                "about": "one corrupt file per validation rule of spec/nanoqwen-format.md §12; see ../README.md",
                "cases": dict(sorted(cases.items()))}
    mpath = os.path.join(out_dir, MANIFEST)
    with open(mpath, "w", encoding="utf-8") as fh:
        json.dump(manifest, fh, indent=1)
        fh.write("\n")
    return written + [mpath]
