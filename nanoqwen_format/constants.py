"""Every NANOQWEN v1 constant, in one place. spec/nanoqwen-format.md §Constants lists the same table
(tests/test_format_spec.py::test_constant_tables_match_code parses the spec and compares)."""
from __future__ import annotations

from enum import IntEnum

MAGIC = b"NANOQWEN"                 # 8 bytes at offset 0
FORMAT_VERSION = 1                  # the only version this reader accepts
ALIGNMENT = 128                     # every data item starts at a multiple of this
FILE_HEADER_SIZE = 256              # fixed part of the header
CONFIG_OFFSET = 48                  # ModelConfig block inside the FileHeader
CONFIG_SIZE = 128
TENSOR_ENTRY_SIZE = 136
BLOB_ENTRY_SIZE = 64
TENSOR_NAME_SIZE = 64               # char name[64], NUL padded, at most 63 name bytes
MAX_NDIM = 4
MAX_TENSORS = 65536                 # cap on n_tensors (bounds the directory a reader must parse)
MAX_BLOBS = 64                      # cap on n_blobs
MAX_HEADER_SIZE = 16 * 1024 * 1024  # cap on header_size (16 MiB)
MAX_N_LAYERS = 256  # cap on ModelConfig.n_layers (bounds the per-layer tensor checks)
HEADER_CRC_OFFSET = 40              # u32 header_crc32c, computed with this field as 0

LAYOUT_NONE = 0                     # plain dtypes: row-major, C order, little-endian
LAYOUT_INT4_ROWMAJOR_K8 = 1         # int4g layout id 1 ("rowmajor-k8-interleaved")
LAYOUT_INT4_ROWMAJOR_K8_ASYM = 2    # int4g layout id 2 ("rowmajor-k8-interleaved-asym"): layout 1 + zero points
INT4_LAYOUTS = (LAYOUT_INT4_ROWMAJOR_K8, LAYOUT_INT4_ROWMAJOR_K8_ASYM)  # the layout ids an int4g tensor may use
INT4_PERM = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of a word holds value k = 8j + INT4_PERM[i]
INT4_GROUP_SIZES = (32, 64, 128, 256)  # allowed int4g group sizes (K % g == 0 also required)
INT4_ZERO_CODE = 8                  # layout 1: stored u = q + 8
INT4_MAX_CODE = 15                  # largest 4-bit code; layout 2's zero points lie in 0..INT4_MAX_CODE


class DType(IntEnum):
    F32 = 0
    F16 = 1
    BF16 = 2
    INT4G = 3


# bytes per element of the plain dtypes (int4g has its own size rule: int4_nbytes)
DTYPE_ITEMSIZE = {DType.F32: 4, DType.F16: 2, DType.BF16: 2}


class Arch(IntEnum):
    QWEN2 = 1
    LLAMA = 2


ARCH_NAMES = {Arch.QWEN2: "qwen2", Arch.LLAMA: "llama"}


class RopeScaling(IntEnum):
    NONE = 0
    LINEAR = 1
    YARN = 2


ROPE_SCALING_NAMES = {RopeScaling.NONE: "none", RopeScaling.LINEAR: "linear", RopeScaling.YARN: "yarn"}

CONFIG_FLAG_TIED = 1 << 0
CONFIG_FLAG_QKV_BIAS = 1 << 1
CONFIG_FLAGS_KNOWN = CONFIG_FLAG_TIED | CONFIG_FLAG_QKV_BIAS


class BlobKind(IntEnum):
    TOKENIZER_JSON = 1
    CHAT_TEMPLATE = 2
    GENERATION_CONFIG = 3
    PROVENANCE = 4
    TOKENIZER_CONFIG = 5


class BlobEncoding(IntEnum):
    JSON_UTF8 = 1
    TEXT_UTF8 = 2


# the one encoding each blob kind must carry
BLOB_KIND_ENCODING = {
    BlobKind.TOKENIZER_JSON: BlobEncoding.JSON_UTF8,
    BlobKind.CHAT_TEMPLATE: BlobEncoding.TEXT_UTF8,
    BlobKind.GENERATION_CONFIG: BlobEncoding.JSON_UTF8,
    BlobKind.PROVENANCE: BlobEncoding.JSON_UTF8,
    BlobKind.TOKENIZER_CONFIG: BlobEncoding.JSON_UTF8,
}


def align128(n: int) -> int:
    """Smallest multiple of ALIGNMENT that is >= n."""
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
