"""One named error per validation rule; all derive from NanoqwenFormatError (spec §Validation)."""
from __future__ import annotations


class NanoqwenFormatError(Exception):
    """Base class: the file (or what the writer was asked to write) breaks the NANOQWEN spec."""


class BadMagic(NanoqwenFormatError):
    """The first 8 bytes are not b'NANOQWEN'."""


class UnsupportedVersion(NanoqwenFormatError):
    """version != 1."""


class HeaderTooShort(NanoqwenFormatError):
    """The file is shorter than the 256-byte FileHeader, or header_size < 256."""


class HeaderTooLarge(NanoqwenFormatError):
    """n_tensors > 65536, n_blobs > 64 or header_size > 16 MiB."""


class HeaderSizeMismatch(NanoqwenFormatError):
    """header_size != 256 + 136*n_tensors + 64*n_blobs."""


class SizeOverflow(NanoqwenFormatError):
    """shape x dtype or offset + nbytes does not fit in 64 bits."""


class OffsetOutOfRange(NanoqwenFormatError):
    """An item (or the recorded file_size) ends beyond the end of the file / data region."""


class MisalignedOffset(NanoqwenFormatError):
    """An item offset or data_offset is not a multiple of 128."""


class OverlappingTensors(NanoqwenFormatError):
    """An item starts before align128(end of the previous item) (or data before the header end)."""


class HoleInData(NanoqwenFormatError):
    """An item starts after align128(end of the previous item), or file_size > end of the last item."""


class ByteLengthMismatch(NanoqwenFormatError):
    """nbytes != the size the dtype, shape and group size require."""


class DuplicateName(NanoqwenFormatError):
    """Two tensor entries share a name, or two blob entries share a kind."""


class BadTensorName(NanoqwenFormatError):
    """A name field is empty, not printable ASCII, not NUL padded, or 64 bytes without a NUL."""


class UnknownTensorName(NanoqwenFormatError):
    """A tensor name is not among expected_tensors(config)."""


class MissingTensor(NanoqwenFormatError):
    """A tensor required by expected_tensors(config) is absent."""


class UnknownDType(NanoqwenFormatError):
    """dtype not in {0, 1, 2, 3}."""


class UnknownLayout(NanoqwenFormatError):
    """layout_id is not one the dtype allows (0 for plain dtypes, 1 or 2 for int4g)."""


class BadGroupSize(NanoqwenFormatError):
    """group_size != 0 for a plain dtype; or for int4g not in {32,64,128,256} or not dividing K."""


class BadShape(NanoqwenFormatError):
    """ndim outside 1..4 (int4g: != 2), a used dimension of 0."""


class ConfigMismatch(NanoqwenFormatError):
    """A ModelConfig value is invalid (n_layers > MAX_N_LAYERS included), or a tensor shape disagrees with the
    config."""


class UnknownBlobKind(NanoqwenFormatError):
    """Blob kind not in {1..5}."""


class BadBlobEncoding(NanoqwenFormatError):
    """Blob encoding is not the one its kind requires or a JSON blob is empty (at open); or, when the blob is read,
    its bytes are not UTF-8 without a byte-order mark, or not one RFC 8259 JSON value (NaN / Infinity and
    duplicate object names included)."""


class TruncatedFile(NanoqwenFormatError):
    """The file is shorter than header_size or than the recorded file_size."""


class TrailingBytes(NanoqwenFormatError):
    """The file is longer than the recorded file_size."""


class ChecksumMismatch(NanoqwenFormatError):
    """A CRC32C over the header, a tensor or a blob differs from the stored one."""


class BadScale(NanoqwenFormatError):
    """An int4g scale is negative (sign bit set), infinite or NaN (checked with the item checksums)."""


class BadZero(NanoqwenFormatError):
    """An int4g layout-2 zero point is not in 0..15 (checked with the item checksums, after BadScale)."""


class NonZeroReserved(NanoqwenFormatError):
    """A reserved field, unknown flag bit or unused shape slot is not zero."""


class NonZeroPadding(NanoqwenFormatError):
    """A padding byte (before data_offset, between items, inside an int4g tensor) is not zero."""


class WriterUsageError(NanoqwenFormatError):
    """The writer was called out of order, with the wrong dtype/shape, or closed before all items."""
