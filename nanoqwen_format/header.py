"""Binary structs of the header and directory (spec §FileHeader, §TensorEntry, §BlobEntry). Pack/unpack only;
validation rules live in validate.py."""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Tuple

from .constants import (BLOB_ENTRY_SIZE, CONFIG_OFFSET, CONFIG_SIZE, FILE_HEADER_SIZE, HEADER_CRC_OFFSET, MAX_NDIM,
                        TENSOR_ENTRY_SIZE, TENSOR_NAME_SIZE)

# magic[8] @0, u32 version @8, u32 header_size @12, u64 file_size @16, u64 data_offset @24, u32 n_tensors @32,
# u32 n_blobs @36, u32 header_crc32c @40, u32 flags @44 ; ModelConfig @48..176 ; reserved zero @176..256
HEADER_PREFIX = struct.Struct("<8s I I Q Q I I I I")
# char name[64] @0; u32 dtype @64, layout_id @68, group_size @72, ndim @76; u64 shape[4] @80; u64 offset @112,
# nbytes @120; u32 crc32c @128; u32 reserved @132
TENSOR_ENTRY = struct.Struct("<64s I I I I 4Q Q Q I I")
# u32 kind @0, u32 encoding @4, u64 offset @8, u64 nbytes @16, u32 crc32c @24, reserved zero @28..64
BLOB_ENTRY_USED = struct.Struct("<I I Q Q I")

assert HEADER_PREFIX.size == CONFIG_OFFSET == 48
assert TENSOR_ENTRY.size == TENSOR_ENTRY_SIZE == 136
assert BLOB_ENTRY_USED.size == 28
HEADER_RESERVED_START = CONFIG_OFFSET + CONFIG_SIZE  # 176
BLOB_RESERVED_START = BLOB_ENTRY_USED.size


@dataclass(frozen=True)
class RawHeader:
    magic: bytes
    version: int
    header_size: int
    file_size: int
    data_offset: int
    n_tensors: int
    n_blobs: int
    header_crc32c: int
    flags: int


@dataclass(frozen=True)
class RawTensorEntry:
    name_bytes: bytes       # 64 raw bytes
    dtype: int
    layout_id: int
    group_size: int
    ndim: int
    shape4: Tuple[int, int, int, int]
    offset: int
    nbytes: int
    crc32c: int
    reserved: int


@dataclass(frozen=True)
class RawBlobEntry:
    kind: int
    encoding: int
    offset: int
    nbytes: int
    crc32c: int
    reserved_bytes: bytes   # 36 raw bytes


def unpack_header_prefix(buf) -> RawHeader:
    return RawHeader(*HEADER_PREFIX.unpack_from(buf, 0))


def pack_header(h: RawHeader, config_block: bytes) -> bytes:
    """256 bytes. The caller computes header_crc32c over the whole header+directory with that field zeroed."""
    assert len(config_block) == CONFIG_SIZE
    out = HEADER_PREFIX.pack(h.magic, h.version, h.header_size, h.file_size, h.data_offset, h.n_tensors,
                             h.n_blobs, h.header_crc32c, h.flags) + config_block
    return out + bytes(FILE_HEADER_SIZE - len(out))


def unpack_tensor_entry(buf, offset: int) -> RawTensorEntry:
    (name, dtype, layout, g, ndim, s0, s1, s2, s3, off, nb, crc, res) = TENSOR_ENTRY.unpack_from(buf, offset)
    return RawTensorEntry(name, dtype, layout, g, ndim, (s0, s1, s2, s3), off, nb, crc, res)


def pack_tensor_entry(name: str, dtype: int, layout_id: int, group_size: int, shape: Tuple[int, ...],
                      offset: int, nbytes: int, crc: int) -> bytes:
    raw = name.encode("ascii")
    assert len(raw) < TENSOR_NAME_SIZE and 1 <= len(shape) <= MAX_NDIM
    shape4 = tuple(shape) + (0,) * (MAX_NDIM - len(shape))
    return TENSOR_ENTRY.pack(raw.ljust(TENSOR_NAME_SIZE, b"\0"), dtype, layout_id, group_size, len(shape), *shape4,
                             offset, nbytes, crc, 0)


def unpack_blob_entry(buf, offset: int) -> RawBlobEntry:
    kind, enc, off, nb, crc = BLOB_ENTRY_USED.unpack_from(buf, offset)
    reserved = bytes(buf[offset + BLOB_RESERVED_START: offset + BLOB_ENTRY_SIZE])
    return RawBlobEntry(kind, enc, off, nb, crc, reserved)


def pack_blob_entry(kind: int, encoding: int, offset: int, nbytes: int, crc: int) -> bytes:
    used = BLOB_ENTRY_USED.pack(kind, encoding, offset, nbytes, crc)
    return used + bytes(BLOB_ENTRY_SIZE - len(used))


def header_crc(header_and_directory: bytes) -> int:
    """CRC32C over [0, header_size) with the u32 at HEADER_CRC_OFFSET taken as zero."""
    from .crc import crc32c
    b = bytearray(header_and_directory)
    b[HEADER_CRC_OFFSET:HEADER_CRC_OFFSET + 4] = b"\0\0\0\0"
    return crc32c(bytes(b))
