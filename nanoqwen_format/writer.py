"""Streaming writer: NanoqwenWriter (spec §Writing). Holds at most one tensor; header + directory are written
last (seek to 0) with every CRC; temp file beside the target, fsync, os.replace. Any exception or
KeyboardInterrupt inside the `with` removes the temp file and leaves nothing at the target path.

The temp file is named `.<target name>.tmp-<pid>-<8 hex digits>` (temp_path, which cuts a long target name to fit
255 bytes; TEMP_NAME matches it) and starts with MAGIC from its first write, so a process killed outright (SIGKILL,
power cut) leaves a file that stale_temp_files can attribute: our pattern, our content, our uid, a PID that is no
longer alive."""
from __future__ import annotations

import dataclasses
import os
import re
import secrets
import stat
from typing import Iterable, List, Optional, Sequence

import numpy as np

from .config import ModelConfig, pack_config
from .constants import (BLOB_KIND_ENCODING, FORMAT_VERSION, INT4_MAX_CODE, LAYOUT_INT4_ROWMAJOR_K8_ASYM, MAGIC,
                        MAX_BLOBS, MAX_HEADER_SIZE, MAX_TENSORS, TENSOR_NAME_SIZE, BlobKind, DType, align128)
from .crc import crc32c
from .errors import (BadScale, BadTensorName, BadZero, DuplicateName, HeaderTooLarge, UnknownBlobKind,
                     WriterUsageError)
from .header import RawHeader, header_crc, pack_blob_entry, pack_header, pack_tensor_entry
from .tensors import TensorSpec, int4_parts
from .validate import (check_blob_content, check_names_against_config, check_tensor_meta, decode_name,
                       expected_header_size)

_NP_DTYPE = {DType.F32: np.dtype("<f4"), DType.F16: np.dtype("<f2"), DType.BF16: np.dtype("<u2")}
_CHUNK = 64 * 1024 * 1024  # bytes per write() of a large tensor (bounds the transient copy)
# `.<name>.tmp-<pid>-<token>`: the one definition of the temp-file name (temp_path writes it, TEMP_NAME reads it)
TEMP_NAME = re.compile(r"^\.(?P<name>.+)\.tmp-(?P<pid>[1-9][0-9]*)-(?P<token>[0-9a-f]{8})$")
_FILE_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
               (stat.S_ISREG, "a regular file"))


def file_kind(mode: int) -> str:
    """'a regular file', 'a directory', 'a symbolic link', 'a character device', ... for an lstat st_mode."""
    return next((what for test, what in _FILE_KINDS if test(mode)), "a special file")


_NAME_MAX = 255   # bytes of one file name (ext4, xfs, btrfs, tmpfs)


def temp_path(path, pid: Optional[int] = None) -> str:
    """The hidden temp file NanoqwenWriter writes before renaming it to `path` (same directory). Its <name> is the
    target's name, cut to its first bytes where the whole temp name would pass _NAME_MAX (a valid long target name
    must not make the write fail)."""
    d, base = os.path.split(os.path.abspath(os.fspath(path)))
    tail = f".tmp-{os.getpid() if pid is None else pid}-{secrets.token_hex(4)}"
    name = os.fsencode(base)[:_NAME_MAX - 1 - len(tail)]
    return os.path.join(d, "." + os.fsdecode(name) + tail)


def _blob_kind(k, where: str) -> BlobKind:
    """k as a BlobKind, or UnknownBlobKind (rule 30's error) naming the caller's value."""
    try:
        return BlobKind(int(k))
    except (TypeError, ValueError, OverflowError):
        raise UnknownBlobKind(f"{where}: kind expected one of {[int(b) for b in BlobKind]}, found {k!r}") from None


def _pid_alive(pid: int) -> bool:
    """True unless the PID certainly names no process (a PID of another user's process counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def stale_temp_files(directory) -> List[str]:
    """Temp files in `directory` that a dead writer left: the TEMP_NAME pattern, a regular file owned by this
    uid, content that starts like ours (MAGIC, or shorter than it), and a PID no process has. A live process's
    temp file is never listed. (PIDs are per host and per PID namespace: do not share one output directory
    between machines or containers that write into it at the same time.)"""
    directory = os.fspath(directory)
    out = []
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return out
    for name in names:
        m = TEMP_NAME.match(name)
        if m is None or _pid_alive(int(m["pid"])):
            continue
        full = os.path.join(directory, name)
        try:
            st = os.lstat(full)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
                continue
            with open(full, "rb") as fh:
                head = fh.read(len(MAGIC))
        except OSError:
            continue
        if head == MAGIC[:len(head)]:
            out.append(full)
    return out


def remove_stale_temp_files(directory) -> List[tuple]:
    """Remove stale_temp_files(directory); returns [(path, size in bytes)] of those removed."""
    removed = []
    for full in stale_temp_files(directory):
        try:
            size = os.lstat(full).st_size
            os.unlink(full)
        except OSError:
            continue
        removed.append((full, size))
    return removed


class NanoqwenWriter:
    """with NanoqwenWriter(path, config, tensor_specs, blob_kinds) as w:
           w.write_tensor(name, array)      # plain dtypes, in tensor_specs order (bf16 as uint16 bits)
           w.write_int4(name, qweight_u32 (N, K//8), scales_f16 (N, K//g)[, zeros_u8 (N, K//g) for layout 2])
           w.write_blob(kind, data)         # after all tensors, in blob_kinds order
    Everything the spec can check up front (config, names, shapes, dtypes, group sizes) is checked here."""

    def __init__(self, path, config: ModelConfig, tensor_specs: Sequence[TensorSpec],
                 blob_kinds: Iterable = ()):
        self.path = os.fspath(path)
        self.config = config
        self._config_block = pack_config(config)          # validates the config (ConfigMismatch)
        self.specs: List[TensorSpec] = list(tensor_specs)
        self.blob_kinds: List[BlobKind] = [_blob_kind(k, "blob_kinds") for k in blob_kinds]
        if len(self.specs) > MAX_TENSORS:
            raise HeaderTooLarge(f"n_tensors: expected <= {MAX_TENSORS}, found {len(self.specs)}")
        if len(self.blob_kinds) > MAX_BLOBS:
            raise HeaderTooLarge(f"n_blobs: expected <= {MAX_BLOBS}, found {len(self.blob_kinds)}")
        self.header_size = expected_header_size(len(self.specs), len(self.blob_kinds))
        if self.header_size > MAX_HEADER_SIZE:
            raise HeaderTooLarge(f"header_size: expected <= {MAX_HEADER_SIZE}, found {self.header_size}")
        self.data_offset = align128(self.header_size)
        self._nbytes: List[int] = []
        seen = set()
        for i, s in enumerate(self.specs):
            raw = s.name.encode("ascii", errors="replace") if isinstance(s.name, str) else b""
            if len(raw) >= TENSOR_NAME_SIZE:
                raise BadTensorName(f"tensor spec {i}: name expected <= 63 ASCII bytes, found {len(raw)}")
            decode_name(raw.ljust(TENSOR_NAME_SIZE, b"\0"), f"tensor spec {i}")
            if not s.name.isascii():
                raise BadTensorName(f"tensor spec {i}: name expected ASCII, found {s.name!r}")
            if s.name in seen:
                raise DuplicateName(f"tensor {s.name!r}: expected a unique name, found a duplicate spec")
            seen.add(s.name)
            self._nbytes.append(check_tensor_meta(s.name, int(s.dtype), s.layout_id, s.group_size, s.shape))
        check_names_against_config(((s.name, s.shape) for s in self.specs), config)
        if len(set(self.blob_kinds)) != len(self.blob_kinds):
            raise DuplicateName(f"blob_kinds: expected each kind once, found {[k.name for k in self.blob_kinds]}")
        self._entries: List[bytes] = []        # packed TensorEntry / BlobEntry, in order
        self._blob_entries: List[bytes] = []
        self._next_tensor = 0
        self._next_blob = 0
        self._pos = self.data_offset           # where the next item starts (already aligned)
        self._end = self.data_offset           # end of the last item written
        self._fh = None
        self._tmp: Optional[str] = None
        self._used = False                     # a writer writes one file: its first `with` sets it

    # ---- lifetime -------------------------------------------------------------------------------------------
    def __enter__(self) -> "NanoqwenWriter":
        if self._used:   # a second `with` (or a nested one) would commit the first one's counts over the target
            raise WriterUsageError("writer: expected a fresh writer (one `with` a file), found one entered before; "
                                   "make a new NanoqwenWriter")
        self._used = True
        self._tmp = temp_path(self.path)
        fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            self._fh = os.fdopen(fd, "wb")
        except BaseException:
            os.close(fd)
            self._abort()
            raise
        try:   # placeholder header (MAGIC, then zeros for the rest of it, the directory and padding): rewritten
            self._fh.write(MAGIC + bytes(self.data_offset - len(MAGIC)))   # at commit
        except BaseException:   # ENOSPC, a signal: the `with` body never runs, so clean up here
            self._abort()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            try:
                self._commit()
            except BaseException:
                self._abort()
                raise
        else:
            self._abort()
        return False

    def _abort(self) -> None:
        if self._fh is not None:
            try:
                self._fh.close()
            except OSError:
                pass
            self._fh = None
        if self._tmp is not None:
            try:
                os.unlink(self._tmp)
            except FileNotFoundError:
                pass
            self._tmp = None

    def _commit(self) -> None:
        if self._next_tensor != len(self.specs):
            missing = self.specs[self._next_tensor].name
            raise WriterUsageError(f"writer closed early: expected {len(self.specs)} tensors, found "
                                   f"{self._next_tensor} written (next: {missing!r})")
        if self._next_blob != len(self.blob_kinds):
            raise WriterUsageError(f"writer closed early: expected {len(self.blob_kinds)} blobs, found "
                                   f"{self._next_blob} written (next: {self.blob_kinds[self._next_blob].name})")
        file_size = self._end   # the last item's end: no trailing padding
        hdr = RawHeader(MAGIC, FORMAT_VERSION, self.header_size, file_size, self.data_offset, len(self.specs),
                        len(self.blob_kinds), 0, 0)
        directory = b"".join(self._entries) + b"".join(self._blob_entries)
        head = pack_header(hdr, self._config_block) + directory
        assert len(head) == self.header_size
        hdr = dataclasses.replace(hdr, header_crc32c=header_crc(head))
        head = pack_header(hdr, self._config_block) + directory
        self._fh.seek(0)
        self._fh.write(head)
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        self._fh = None
        try:   # os.replace would put a regular file in place of whatever is there: only ever replace a file
            kind = file_kind(os.lstat(self.path).st_mode)
        except FileNotFoundError:
            kind = None
        if kind not in (None, "a regular file"):
            raise WriterUsageError(f"{self.path}: expected a regular file or nothing to replace, found {kind}")
        os.replace(self._tmp, self.path)
        self._tmp = None
        try:  # make the rename durable
            dfd = os.open(os.path.dirname(os.path.abspath(self.path)), os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError:
            pass

    # ---- items ----------------------------------------------------------------------------------------------
    def _require_open(self):
        if self._fh is None:
            raise WriterUsageError("writer: expected an open writer (`with NanoqwenWriter(...) as w:`), found it "
                                   "not open or already closed")

    def _next_spec(self, name: str) -> TensorSpec:
        self._require_open()
        if self._next_tensor >= len(self.specs):
            raise WriterUsageError(f"tensor {name!r}: expected no more tensors, found all {len(self.specs)} "
                                   f"already written")
        spec = self.specs[self._next_tensor]
        if name != spec.name:
            raise WriterUsageError(f"tensor name: expected the next tensor in tensor_specs order, {spec.name!r}, "
                                   f"found {name!r}")
        return spec

    def _begin_item(self) -> None:
        """Zero padding from the end of the previous item to align128 of it; the next item starts there."""
        self._pos = align128(self._end)
        if self._pos > self._end:
            self._fh.write(bytes(self._pos - self._end))
            self._end = self._pos

    def _write_bytes(self, arr: np.ndarray, crc: int) -> int:
        """Write a C-contiguous array's bytes in chunks; returns the running CRC32C."""
        flat = arr.reshape(-1).view(np.uint8)
        for start in range(0, flat.size, _CHUNK):
            chunk = flat[start:start + _CHUNK]
            self._fh.write(chunk.data)
            crc = crc32c(chunk.data, crc)
        self._end += flat.size
        return crc

    def _finish_tensor(self, spec: TensorSpec, nbytes: int, crc: int) -> None:
        assert self._end - self._pos == nbytes, (spec.name, self._end - self._pos, nbytes)
        self._entries.append(pack_tensor_entry(spec.name, int(spec.dtype), spec.layout_id, spec.group_size,
                                               spec.shape, self._pos, nbytes, crc))
        self._next_tensor += 1

    @staticmethod
    def _as_le(arr, want: np.dtype, shape, what: str) -> np.ndarray:
        a = np.asarray(arr)
        if a.dtype.kind != want.kind or a.dtype.itemsize != want.itemsize:
            raise WriterUsageError(f"{what}: dtype expected {want}, found {a.dtype}")
        if tuple(a.shape) != tuple(shape):
            raise WriterUsageError(f"{what}: shape expected {tuple(shape)}, found {tuple(a.shape)}")
        return np.ascontiguousarray(a, dtype=want)

    def write_tensor(self, name: str, array) -> None:
        """A plain-dtype tensor: F32 float32, F16 float16, BF16 uint16 (the raw bf16 bits)."""
        spec = self._next_spec(name)
        if spec.dtype == DType.INT4G:
            raise WriterUsageError(f"tensor {name!r}: dtype INT4G, expected write_int4(), found write_tensor()")
        a = self._as_le(array, _NP_DTYPE[spec.dtype], spec.shape, f"tensor {name!r}")
        nbytes = self._nbytes[self._next_tensor]
        self._begin_item()
        crc = self._write_bytes(a, 0)
        self._finish_tensor(spec, nbytes, crc)

    def write_int4(self, name: str, qweight, scales, zeros=None) -> None:
        """An INT4G tensor: qweight uint32 (N, K//8), scales float16 (N, K//g) (spec §9.2); for a layout-2 spec
        also zeros uint8 (N, K//g) in 0..15 (spec §9.5), which a layout-1 spec must not be given."""
        spec = self._next_spec(name)
        if spec.dtype != DType.INT4G:
            raise WriterUsageError(f"tensor {name!r}: dtype {spec.dtype.name}, expected write_tensor(), "
                                   f"found write_int4()")
        asym = spec.layout_id == LAYOUT_INT4_ROWMAJOR_K8_ASYM
        if asym != (zeros is not None):
            raise WriterUsageError(f"tensor {name!r}: int4g layout {spec.layout_id}, expected "
                                   f"{'zeros' if asym else 'no zeros'}, found {'none' if asym else 'zeros'}")
        n, k = spec.shape
        groups = k // spec.group_size
        parts = int4_parts(n, k, spec.group_size, spec.layout_id)
        q = self._as_le(qweight, np.dtype("<u4"), (n, k // 8), f"tensor {name!r} qweight")
        s = self._as_le(scales, np.dtype("<f2"), (n, groups), f"tensor {name!r} scales")
        bits = s.view(np.uint16)                        # spec §9.2: finite and >= +0, else the reader rejects it
        bad = np.flatnonzero((bits & 0x8000) | ((bits & 0x7C00) == 0x7C00))
        if bad.size:
            i = int(bad[0])
            raise BadScale(f"tensor {name!r}: scale (flat index {i}) expected finite and >= 0, found "
                           f"{float(s.reshape(-1)[i])} ({bad.size} bad scales)")
        z = None
        if asym:
            z = self._as_le(zeros, np.dtype("u1"), (n, groups), f"tensor {name!r} zeros")
            bad = np.flatnonzero(z > INT4_MAX_CODE)     # spec §9.5: zero points are codes 0..15
            if bad.size:
                i = int(bad[0])
                raise BadZero(f"tensor {name!r}: zero point (flat index {i}) expected 0..{INT4_MAX_CODE}, found "
                              f"{int(z.reshape(-1)[i])} ({bad.size} bad zero points)")
        self._begin_item()
        crc = self._write_bytes(q, 0)
        crc = self._write_zeros(parts.scales_offset - parts.qweight_nbytes, crc)
        crc = self._write_bytes(s, crc)
        if z is not None:
            crc = self._write_zeros(parts.zeros_offset - parts.scales_offset - parts.scales_nbytes, crc)
            crc = self._write_bytes(z, crc)
        self._finish_tensor(spec, self._nbytes[self._next_tensor], crc)

    def _write_zeros(self, count: int, crc: int) -> int:
        """count zero bytes of padding inside an item; returns the running CRC."""
        if count:
            pad = bytes(count)
            self._fh.write(pad)
            crc = crc32c(pad, crc)
            self._end += count
        return crc

    def write_blob(self, kind, data: bytes) -> None:
        """A metadata blob, after all tensors, in blob_kinds order. JSON kinds must be valid UTF-8 JSON,
        text kinds valid UTF-8."""
        self._require_open()
        kind = _blob_kind(kind, "write_blob")
        if self._next_tensor != len(self.specs):
            raise WriterUsageError(f"blob {kind.name}: expected after all tensors, found "
                                   f"{len(self.specs) - self._next_tensor} tensors still unwritten")
        if self._next_blob >= len(self.blob_kinds) or self.blob_kinds[self._next_blob] != kind:
            want = self.blob_kinds[self._next_blob].name if self._next_blob < len(self.blob_kinds) else "none"
            raise WriterUsageError(f"blob kind: expected the next blob in blob_kinds order, {want}, "
                                   f"found {kind.name}")
        data = bytes(data)
        enc = BLOB_KIND_ENCODING[kind]
        check_blob_content(kind, data)   # the reader's rules 31b, 40, 41: never write a blob it would reject
        self._begin_item()
        self._fh.write(data)
        self._end += len(data)
        self._blob_entries.append(pack_blob_entry(int(kind), int(enc), self._pos, len(data), crc32c(data)))
        self._next_blob += 1
