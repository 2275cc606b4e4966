#!/usr/bin/env python3
"""Generate csrc/src/format_contract.h from the Python package, the one source of the facts that Python, the C++
library and ctypes share (nanoqwen_format.constants, the header/config struct layouts, nanoqwen_format.shapes).

    python scripts/gen_contract.py          # rewrite the header (temp file + rename)
    python scripts/gen_contract.py --check  # exit 1 when the committed header differs

facts() is also what the library's nq_abi_describe() must report under "format" (tests/test_contract.py).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nanoqwen_format import config as _config  # noqa: E402
from nanoqwen_format import constants as C  # noqa: E402
from nanoqwen_format import header as _header  # noqa: E402
from nanoqwen_format import shapes as _shapes  # noqa: E402

OUT = ROOT / "csrc" / "src" / "format_contract.h"

# Names of the ModelConfig struct's items, in the order of nanoqwen_format.config._CONFIG_STRUCT (its comment
# names them; the item count is checked against the format below).
CONFIG_FIELDS = ("arch", "n_layers", "hidden_size", "intermediate_size", "n_heads", "n_kv_heads", "head_dim",
                 "vocab_rows", "max_positions", "config_flags", "rope_theta", "rope_scaling_type",
                 "rope_scaling_factor", "rope_original_max_positions", "rms_norm_eps", "bos_token_id",
                 "eos_token_id", "pad_token_id")


def _offsets(st: struct.Struct, names, arrays=()) -> dict[str, int]:
    """{name: byte offset} of the items of a little-endian, unpadded struct format, one name per item ("10I" is ten
    items); a name in `arrays` takes all n values of its code instead, as name_0 .. name_{n-1} (e.g. shape4 = 4Q)."""
    fmt = st.format if isinstance(st.format, str) else st.format.decode()
    assert fmt[0] == "<", fmt
    out, off, names = {}, 0, list(names)
    for count, code in re.findall(r"(\d*)([xcbB?hHiIlLqQnNefdspP])", fmt[1:]):
        n = int(count or 1)
        if code in "sp":
            out[names.pop(0)] = off
            off += n
            continue
        step = struct.calcsize("<" + code)
        if names[0] in arrays:
            name = names.pop(0)
            for i in range(n):
                out[f"{name}_{i}"] = off + i * step
            off += n * step
            continue
        for _ in range(n):
            out[names.pop(0)] = off
            off += step
    assert not names, f"unused field names {names}"
    assert off == st.size
    return out


def facts() -> dict:
    """Every shared fact as a JSON-able dict (the shape nq_abi_describe()'s "format" object has)."""
    header = _offsets(_header.HEADER_PREFIX, [f.name for f in dataclasses.fields(_header.RawHeader)])
    tensor = _offsets(_header.TENSOR_ENTRY, ["name"] + [f.name for f in dataclasses.fields(_header.RawTensorEntry)][1:],
                      arrays=("shape4",))
    tensor = {("shape" + k[len("shape4"):] if k.startswith("shape4") else k): v for k, v in tensor.items()}
    blob = _offsets(_header.BLOB_ENTRY_USED, [f.name for f in dataclasses.fields(_header.RawBlobEntry)][:5])
    config = _offsets(_config._CONFIG_STRUCT, CONFIG_FIELDS)
    return {
        "magic": C.MAGIC.decode("ascii"),
        "version": C.FORMAT_VERSION,
        "alignment": C.ALIGNMENT,
        "file_header_size": C.FILE_HEADER_SIZE,
        "config_offset": C.CONFIG_OFFSET,
        "config_size": C.CONFIG_SIZE,
        "tensor_entry_size": C.TENSOR_ENTRY_SIZE,
        "blob_entry_size": C.BLOB_ENTRY_SIZE,
        "tensor_name_size": C.TENSOR_NAME_SIZE,
        "max_ndim": C.MAX_NDIM,
        "max_tensors": C.MAX_TENSORS,
        "max_blobs": C.MAX_BLOBS,
        "max_header_size": C.MAX_HEADER_SIZE,
        "max_n_layers": C.MAX_N_LAYERS,
        "header_crc_offset": C.HEADER_CRC_OFFSET,
        "header_reserved_start": _header.HEADER_RESERVED_START,
        "config_used_size": _config.CONFIG_USED_SIZE,
        "blob_reserved_start": _header.BLOB_RESERVED_START,
        "dtypes": {d.name.lower(): int(d) for d in C.DType},
        "archs": {a.name.lower(): int(a) for a in C.Arch},
        "rope_scaling": {r.name.lower(): int(r) for r in C.RopeScaling},
        "layouts": {"none": C.LAYOUT_NONE, "int4_rowmajor_k8": C.LAYOUT_INT4_ROWMAJOR_K8,
                    "int4_rowmajor_k8_asym": C.LAYOUT_INT4_ROWMAJOR_K8_ASYM},
        "config_flags": {"tied": C.CONFIG_FLAG_TIED, "qkv_bias": C.CONFIG_FLAG_QKV_BIAS},
        "blob_kinds": {k.name.lower(): int(k) for k in C.BlobKind},
        "blob_encodings": {e.name.lower(): int(e) for e in C.BlobEncoding},
        "blob_kind_encodings": {k.name.lower(): int(C.BLOB_KIND_ENCODING[k]) for k in C.BlobKind},
        "int4_perm": list(C.INT4_PERM),
        "int4_group_sizes": list(C.INT4_GROUP_SIZES),
        "int4_zero_code": C.INT4_ZERO_CODE,
        "int4_max_code": C.INT4_MAX_CODE,
        "kv_page_tokens": _shapes.KV_PAGE_TOKENS,
        "header": header,
        "config": config,
        "tensor_entry": tensor,
        "blob_entry": blob,
    }


def _camel(name: str) -> str:
    return "".join(p[:1].upper() + p[1:] for p in name.split("_"))


SCALARS = ("version", "alignment", "file_header_size", "config_offset", "config_size", "tensor_entry_size",
           "blob_entry_size", "tensor_name_size", "max_ndim", "max_tensors", "max_blobs", "max_header_size",
           "max_n_layers", "header_crc_offset", "header_reserved_start", "config_used_size", "blob_reserved_start",
           "int4_zero_code", "int4_max_code", "kv_page_tokens")
# JSON group -> C++ name prefix of its constants
GROUPS = (("dtypes", "kDType"), ("archs", "kArch"), ("rope_scaling", "kRope"), ("layouts", "kLayout"),
          ("config_flags", "kConfigFlag"), ("blob_kinds", "kBlobKind"), ("blob_encodings", "kBlobEncoding"),
          ("blob_kind_encodings", "kBlobKindEncoding"))
SECTIONS = ("header", "config", "tensor_entry", "blob_entry")  # byte offsets (config: inside the config block)


def render(f: dict) -> str:
    """The header: one declaration per group (the facts the C++ code uses by name) and, for nq_abi_describe, the
    same facts as {JSON name, value} tables."""
    def decl(names_values):
        return ", ".join(f"{n} = {v}u" for n, v in names_values)

    def table(cname, pairs):
        return f"constexpr Named {cname}[] = {{" + ", ".join(f'{{"{n}", {v}}}' for n, v in pairs) + "};"

    L = ["// GENERATED by scripts/gen_contract.py from nanoqwen_format (constants.py, header.py, config.py,",
         "// shapes.py). DO NOT EDIT: change the Python source and run `python scripts/gen_contract.py`.",
         "// tests/test_contract.py fails when this file and the Python package disagree.",
         "#pragma once", "#include <cstdint>", "", "namespace nq {", "namespace contract {", "",
         f'constexpr char kMagic[] = "{f["magic"]}";',
         "constexpr uint32_t " + decl((f"k{_camel(k)}", f[k]) for k in SCALARS) + ";"]
    for group, prefix in GROUPS:
        L.append("constexpr uint32_t " + decl((f"{prefix}{_camel(n)}", v) for n, v in f[group].items()) + ";")
    # Blob kinds are 1..n with no gaps, so a kind indexes these arrays directly (slot 0 is no kind).
    kinds = f["blob_kinds"]
    assert sorted(kinds.values()) == list(range(1, len(kinds) + 1)), kinds
    by_value = sorted(kinds, key=kinds.get)
    L.append(f"constexpr uint32_t kBlobKindMax = {len(kinds)}u;")
    L.append("constexpr const char* kBlobKindNames[kBlobKindMax + 1] = {\"?\", " +
             ", ".join(f'"{n.upper()}"' for n in by_value) + "};")
    L.append("constexpr uint32_t kEncodingOfBlobKind[kBlobKindMax + 1] = {0u, " +
             ", ".join(f"kBlobKindEncoding{_camel(n)}" for n in by_value) + "};")
    L.append("constexpr int kInt4Perm[8] = {" + ", ".join(map(str, f["int4_perm"])) + "};")
    L.append(f"constexpr int kInt4GroupSizes[{len(f['int4_group_sizes'])}] = {{" +
             ", ".join(map(str, f["int4_group_sizes"])) + "};")
    L += ["// The one INT4 group-size rule: an allowed group size that divides K.",
          "constexpr bool int4_group_ok(long long group, long long K) {",
          "  for (int g : kInt4GroupSizes)",
          "    if (group == g) return K > 0 && K % g == 0;",
          "  return false;",
          "}", "", "// byte offsets of the fields of the header, the config block, a tensor entry, a blob entry"]
    for sect in SECTIONS:
        L.append(f"namespace {sect} {{ constexpr uint32_t " + decl(f[sect].items()) + "; }")
    L += ["", "// The same facts by their nq_abi_describe() JSON names.",
          "struct Named { const char* name; uint32_t value; };",
          table("kScalars", ((k, f"k{_camel(k)}") for k in SCALARS))]
    for group, prefix in GROUPS:
        L.append(table(f"k{_camel(group)}", ((n, f"{prefix}{_camel(n)}") for n in f[group])))
    for sect in SECTIONS:
        L.append(table(f"k{_camel(sect)}Offsets", ((n, f"{sect}::{n}") for n in f[sect])))
    L += ["", "}  // namespace contract", "}  // namespace nq", ""]
    return "\n".join(L)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the committed header is out of date")
    a = ap.parse_args()
    text = render(facts())
    if a.check:
        if not OUT.is_file() or OUT.read_text() != text:
            print(f"{OUT.relative_to(ROOT)} is out of date: run python scripts/gen_contract.py", file=sys.stderr)
            return 1
        return 0
    tmp = OUT.with_name(f".{OUT.name}.tmp.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, OUT)
    print(f"wrote {OUT.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
