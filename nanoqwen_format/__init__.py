"""nanoqwen_format: the NANOQWEN v1 file format (spec/nanoqwen-format.md) — reader, writer, validation.
Pure Python + numpy + crc32c; no torch."""
from .config import ModelConfig
from .constants import (ALIGNMENT, FORMAT_VERSION, LAYOUT_INT4_ROWMAJOR_K8, LAYOUT_INT4_ROWMAJOR_K8_ASYM, MAGIC, BlobEncoding, BlobKind, DType,
                        align128)
from .errors import *  # noqa: F401,F403  (every named error class)
from .errors import NanoqwenFormatError
from .int4_layout import dequantize_int4_asym_reference, dequantize_int4_reference, pack_int4_reference, unpack_int4_reference
from .reader import NanoqwenFile, open_file
from .tensors import TensorInfo, TensorSpec, expected_tensors, int4_nbytes, tensor_nbytes
from .writer import NanoqwenWriter

__all__ = [
    "ModelConfig", "DType", "BlobKind", "BlobEncoding", "TensorSpec", "TensorInfo", "NanoqwenFile", "open_file",
    "NanoqwenWriter", "expected_tensors", "int4_nbytes", "tensor_nbytes", "NanoqwenFormatError", "ALIGNMENT",
    "LAYOUT_INT4_ROWMAJOR_K8", "MAGIC", "FORMAT_VERSION", "align128", "pack_int4_reference",
    "unpack_int4_reference", "dequantize_int4_reference", "dequantize_int4_asym_reference",
    "LAYOUT_INT4_ROWMAJOR_K8_ASYM",
]
