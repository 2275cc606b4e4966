"""Memory-mapped reader: open_file(path) validates everything (spec §Validation) and hands out zero-copy views."""
from __future__ import annotations

import errno
import mmap
import os
import stat
from typing import Dict, Optional, Tuple

import numpy as np

from .config import ModelConfig
from .constants import FILE_HEADER_SIZE, LAYOUT_INT4_ROWMAJOR_K8, LAYOUT_INT4_ROWMAJOR_K8_ASYM, BlobKind, DType
from .errors import NanoqwenFormatError
from .int4_layout import dequantize_int4_asym_reference, dequantize_int4_reference
from .tensors import TensorInfo, int4_parts
from .validate import check_int4_scales, check_int4_zeros, decode_blob_text, parse_blob_json, parse_file, verify_items

_NP_DTYPE = {DType.F32: np.dtype("<f4"), DType.F16: np.dtype("<f2"), DType.BF16: np.dtype("<u2")}


class NanoqwenFile:
    """An open, fully validated .nanoqwen file. Use as a context manager or call close().
    Arrays it returns are read-only views into the mmap; they stay valid after close() (the mapping is released
    when the last view dies)."""

    def __init__(self, path, verify_checksums: bool = True):
        self.path = os.fspath(path)
        self._mm: Optional[mmap.mmap] = None
        self._mv: Optional[memoryview] = None
        self.config: ModelConfig
        self.tensors: Dict[str, TensorInfo]
        if not stat.S_ISREG(os.stat(self.path).st_mode):   # open() would block on a FIFO until a writer came
            raise OSError(errno.EINVAL, "not a regular file", self.path)
        with open(self.path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size < FILE_HEADER_SIZE:
                buf = fh.read(size)   # too short to map usefully; parse_file raises on it
                parse_file(buf, len(buf), verify_checksums)
                raise AssertionError("unreachable: parse_file accepted a file shorter than the header")
            self._mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            self._mv = memoryview(self._mm)
            self._header, self.config, self.tensors, self._blobs = parse_file(self._mv, size, verify_checksums)
        except BaseException:
            self.close()
            raise
        self.file_size: int = self._header.file_size
        self.version: int = self._header.version
        self.header_size: int = self._header.header_size
        self.data_offset: int = self._header.data_offset

    # ---- lifetime -------------------------------------------------------------------------------------------
    def close(self) -> None:
        if self._mv is not None:
            try:
                self._mv.release()
            except BufferError:
                pass
            self._mv = None
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:
                pass  # numpy views still alive: the mapping goes away with the last of them
            self._mm = None

    def __enter__(self) -> "NanoqwenFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _buf(self):
        if self._mm is None:
            raise ValueError(f"{self.path}: file is closed")
        return self._mm

    def _info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor named {name!r}") from None

    # ---- tensors --------------------------------------------------------------------------------------------
    def array(self, name: str) -> np.ndarray:
        """Zero-copy read-only view: F32 -> float32, F16 -> float16, BF16 -> uint16 raw bits, all with the
        tensor's shape. INT4G -> the tensor's raw bytes, uint8 (nbytes,) (use int4() for the parts)."""
        t = self._info(name)
        if t.dtype == DType.INT4G:
            return np.frombuffer(self._buf(), dtype=np.uint8, count=t.nbytes, offset=t.offset)
        dt = _NP_DTYPE[t.dtype]
        count = t.nbytes // dt.itemsize
        return np.frombuffer(self._buf(), dtype=dt, count=count, offset=t.offset).reshape(t.shape)

    def _int4_info(self, name: str, layout_id: int, method: str) -> TensorInfo:
        t = self._info(name)
        if t.dtype != DType.INT4G:
            raise TypeError(f"tensor {name!r}: {method}() needs dtype INT4G, found {t.dtype.name}")
        if t.layout_id != layout_id:
            raise TypeError(f"tensor {name!r}: {method}() needs int4g layout {layout_id}, found layout {t.layout_id}")
        return t

    def _int4_views(self, t: TensorInfo) -> Tuple[np.ndarray, np.ndarray]:
        n, k = t.shape
        parts = int4_parts(n, k, t.group_size, t.layout_id)
        q = np.frombuffer(self._buf(), dtype="<u4", count=n * k // 8, offset=t.offset).reshape(n, k // 8)
        s = np.frombuffer(self._buf(), dtype="<f2", count=n * (k // t.group_size), offset=t.offset + parts.scales_offset)
        return q, s.reshape(n, k // t.group_size)

    def int4(self, name: str) -> Tuple[np.ndarray, np.ndarray]:
        """(qweight uint32 (N, K//8), scales float16 (N, K//g)), zero-copy views of an INT4G layout-1 tensor.
        A layout-2 tensor raises TypeError (its codes mean nothing without its zero points: use int4_asym())."""
        return self._int4_views(self._int4_info(name, LAYOUT_INT4_ROWMAJOR_K8, "int4"))

    def int4_asym(self, name: str) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(qweight uint32 (N, K//8), scales float16 (N, K//g), zeros uint8 (N, K//g)), zero-copy views of an
        INT4G layout-2 tensor (spec §9.5)."""
        t = self._int4_info(name, LAYOUT_INT4_ROWMAJOR_K8_ASYM, "int4_asym")
        q, s = self._int4_views(t)
        n, k = t.shape
        parts = int4_parts(n, k, t.group_size, t.layout_id)
        z = np.frombuffer(self._buf(), dtype=np.uint8, count=parts.zeros_nbytes, offset=t.offset + parts.zeros_offset)
        return q, s, z.reshape(n, k // t.group_size)

    def float32(self, name: str) -> np.ndarray:
        """A float32 copy with the tensor's shape: bf16 widened exactly, int4g dequantized (§9.1 for layout 1,
        §9.5 for layout 2)."""
        t = self._info(name)
        if t.dtype == DType.INT4G:
            # rules 39-39b (BadScale, BadZero) for this tensor even where open skipped them (verify_checksums=False),
            # so the reference dequantization never returns a NaN or raises anything but a named error
            check_int4_scales(self._buf(), t)
            if t.layout_id == LAYOUT_INT4_ROWMAJOR_K8_ASYM:
                check_int4_zeros(self._buf(), t)
                q, s, z = self.int4_asym(name)
                return dequantize_int4_asym_reference(q, s, z, t.group_size)
            q, s = self.int4(name)
            return dequantize_int4_reference(q, s, t.group_size)
        a = self.array(name)
        if t.dtype == DType.BF16:
            return (a.astype(np.uint32) << np.uint32(16)).view(np.float32)
        return a.astype(np.float32)

    # ---- blobs ----------------------------------------------------------------------------------------------
    @property
    def blob_kinds(self) -> Tuple[BlobKind, ...]:
        return tuple(self._blobs)

    def blob(self, kind) -> Optional[bytes]:
        entry = self._blobs.get(BlobKind(kind))
        if entry is None:
            return None
        off, nb, _ = entry
        return bytes(self._buf()[off:off + nb])

    def blob_text(self, kind) -> Optional[str]:
        """The blob as text (rule 40: UTF-8 without a byte-order mark, else BadBlobEncoding); None if absent."""
        raw = self.blob(kind)
        if raw is None:
            return None
        return decode_blob_text(BlobKind(kind), raw)

    def blob_json(self, kind):
        """The blob parsed as JSON (rules 40-41, else BadBlobEncoding); None if absent."""
        text = self.blob_text(kind)
        if text is None:
            return None
        return parse_blob_json(BlobKind(kind), text)

    # ---- checks ---------------------------------------------------------------------------------------------
    def verify_checksums(self) -> None:
        """CRC32C of every tensor and blob (ChecksumMismatch naming the first bad one), then the int4g scale rule
        (BadScale)."""
        self._buf()  # raises if closed
        verify_items(self._mv, self.tensors, self._blobs)


def open_file(path, verify_checksums: bool = True) -> NanoqwenFile:
    """Open and validate a .nanoqwen file (every structural rule; CRC32C of each tensor/blob unless
    verify_checksums=False; the header CRC is always checked). Raises a NanoqwenFormatError subclass."""
    return NanoqwenFile(path, verify_checksums=verify_checksums)


__all__ = ["NanoqwenFile", "open_file", "NanoqwenFormatError"]
