"""Helpers to corrupt a valid .nanoqwen file field by field (offsets from spec §4-§6, §10), re-computing the
header CRC so that a mutation reaches the rule it targets instead of stopping at rule 9."""
from __future__ import annotations

import struct

import crc32c

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
