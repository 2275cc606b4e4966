"""CRC32C (Castagnoli): reflected poly 0x82F63B78, init 0xFFFFFFFF, final xor 0xFFFFFFFF (spec §Checksums).
Fast path: the `crc32c` package (SSE4.2 / ARMv8 instruction). Slow reference: crc32c_reference (bitwise)."""
from __future__ import annotations

import crc32c as _crc32c

CRC32C_POLY_REFLECTED = 0x82F63B78
CRC32C_CHECK = 0xE3069283  # crc32c(b"123456789")


def crc32c(data, value: int = 0) -> int:
    """CRC32C of a bytes-like object; `value` continues a previous result (crc32c(a+b) == crc32c(b, crc32c(a)))."""
    return _crc32c.crc32c(data, value)


def crc32c_reference(data: bytes, value: int = 0) -> int:
    """Bit-by-bit reference, straight from the definition (slow; for tests and the spec)."""
    crc = value ^ 0xFFFFFFFF
    for byte in bytes(data):
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (CRC32C_POLY_REFLECTED if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF
