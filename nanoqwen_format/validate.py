"""Every validation rule of spec §12, in the spec's order: rules 1-39 at open (parse_file, verify_items), the blob
content rules 40-41 when a blob is read (decode_blob_text, parse_blob_json). Used by the reader (whole file) and
the writer (the parts it can check before writing). Never allocates more than the header (<= file size, <= 16 MiB)
and the blob being read."""
from __future__ import annotations

import json
from typing import Dict, Iterable, Optional, Tuple

import numpy as np

from .config import ModelConfig, unpack_config
from .constants import (BLOB_ENTRY_SIZE, BLOB_KIND_ENCODING, CONFIG_OFFSET, CONFIG_SIZE, FILE_HEADER_SIZE,
                        FORMAT_VERSION, INT4_GROUP_SIZES, INT4_LAYOUTS, INT4_MAX_CODE,
                        LAYOUT_INT4_ROWMAJOR_K8_ASYM, LAYOUT_NONE, MAGIC, MAX_BLOBS,
                        MAX_HEADER_SIZE, MAX_NDIM, MAX_TENSORS, TENSOR_ENTRY_SIZE, BlobEncoding, BlobKind, DType,
                        align128)
from .crc import crc32c
from .errors import (BadBlobEncoding, BadGroupSize, BadMagic, BadScale, BadShape, BadZero, BadTensorName, ByteLengthMismatch,
                     ChecksumMismatch, ConfigMismatch, DuplicateName, HeaderSizeMismatch, HeaderTooLarge,
                     HeaderTooShort, HoleInData, MisalignedOffset, MissingTensor, NonZeroPadding, NonZeroReserved,
                     OffsetOutOfRange, OverlappingTensors, SizeOverflow, TrailingBytes, TruncatedFile,
                     UnknownBlobKind, UnknownDType, UnknownLayout, UnknownTensorName, UnsupportedVersion)
from .header import (HEADER_RESERVED_START, header_crc, unpack_blob_entry, unpack_header_prefix,
                     unpack_tensor_entry)
from .tensors import (TensorInfo, expected_shape, expected_tensor_count, int4_parts, iter_expected_tensors,
                      tensor_nbytes)

U64_LIMIT = 2**64


def expected_header_size(n_tensors: int, n_blobs: int) -> int:
    return FILE_HEADER_SIZE + TENSOR_ENTRY_SIZE * n_tensors + BLOB_ENTRY_SIZE * n_blobs


def decode_name(raw: bytes, where: str) -> str:
    """char name[64]: 1..63 printable ASCII bytes (0x21..0x7E), then NUL bytes to the end."""
    end = raw.find(b"\0")
    if end < 0:
        raise BadTensorName(f"{where}.name: expected a NUL within 64 bytes (name <= 63 bytes), found none")
    if end == 0:
        raise BadTensorName(f"{where}.name: expected 1..63 name bytes, found an empty name")
    body = raw[:end]
    if any(b < 0x21 or b > 0x7E for b in body):
        raise BadTensorName(f"{where}.name: expected printable ASCII 0x21..0x7E, found {body!r}")
    if any(raw[end:]):
        raise BadTensorName(f"{where}.name: expected NUL padding after {body.decode('ascii')!r}, "
                            f"found non-zero bytes {raw[end:]!r}")
    return body.decode("ascii")


def check_tensor_meta(name: str, dtype: int, layout_id: int, group_size: int, shape: Tuple[int, ...]) -> int:
    """dtype, layout, shape and group-size rules for one tensor; returns its exact nbytes (< 2^64)."""
    if dtype not in DType._value2member_map_:
        raise UnknownDType(f"tensor {name!r}: dtype expected 0 (f32), 1 (f16), 2 (bf16) or 3 (int4g), found {dtype}")
    want_layouts = INT4_LAYOUTS if dtype == DType.INT4G else (LAYOUT_NONE,)
    if layout_id not in want_layouts:
        want = " or ".join(str(x) for x in want_layouts)
        raise UnknownLayout(f"tensor {name!r}: layout_id for dtype {DType(dtype).name} expected {want}, "
                            f"found {layout_id}")
    if not 1 <= len(shape) <= MAX_NDIM:
        raise BadShape(f"tensor {name!r}: ndim expected 1..{MAX_NDIM}, found {len(shape)}")
    if any(d <= 0 for d in shape):
        raise BadShape(f"tensor {name!r}: every dimension expected >= 1, found shape {tuple(shape)}")
    if dtype == DType.INT4G:
        if len(shape) != 2:
            raise BadShape(f"tensor {name!r}: int4g ndim expected 2, found {len(shape)}")
        k = shape[1]
        if group_size not in INT4_GROUP_SIZES:
            raise BadGroupSize(f"tensor {name!r}: int4g group_size expected one of {INT4_GROUP_SIZES}, "
                               f"found {group_size}")
        if k % group_size != 0:
            raise BadGroupSize(f"tensor {name!r}: K={k} expected to be a multiple of group_size={group_size}, "
                               f"found remainder {k % group_size}")
    elif group_size != 0:
        raise BadGroupSize(f"tensor {name!r}: group_size for dtype {DType(dtype).name} expected 0, "
                           f"found {group_size}")
    nbytes = tensor_nbytes(dtype, tuple(shape), group_size, layout_id)
    if nbytes >= U64_LIMIT:
        raise SizeOverflow(f"tensor {name!r}: byte length of shape {tuple(shape)} x {DType(dtype).name} "
                           f"expected < 2^64, found {nbytes}")
    return nbytes


def check_names_against_config(items: Iterable[Tuple[str, Tuple[int, ...]]], cfg: ModelConfig) -> None:
    """Rules 35-37 (spec §12): per item in order, its name is in §7's set for cfg (UnknownTensorName), then its
    shape is §7's (ConfigMismatch); then no name of the set is absent (MissingTensor). Runs in O(len(items)),
    whatever cfg.n_layers says: the names are unique members of the set, so the set is complete exactly when
    their count is the set's size, and the first absent name in canonical order is among its first
    len(items) + 1 names."""
    seen = set()
    for name, shape in items:
        want = expected_shape(cfg, name)
        if want is None:
            raise UnknownTensorName(f"tensor {name!r}: expected one of the {expected_tensor_count(cfg)} names of this "
                                    f"config (arch={cfg.arch}, n_layers={cfg.n_layers}, tied={cfg.tied_embeddings}, "
                                    f"qkv_bias={cfg.qkv_bias}), found an unknown name")
        if tuple(shape) != want:
            raise ConfigMismatch(f"tensor {name!r}: shape expected {want} from the config, found {tuple(shape)}")
        seen.add(name)
    need = expected_tensor_count(cfg)
    if len(seen) < need:
        missing = next(name for name, _ in iter_expected_tensors(cfg) if name not in seen)
        raise MissingTensor(f"tensor {missing!r}: expected (config requires {need} tensors, the file holds "
                            f"{len(seen)}), found absent")


def _first_nonzero(buf, start: int, end: int) -> Optional[int]:
    chunk = bytes(buf[start:end])
    if not any(chunk):
        return None
    return start + next(i for i, b in enumerate(chunk) if b)


def _check_zero(buf, start: int, end: int, what: str) -> None:
    pos = _first_nonzero(buf, start, end)
    if pos is not None:
        raise NonZeroPadding(f"{what} [{start}, {end}): expected zero bytes, found {buf[pos]:#04x} at offset {pos}")


def _place_item(buf, what: str, offset: int, nbytes: int, expected_offset: int, file_size: int) -> int:
    """Placement rules for one data item; returns its end."""
    if offset + nbytes >= U64_LIMIT:
        raise SizeOverflow(f"{what}: offset + nbytes expected < 2^64, found {offset} + {nbytes} = {offset + nbytes}")
    if offset % 128 != 0:
        raise MisalignedOffset(f"{what}: offset expected a multiple of 128, found {offset} (remainder {offset % 128})")
    if offset < expected_offset:
        raise OverlappingTensors(f"{what}: offset expected {expected_offset} (align128 of the previous item's end), "
                                 f"found {offset}, overlapping the previous item")
    if offset > expected_offset:
        raise HoleInData(f"{what}: offset expected {expected_offset} (align128 of the previous item's end), "
                         f"found {offset}, leaving a hole")
    end = offset + nbytes
    if end > file_size:
        raise OffsetOutOfRange(f"{what}: end (offset + nbytes) expected <= file_size {file_size}, found {end}")
    return end


def parse_file(buf, file_len: int, verify_checksums: bool):
    """Validate a whole file given as a bytes-like `buf` of length file_len.
    Returns (RawHeader, ModelConfig, {name: TensorInfo}, {BlobKind: (offset, nbytes, crc32c)})."""
    # 1. magic, fixed header
    if file_len < len(MAGIC):
        raise HeaderTooShort(f"file: expected at least {FILE_HEADER_SIZE} bytes, found {file_len}")
    if bytes(buf[:len(MAGIC)]) != MAGIC:
        raise BadMagic(f"magic: expected {MAGIC!r}, found {bytes(buf[:len(MAGIC)])!r}")
    if file_len < FILE_HEADER_SIZE:
        raise HeaderTooShort(f"file: expected at least {FILE_HEADER_SIZE} bytes for the FileHeader, found {file_len}")
    h = unpack_header_prefix(buf)
    if h.version != FORMAT_VERSION:
        raise UnsupportedVersion(f"version: expected {FORMAT_VERSION}, found {h.version}")
    # 2. header size and caps
    if h.header_size < FILE_HEADER_SIZE:
        raise HeaderTooShort(f"header_size: expected >= {FILE_HEADER_SIZE}, found {h.header_size}")
    if h.n_tensors > MAX_TENSORS:
        raise HeaderTooLarge(f"n_tensors: expected <= {MAX_TENSORS}, found {h.n_tensors}")
    if h.n_blobs > MAX_BLOBS:
        raise HeaderTooLarge(f"n_blobs: expected <= {MAX_BLOBS}, found {h.n_blobs}")
    if h.header_size > MAX_HEADER_SIZE:
        raise HeaderTooLarge(f"header_size: expected <= {MAX_HEADER_SIZE}, found {h.header_size}")
    want_hs = expected_header_size(h.n_tensors, h.n_blobs)
    if h.header_size != want_hs:
        raise HeaderSizeMismatch(f"header_size: expected 256 + 136*{h.n_tensors} + 64*{h.n_blobs} = {want_hs}, "
                                 f"found {h.header_size}")
    if h.header_size > file_len:
        raise TruncatedFile(f"file: expected at least header_size={h.header_size} bytes, found {file_len}")
    # 3. header checksum (always checked: the header is small)
    head = bytes(buf[:h.header_size])
    got_crc = header_crc(head)
    if got_crc != h.header_crc32c:
        raise ChecksumMismatch(f"header_crc32c: expected {h.header_crc32c:#010x} (stored), "
                               f"found {got_crc:#010x} (computed over [0, {h.header_size}))")
    # 4. flags, reserved, config
    if h.flags != 0:
        raise NonZeroReserved(f"flags: expected 0 in version 1, found {h.flags:#010x}")
    pos = _first_nonzero(head, HEADER_RESERVED_START, FILE_HEADER_SIZE)
    if pos is not None:
        raise NonZeroReserved(f"header reserved bytes [176, 256): expected zero, found {head[pos]:#04x} at {pos}")
    cfg = unpack_config(head[CONFIG_OFFSET:CONFIG_OFFSET + CONFIG_SIZE])
    # 5. file size and data offset
    if h.file_size > file_len:
        raise TruncatedFile(f"file: expected file_size={h.file_size} bytes, found {file_len}")
    if h.file_size < file_len:
        raise TrailingBytes(f"file: expected file_size={h.file_size} bytes, found {file_len} "
                            f"({file_len - h.file_size} trailing bytes)")
    want_do = align128(h.header_size)
    if h.data_offset % 128 != 0:
        raise MisalignedOffset(f"data_offset: expected a multiple of 128, found {h.data_offset}")
    if h.data_offset < want_do:
        raise OverlappingTensors(f"data_offset: expected align128(header_size) = {want_do}, found {h.data_offset} "
                                 f"(overlaps the directory)")
    if h.data_offset > want_do:
        raise HoleInData(f"data_offset: expected align128(header_size) = {want_do}, found {h.data_offset}")
    if h.data_offset > h.file_size:
        raise OffsetOutOfRange(f"data_offset: expected <= file_size {h.file_size}, found {h.data_offset}")
    _check_zero(buf, h.header_size, h.data_offset, "padding after the directory")
    # 6. tensor entries
    tensors: Dict[str, TensorInfo] = {}
    cursor = h.data_offset   # where the next item must start
    prev_end = h.data_offset
    for i in range(h.n_tensors):
        e = unpack_tensor_entry(head, FILE_HEADER_SIZE + i * TENSOR_ENTRY_SIZE)
        where = f"tensor entry {i}"
        name = decode_name(e.name_bytes, where)
        where = f"tensor {name!r} (entry {i})"
        if name in tensors:
            raise DuplicateName(f"{where}: expected a unique name, found a duplicate of an earlier entry")
        if e.dtype not in DType._value2member_map_:
            raise UnknownDType(f"{where}: dtype expected 0..3, found {e.dtype}")
        if not 1 <= e.ndim <= MAX_NDIM:
            raise BadShape(f"{where}: ndim expected 1..{MAX_NDIM}, found {e.ndim}")
        if any(e.shape4[e.ndim:]):
            raise NonZeroReserved(f"{where}: unused shape slots [{e.ndim}:4] expected 0, found {e.shape4}")
        if e.reserved != 0:
            raise NonZeroReserved(f"{where}: reserved expected 0, found {e.reserved:#010x}")
        shape = tuple(e.shape4[:e.ndim])
        want_nb = check_tensor_meta(name, e.dtype, e.layout_id, e.group_size, shape)
        if e.nbytes != want_nb:
            raise ByteLengthMismatch(f"{where}: nbytes expected {want_nb} for {DType(e.dtype).name} {shape}"
                                     f"{' g' + str(e.group_size) if e.dtype == DType.INT4G else ''}, "
                                     f"found {e.nbytes}")
        end = _place_item(buf, where, e.offset, e.nbytes, cursor, h.file_size)
        _check_zero(buf, prev_end, e.offset, f"padding before {where}")
        if e.dtype == DType.INT4G:
            n, k = shape
            parts = int4_parts(n, k, e.group_size, e.layout_id)
            _check_zero(buf, e.offset + parts.qweight_nbytes, e.offset + parts.scales_offset,
                        f"{where} padding between qweight and scales")
            if e.layout_id == LAYOUT_INT4_ROWMAJOR_K8_ASYM:
                _check_zero(buf, e.offset + parts.scales_offset + parts.scales_nbytes, e.offset + parts.zeros_offset,
                            f"{where} padding between scales and zeros")
        tensors[name] = TensorInfo(name=name, dtype=DType(e.dtype), shape=shape, offset=e.offset, nbytes=e.nbytes,
                                   crc32c=e.crc32c, group_size=e.group_size, layout_id=e.layout_id)
        prev_end, cursor = end, align128(end)
    # 7. blob entries
    blobs: Dict[BlobKind, Tuple[int, int, int]] = {}
    base = FILE_HEADER_SIZE + h.n_tensors * TENSOR_ENTRY_SIZE
    for i in range(h.n_blobs):
        b = unpack_blob_entry(head, base + i * BLOB_ENTRY_SIZE)
        where = f"blob entry {i}"
        if b.kind not in BlobKind._value2member_map_:
            raise UnknownBlobKind(f"{where}: kind expected 1..5, found {b.kind}")
        kind = BlobKind(b.kind)
        where = f"blob {kind.name} (entry {i})"
        if kind in blobs:
            raise DuplicateName(f"{where}: expected one blob per kind, found a duplicate")
        want_enc = BLOB_KIND_ENCODING[kind]
        if b.encoding != want_enc:
            raise BadBlobEncoding(f"{where}: encoding expected {int(want_enc)} ({want_enc.name}), found {b.encoding}")
        if want_enc == BlobEncoding.JSON_UTF8 and b.nbytes == 0:
            raise BadBlobEncoding(f"{where}: nbytes expected >= 1 (a JSON blob holds one JSON value), found 0")
        if any(b.reserved_bytes):
            raise NonZeroReserved(f"{where}: reserved bytes [28, 64) expected zero, found {b.reserved_bytes!r}")
        end = _place_item(buf, where, b.offset, b.nbytes, cursor, h.file_size)
        _check_zero(buf, prev_end, b.offset, f"padding before {where}")
        blobs[kind] = (b.offset, b.nbytes, b.crc32c)
        prev_end, cursor = end, align128(end)
    # 8. file ends at the last item
    if h.file_size != prev_end:
        # prev_end <= file_size is guaranteed by _place_item
        raise HoleInData(f"file_size: expected the end of the last item = {prev_end}, found {h.file_size}")
    # 9. names and shapes vs config
    check_names_against_config(((t.name, t.shape) for t in tensors.values()), cfg)
    if verify_checksums:
        verify_items(buf, tensors, blobs)
    return h, cfg, tensors, blobs


def verify_items(buf, tensors: Dict[str, TensorInfo], blobs) -> None:
    """CRC32C of every tensor then every blob (ChecksumMismatch naming the first bad one), then the int4g scale
    rule (BadScale): every scale's f16 sign bit is clear and its exponent is not all ones, and for layout 2 the
    zero-point rule (BadZero) on the same tensor right after."""
    for t in tensors.values():
        got = crc32c(buf[t.offset:t.offset + t.nbytes])
        if got != t.crc32c:
            raise ChecksumMismatch(f"tensor {t.name!r}: crc32c expected {t.crc32c:#010x} (stored), "
                                   f"found {got:#010x} (computed)")
    for kind, (off, nb, crc) in blobs.items():
        got = crc32c(buf[off:off + nb])
        if got != crc:
            raise ChecksumMismatch(f"blob {kind.name}: crc32c expected {crc:#010x} (stored), found {got:#010x} "
                                   f"(computed)")
    for t in tensors.values():
        if t.dtype == DType.INT4G:
            check_int4_scales(buf, t)
            if t.layout_id == LAYOUT_INT4_ROWMAJOR_K8_ASYM:
                check_int4_zeros(buf, t)


def check_int4_scales(buf, t: TensorInfo) -> None:
    """Spec §9.2: int4g scales are finite and >= +0 (f16 bits: sign clear, exponent != 0x1F)."""
    n, k = t.shape
    count = n * (k // t.group_size)
    bits = np.frombuffer(buf, dtype="<u2", count=count, offset=t.offset + align128(n * k // 2))  # (N*K/g,)
    bad = np.flatnonzero((bits & 0x8000) | ((bits & 0x7C00) == 0x7C00))
    if bad.size:
        i = int(bad[0])
        value = float(np.array([bits[i]], dtype=np.uint16).view(np.float16)[0])
        raise BadScale(f"tensor {t.name!r}: scale [{i // (k // t.group_size)}][{i % (k // t.group_size)}] "
                       f"expected finite and >= 0, found {value} (f16 bits {int(bits[i]):#06x}; "
                       f"{bad.size} bad scales)")


def check_int4_zeros(buf, t: TensorInfo) -> None:
    """Spec §9.5: int4g layout-2 zero points are codes, 0..INT4_MAX_CODE."""
    n, k = t.shape
    parts = int4_parts(n, k, t.group_size, t.layout_id)
    z = np.frombuffer(buf, dtype=np.uint8, count=parts.zeros_nbytes, offset=t.offset + parts.zeros_offset)
    bad = np.flatnonzero(z > INT4_MAX_CODE)
    if bad.size:
        i = int(bad[0])
        raise BadZero(f"tensor {t.name!r}: zero point [{i // (k // t.group_size)}][{i % (k // t.group_size)}] "
                      f"expected 0..{INT4_MAX_CODE}, found {int(z[i])} ({bad.size} bad zero points)")


# ---- blob content (rules 40-41): applied when a blob's content is read, not at open --------------------------
UTF8_BOM = b"\xef\xbb\xbf"


def decode_blob_text(kind: BlobKind, data: bytes) -> str:
    """Rule 40: the bytes are UTF-8 (RFC 3629: no overlong forms, surrogates or code points > U+10FFFF) and do not
    start with a byte-order mark."""
    if data.startswith(UTF8_BOM):
        raise BadBlobEncoding(f"blob {kind.name}: expected UTF-8 without a byte-order mark, found EF BB BF at 0")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadBlobEncoding(f"blob {kind.name}: expected UTF-8, found invalid byte {data[e.start]:#04x} at "
                              f"{e.start}") from None


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON (RFC 8259 has no NaN or Infinity)")


def _object_without_duplicates(pairs):
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"duplicate object name {key!r}")
            seen.add(key)
    return obj


def parse_blob_json(kind: BlobKind, text: str):
    """Rule 41: the text is exactly one JSON value (RFC 8259, whitespace around it allowed), without the non-JSON
    literals NaN / Infinity / -Infinity and without a name twice in one object."""
    try:
        return json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_object_without_duplicates)
    except RecursionError:
        raise BadBlobEncoding(f"blob {kind.name}: expected JSON nested at most as deep as this reader supports, "
                              f"found deeper nesting") from None
    except ValueError as e:
        raise BadBlobEncoding(f"blob {kind.name}: expected one JSON value (RFC 8259), found: {e}") from None


def check_blob_content(kind, data: bytes) -> None:
    """Rules 40-41 for one blob of kind `kind` (what a writer checks before writing it)."""
    kind = BlobKind(int(kind))
    text = decode_blob_text(kind, data)
    if BLOB_KIND_ENCODING[kind] == BlobEncoding.JSON_UTF8:
        parse_blob_json(kind, text)
