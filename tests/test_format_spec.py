"""The spec is the contract: parse spec/nanoqwen-format.md (constant tables, C structs, tensor-set table,
validation table) and check the code against it; then decode the golden vectors with a reader built ONLY from the
parsed spec (struct module + a bitwise CRC32C written from the spec's C code), no nanoqwen_format reader."""
import ast
import json
import re
import struct
from pathlib import Path

import numpy as np
import pytest
from crc32c import crc32c as hw_crc32c

import nanoqwen_format
from nanoqwen_format import ModelConfig, constants, crc, errors, expected_tensors

ROOT = Path(__file__).resolve().parents[1]
SPEC = (ROOT / "spec" / "nanoqwen-format.md").read_text(encoding="utf-8")
VECTORS = ROOT / "spec" / "vectors"

_CTYPES = {"char": ("s", 1), "uint8_t": ("s", 1), "uint16_t": ("H", 2), "uint32_t": ("I", 4), "int32_t": ("i", 4),
           "uint64_t": ("Q", 8), "float": ("f", 4), "double": ("d", 8)}


def spec_constants() -> dict:
    """{name: value} from every `| `NAME` | `VALUE` | ... |` table row of the spec."""
    out = {}
    for m in re.finditer(r"^\| `([A-Z][A-Z0-9_]*|[A-Z]\w*\.[A-Z0-9_]+)` \| `([^`]+)` \|", SPEC, re.M):
        name, raw = m.group(1), m.group(2)
        out[name] = raw.encode("ascii") if name == "MAGIC" else ast.literal_eval(raw)
    return out


def spec_structs() -> dict:
    """{struct name: [(type, field, count, offset)]} from the ```c blocks."""
    out = {}
    for m in re.finditer(r"struct (\w+) \{\n(.*?)\n\};", SPEC, re.S):
        fields = []
        for line in m.group(2).splitlines():
            f = re.match(r"\s+(\w+)\s+(\w+)(?:\[(\d+)\])?;\s*/\*\s*@(\d+)", line)
            assert f, f"unparsed struct line in spec: {line!r}"
            fields.append((f.group(1), f.group(2), int(f.group(3) or 1), int(f.group(4))))
        out[m.group(1)] = fields
    return out


def field_size(structs, ctype, count):
    if ctype in _CTYPES:
        return _CTYPES[ctype][1] * count
    return struct_size(structs, ctype) * count


def struct_size(structs, name):
    t, f, c, off = structs[name][-1]
    return off + field_size(structs, t, c)


def decoder(structs, name):
    """A function bytes -> {field: value} for a spec struct (nested structs decoded recursively)."""
    def dec(buf, base=0):
        out = {}
        for t, f, c, off in structs[name]:
            if t in _CTYPES:
                code, size = _CTYPES[t]
                if code == "s":
                    out[f] = bytes(buf[base + off: base + off + c])
                else:
                    vals = struct.unpack_from(f"<{c}{code}", buf, base + off)
                    out[f] = vals if c > 1 else vals[0]
            else:
                out[f] = decoder(structs, t)(buf, base + off)
        return out
    return dec


def crc32c_from_spec(data: bytes) -> int:
    """The spec's bitwise C definition, transcribed."""
    c = 0xFFFFFFFF
    for b in data:
        c ^= b
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 & -(c & 1) & 0xFFFFFFFF)
    return c ^ 0xFFFFFFFF


# ------------------------------------------------------------------------------------------------ tables
def test_constant_tables_match_code():
    consts = spec_constants()
    assert len(consts) >= 39  # 23 constants + 16 enum members at the time of writing
    enums = {"DType": nanoqwen_format.DType, "BlobKind": nanoqwen_format.BlobKind, "Arch": constants.Arch,
             "RopeScaling": constants.RopeScaling, "BlobEncoding": constants.BlobEncoding}
    for name, value in consts.items():
        if "." in name:
            enum_name, member = name.split(".")
            assert int(getattr(enums[enum_name], member)) == value, name
        else:
            code = getattr(constants, name, None)
            if code is None:
                code = getattr(crc, name)
            assert code == value, f"{name}: spec {value!r} vs code {code!r}"
    for enum_name, enum in enums.items():  # every enum member is in the spec
        for member in enum:
            assert f"{enum_name}.{member.name}" in consts, f"{enum_name}.{member.name} missing from the spec"
    assert nanoqwen_format.ALIGNMENT == consts["ALIGNMENT"]
    assert nanoqwen_format.LAYOUT_INT4_ROWMAJOR_K8 == consts["LAYOUT_INT4_ROWMAJOR_K8"]


def test_struct_offsets_are_consecutive_and_sizes_match():
    structs = spec_structs()
    assert set(structs) == {"FileHeader", "ModelConfig", "TensorEntry", "BlobEntry"}
    for name, fields in structs.items():
        pos = 0
        for t, f, c, off in fields:
            assert off == pos, f"{name}.{f}: spec says @{off}, previous fields end at {pos}"
            pos += field_size(structs, t, c)
    consts = spec_constants()
    assert struct_size(structs, "FileHeader") == consts["FILE_HEADER_SIZE"] == 256
    assert struct_size(structs, "ModelConfig") == consts["CONFIG_SIZE"] == 128
    assert struct_size(structs, "TensorEntry") == consts["TENSOR_ENTRY_SIZE"] == 136
    assert struct_size(structs, "BlobEntry") == consts["BLOB_ENTRY_SIZE"] == 64
    offs = {f: off for t, f, c, off in structs["FileHeader"]}
    assert offs["config"] == consts["CONFIG_OFFSET"] and offs["header_crc32c"] == consts["HEADER_CRC_OFFSET"]
    assert dict((f, c) for t, f, c, off in structs["TensorEntry"])["name"] == consts["TENSOR_NAME_SIZE"]


def test_tensor_set_table_matches_expected_tensors():
    rows = re.findall(r"^\| `((?:model|lm_head)[^`]*)` \| `\(([^`]*)\)` \| ([^|]+) \|", SPEC, re.M)
    assert len(rows) == 15
    for tied in (False, True):
        for bias in (False, True):
            cfg = ModelConfig(arch="llama", n_layers=3, hidden_size=48, intermediate_size=80, n_heads=6,
                              n_kv_heads=2, head_dim=10, vocab_rows=33, max_positions=8, rope_theta=1e4,
                              tied_embeddings=tied, qkv_bias=bias)
            sym = dict(H=48, I=80, D=10, Q=60, KV=20, V=33)
            want = {}
            for i in range(cfg.n_layers):
                for name, shape, present in rows:
                    present = present.strip()
                    if (present == "`qkv_bias`" and not bias) or (present == "not `tied_embeddings`" and tied):
                        continue
                    dims = tuple(sym[d.strip()] for d in shape.split(",") if d.strip())
                    want[name.replace("{i}", str(i))] = dims
            assert expected_tensors(cfg) == want


def test_validation_table_names_every_error_class():
    section = SPEC[SPEC.index("## 12. Validation"):SPEC.index("## 13. Writing")]
    named = set(re.findall(r"`([A-Z][A-Za-z]+)`", section))
    classes = {n for n in dir(errors) if isinstance(getattr(errors, n), type)
               and issubclass(getattr(errors, n), errors.NanoqwenFormatError)}
    reader_classes = classes - {"NanoqwenFormatError", "WriterUsageError"}
    assert reader_classes <= named, f"error classes missing from spec §12: {reader_classes - named}"
    assert {n for n in named if n in classes} == reader_classes


def test_crc_check_value_from_spec():
    assert crc32c_from_spec(b"123456789") == spec_constants()["CRC32C_CHECK"]
    assert crc.crc32c(b"123456789") == crc.crc32c_reference(b"123456789") == 0xE3069283


# ------------------------------------------------------------------------------------------------ spec-only reader
def check_whole_decoding(jt, body, consts):
    """Decode the whole tensor from the spec's rules (§8, §9) and compare with decoded/*.npy bit for bit."""
    shape = tuple(jt["shape"])
    if jt["dtype"] == "INT4G":
        n, k = shape
        g = jt["group_size"]
        words = np.frombuffer(body, "<u4", count=n * k // 8).reshape(n, k // 8)
        codes = np.empty((n, k), np.uint8)
        for nib, kk in enumerate(consts["INT4_PERM"]):
            codes[:, kk::8] = (words >> np.uint32(4 * nib)) & np.uint32(0xF)
        s_off = -(-(n * k // 2) // 128) * 128
        scales = np.frombuffer(body, "<f2", count=n * k // g, offset=s_off).reshape(n, k // g).astype(np.float32)
        if jt["layout_id"] == consts["LAYOUT_INT4_ROWMAJOR_K8_ASYM"]:   # §9.6: zero points after the scales
            z_off = -(-(s_off + 2 * (n * k // g)) // 128) * 128
            zeros = np.frombuffer(body, np.uint8, count=n * k // g, offset=z_off).reshape(n, k // g)
            np.testing.assert_array_equal(zeros, np.load(VECTORS / jt["decoded"]["zeros"], allow_pickle=False))
            zero = np.repeat(zeros.astype(np.float32), g, axis=1)
        else:
            zero = np.float32(consts["INT4_ZERO_CODE"])
        values = np.repeat(scales, g, axis=1) * (codes.astype(np.float32) - zero)
        want_codes = np.load(VECTORS / jt["decoded"]["codes"], allow_pickle=False)
        np.testing.assert_array_equal(codes, want_codes)
    elif jt["dtype"] == "BF16":
        values = (np.frombuffer(body, "<u2").astype(np.uint32) << np.uint32(16)).view(np.float32).reshape(shape)
    else:
        values = np.frombuffer(body, {"F32": "<f4", "F16": "<f2"}[jt["dtype"]]).astype(np.float32).reshape(shape)
    want = np.load(VECTORS / jt["decoded"]["f32"], allow_pickle=False)
    np.testing.assert_array_equal(values.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("jpath", sorted(VECTORS.glob("*.json")), ids=lambda p: p.stem)
def test_spec_only_reader_decodes_golden_vector(jpath):
    desc = json.loads(jpath.read_text(encoding="utf-8"))
    raw = (VECTORS / desc["file"]).read_bytes()
    structs, consts = spec_structs(), spec_constants()
    hdr = decoder(structs, "FileHeader")(raw)
    assert hdr["magic"] == consts["MAGIC"]
    h = desc["header"]
    for f in ("version", "header_size", "file_size", "data_offset", "n_tensors", "n_blobs", "flags"):
        assert hdr[f] == h[f], f
    assert hdr["file_size"] == len(raw)
    assert hdr["header_size"] == 256 + 136 * hdr["n_tensors"] + 64 * hdr["n_blobs"]
    head = bytearray(raw[:hdr["header_size"]])
    head[40:44] = b"\0\0\0\0"
    assert crc32c_from_spec(bytes(head)) == hdr["header_crc32c"] == int(h["header_crc32c"], 16)
    assert hdr["reserved"] == bytes(80)
    # config
    c = hdr["config"]
    want = ModelConfig(**desc["config"])
    arch = {consts["Arch.QWEN2"]: "qwen2", consts["Arch.LLAMA"]: "llama"}[c["arch"]]
    rope = {consts["RopeScaling.NONE"]: "none", consts["RopeScaling.LINEAR"]: "linear",
            consts["RopeScaling.YARN"]: "yarn"}[c["rope_scaling_type"]]
    assert (arch, rope) == (want.arch, want.rope_scaling_type)
    assert (c["n_layers"], c["hidden_size"], c["intermediate_size"], c["n_heads"], c["n_kv_heads"], c["head_dim"],
            c["vocab_rows"], c["max_positions"]) == (want.n_layers, want.hidden_size, want.intermediate_size,
                                                     want.n_heads, want.n_kv_heads, want.head_dim, want.vocab_rows,
                                                     want.max_positions)
    assert c["config_flags"] == (consts["CONFIG_FLAG_TIED"] * want.tied_embeddings
                                 + consts["CONFIG_FLAG_QKV_BIAS"] * want.qkv_bias)
    assert c["rope_theta"] == want.rope_theta
    assert c["rope_scaling_factor"] == np.float32(want.rope_scaling_factor)
    assert c["rms_norm_eps"] == np.float32(want.rms_norm_eps)
    assert (c["bos_token_id"], c["eos_token_id"], c["pad_token_id"]) == (want.bos_token_id, want.eos_token_id,
                                                                       want.pad_token_id)
    assert c["reserved"] == bytes(52)
    # tensor entries, placement, data
    dec_t = decoder(structs, "TensorEntry")
    dtype_code = {consts[f"DType.{n}"]: n for n in ("F32", "F16", "BF16", "INT4G")}
    expected_pos = hdr["data_offset"]
    for i, jt in enumerate(desc["tensors"]):
        e = dec_t(raw, 256 + 136 * i)
        name = e["name"].rstrip(b"\0").decode("ascii")
        assert name == jt["name"] and dtype_code[e["dtype"]] == jt["dtype"]
        assert list(e["shape"][:e["ndim"]]) == jt["shape"] and not any(e["shape"][e["ndim"]:])
        assert (e["offset"], e["nbytes"], e["group_size"], e["layout_id"]) == (jt["offset"], jt["nbytes"],
                                                                              jt["group_size"], jt["layout_id"])
        assert e["offset"] == -(-expected_pos // 128) * 128
        assert not any(raw[expected_pos:e["offset"]])
        body = raw[e["offset"]:e["offset"] + e["nbytes"]]
        # data CRCs with the hardware package (the bitwise spec CRC is used on the header and the blobs)
        assert hw_crc32c(body) == e["crc32c"] == int(jt["crc32c"], 16)
        if jt["dtype"] == "F32":
            vals = struct.unpack_from("<4f", body)
        elif jt["dtype"] == "F16":
            vals = np.frombuffer(body[:8], "<f2").astype(float).tolist()
        elif jt["dtype"] == "BF16":
            vals = [struct.unpack("<f", struct.pack("<I", b << 16))[0] for b in struct.unpack_from("<4H", body)]
        else:
            n, k = jt["shape"]
            g = e["group_size"]
            scales_end = -(-(n * k // 2) // 128) * 128 + n * (k // g) * 2
            if e["layout_id"] == consts["LAYOUT_INT4_ROWMAJOR_K8_ASYM"]:
                z_off = -(-scales_end // 128) * 128
                assert e["nbytes"] == z_off + n * (k // g)
                assert not any(body[scales_end:z_off])
                assert list(body[z_off:z_off + 4]) == jt["first_zeros"]
            else:
                assert e["layout_id"] == consts["LAYOUT_INT4_ROWMAJOR_K8"]
                assert e["nbytes"] == scales_end
            words = struct.unpack_from("<2I", body)
            perm = consts["INT4_PERM"]
            codes = [0] * 16
            for j, w in enumerate(words):
                for nib in range(8):
                    codes[8 * j + perm[nib]] = (w >> (4 * nib)) & 0xF
            assert codes == jt["first_codes"]
            s_off = -(-(n * k // 2) // 128) * 128
            assert not any(body[n * k // 2:s_off])
            scales = np.frombuffer(body[s_off:s_off + 8], "<f2").astype(float).tolist()
            assert scales == jt["first_scales"]
            vals = None
        if vals is not None:
            assert list(vals) == pytest.approx(jt["first_values"], abs=0, rel=0), name
        if "decoded" in jt:
            check_whole_decoding(jt, body, consts)
        expected_pos = e["offset"] + e["nbytes"]
    # blobs
    dec_b = decoder(structs, "BlobEntry")
    for j, jb in enumerate(desc["blobs"]):
        b = dec_b(raw, 256 + 136 * hdr["n_tensors"] + 64 * j)
        assert (b["kind"], b["encoding"], b["offset"], b["nbytes"]) == (jb["kind_id"], jb["encoding"], jb["offset"],
                                                                       jb["nbytes"])
        assert b["offset"] == -(-expected_pos // 128) * 128 and b["reserved"] == bytes(36)
        body = raw[b["offset"]:b["offset"] + b["nbytes"]]
        assert crc32c_from_spec(body) == b["crc32c"]
        assert body.decode("utf-8") == jb["text"]
        expected_pos = b["offset"] + b["nbytes"]
    assert expected_pos == len(raw)
