"""One handcrafted corrupt file per validation rule of spec §12, each asserting its specific error class and that
the message names the field/tensor with expected vs found values."""
import math

import pytest

from nanoqwen_format import BlobKind, DType, ModelConfig, open_file
from nanoqwen_format import errors as E

from format_corrupt import Mutator, header_only_file
from format_helpers import make_random_file

# vocab_rows 81: lm_head int4g (81, 64) g32 has qweight 2592 B + 96 B zero padding before its scales;
# k/v biases f16 (32,) are 64 B, so 64 B of inter-item padding follow them; the directory ends at 4056, so
# 40 B of padding precede data_offset 4096.
BASE_CFG = ModelConfig(arch="qwen2", n_layers=2, hidden_size=64, intermediate_size=96, n_heads=4, n_kv_heads=2,
                       head_dim=16, vocab_rows=81, max_positions=128, rope_theta=1e6, rms_norm_eps=1e-6,
                       tied_embeddings=False, qkv_bias=True, bos_token_id=-1, eos_token_id=5, pad_token_id=7)


def base_dtypes(name, shape):
    if "proj.weight" in name or name == "lm_head.weight":
        return DType.INT4G, 32
    if "embed" in name:
        return DType.BF16, 0
    if "norm" in name:
        return DType.F32, 0
    return DType.F16, 0


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    path = tmp_path_factory.mktemp("corrupt") / "base.nanoqwen"
    make_random_file(path, cfg=BASE_CFG, seed=11, dtype_for=base_dtypes,
                     blobs={BlobKind.TOKENIZER_JSON: b'{"model": {"type": "BPE"}, "added_tokens": []}',
                            BlobKind.CHAT_TEMPLATE: b"{{ messages[0]['content'] }} and more text"})
    with open_file(path) as f:
        names = list(f.tensors)
        infos = dict(f.tensors)
        assert f.header_size == 4056 and f.data_offset == 4096
    return {"raw": path.read_bytes(), "idx": {n: i for i, n in enumerate(names)}, "info": infos}


def T(base, name):
    return base["idx"][name]


L0 = "model.layers.0."
KB = L0 + "self_attn.k_proj.bias"
QP = L0 + "self_attn.q_proj.weight"


def _cases():
    """(id, mutate(base) -> bytes, error class, substring the message must contain)."""
    c = []

    def add(id_, fn, err, sub):
        c.append(pytest.param(fn, err, sub, id=id_))

    M = lambda b: Mutator(b["raw"])  # noqa: E731
    # --- header (rules 1-13)
    add("magic", lambda b: M(b).byte(7, ord("M")).bytes(), E.BadMagic, "magic")
    add("magic-zero-file", lambda b: bytes(1000), E.BadMagic, "magic")
    add("short-4-bytes", lambda b: b["raw"][:4], E.HeaderTooShort, "file")
    add("short-200-bytes", lambda b: b["raw"][:200], E.HeaderTooShort, "256")
    add("header-size-below-256", lambda b: M(b).header("header_size", 200).fix_crc().bytes(), E.HeaderTooShort,
        "header_size")
    add("version-2", lambda b: M(b).header("version", 2).fix_crc().bytes(), E.UnsupportedVersion, "version")
    add("version-0", lambda b: M(b).header("version", 0).fix_crc().bytes(), E.UnsupportedVersion, "version")
    add("n-tensors-cap", lambda b: M(b).header("n_tensors", 65537).bytes(), E.HeaderTooLarge, "n_tensors")
    add("n-tensors-u32-max", lambda b: M(b).header("n_tensors", 2**32 - 1).bytes(), E.HeaderTooLarge, "n_tensors")
    add("n-blobs-cap", lambda b: M(b).header("n_blobs", 65).bytes(), E.HeaderTooLarge, "n_blobs")
    add("header-size-cap", lambda b: M(b).header("header_size", 16 * 2**20 + 8).bytes(), E.HeaderTooLarge,
        "header_size")
    add("header-size-mismatch", lambda b: M(b).header("header_size", 4056 + 136).fix_crc().bytes(),
        E.HeaderSizeMismatch, "header_size")
    add("n-tensors-mismatch", lambda b: M(b).header("n_tensors", 26).fix_crc().bytes(), E.HeaderSizeMismatch,
        "header_size")
    add("truncated-in-directory", lambda b: b["raw"][:1000], E.TruncatedFile, "header_size")
    add("header-crc", lambda b: M(b).config("max_positions", 129).bytes(), E.ChecksumMismatch, "header_crc32c")
    add("directory-crc", lambda b: M(b).tensor(3, "crc32c", 1).bytes(), E.ChecksumMismatch, "header_crc32c")
    add("flags", lambda b: M(b).header("flags", 1).fix_crc().bytes(), E.NonZeroReserved, "flags")
    add("header-reserved", lambda b: M(b).byte(200, 1).fix_crc().bytes(), E.NonZeroReserved, "reserved")
    add("config-reserved", lambda b: M(b).byte(48 + 100, 9).fix_crc().bytes(), E.NonZeroReserved, "reserved")
    add("config-flags-bit4", lambda b: M(b).config("config_flags", 2 | 16).fix_crc().bytes(), E.NonZeroReserved,
        "config_flags")
    # --- config values (rule 11)
    for field, value, sub in [("arch", 3, "arch"), ("rope_scaling_type", 7, "rope_scaling_type"),
                              ("n_layers", 0, "n_layers"), ("n_kv_heads", 3, "n_kv_heads"),
                              ("head_dim", 8, "head_dim"), ("rope_scaling_factor", 2.0, "rope_scaling_factor"),
                              ("rope_original_max_positions", 5, "rope_original_max_positions"),
                              ("rope_theta", math.nan, "rope_theta"), ("rope_theta", -1.0, "rope_theta"),
                              ("rms_norm_eps", 0.0, "rms_norm_eps"), ("rms_norm_eps", math.inf, "rms_norm_eps"),
                              ("eos_token_id", 81, "eos_token_id"), ("pad_token_id", -2, "pad_token_id"),
                              ("vocab_rows", 0, "vocab_rows"), ("hidden_size", 0, "hidden_size")]:
        add(f"config-{field}-{value}", lambda b, f=field, v=value: M(b).config(f, v).fix_crc().bytes(),
            E.ConfigMismatch, sub)
    add("config-yarn-without-orig", lambda b: M(b).config("rope_scaling_type", 2).config("rope_scaling_factor", 2.0)
        .fix_crc().bytes(), E.ConfigMismatch, "rope_original_max_positions")
    add("config-vs-shape", lambda b: M(b).config("intermediate_size", 128).fix_crc().bytes(), E.ConfigMismatch,
        "gate_proj")
    # --- file size / data offset (rules 12-16)
    add("truncated-data", lambda b: b["raw"][:-1], E.TruncatedFile, "file_size")
    add("truncated-half", lambda b: b["raw"][:len(b["raw"]) // 2], E.TruncatedFile, "file_size")
    add("appended-byte", lambda b: b["raw"] + b"\0", E.TrailingBytes, "file_size")
    add("data-offset-misaligned", lambda b: M(b).header("data_offset", 4096 + 8).fix_crc().bytes(),
        E.MisalignedOffset, "data_offset")
    add("data-offset-overlaps", lambda b: M(b).header("data_offset", 3968).fix_crc().bytes(), E.OverlappingTensors,
        "data_offset")
    add("data-offset-hole", lambda b: M(b).header("data_offset", 4224).fix_crc().bytes(), E.HoleInData,
        "data_offset")
    add("data-offset-beyond-file", lambda b: header_only_file(1), E.OffsetOutOfRange, "data_offset")
    add("padding-after-directory", lambda b: M(b).byte(4060, 1).bytes(), E.NonZeroPadding, "directory")
    # --- tensor entries (rules 17-28)
    add("name-non-ascii", lambda b: M(b).tensor(0, "name", b"model.embed\xc3\xa9").fix_crc().bytes(),
        E.BadTensorName, "ASCII")
    add("name-space", lambda b: M(b).tensor(0, "name", b"model.embed tokens.weight").fix_crc().bytes(),
        E.BadTensorName, "ASCII")
    add("name-no-nul", lambda b: M(b).tensor(0, "name", b"a" * 64).fix_crc().bytes(), E.BadTensorName, "NUL")
    add("name-empty", lambda b: M(b).tensor(0, "name", b"").fix_crc().bytes(), E.BadTensorName, "empty")
    add("name-junk-after-nul", lambda b: M(b).tensor(0, "name", b"model.norm.weight\0x").fix_crc().bytes(),
        E.BadTensorName, "padding")
    add("duplicate-name", lambda b: M(b).tensor(1, "name", M(b).get_tensor(0, "name")).fix_crc().bytes(),
        E.DuplicateName, "model.embed_tokens.weight")
    add("dtype-4", lambda b: M(b).tensor(0, "dtype", 4).fix_crc().bytes(), E.UnknownDType, "dtype")
    add("dtype-u32-max", lambda b: M(b).tensor(0, "dtype", 2**32 - 1).fix_crc().bytes(), E.UnknownDType, "dtype")
    add("ndim-0", lambda b: M(b).tensor(0, "ndim", 0).fix_crc().bytes(), E.BadShape, "ndim")
    add("ndim-5", lambda b: M(b).tensor(0, "ndim", 5).fix_crc().bytes(), E.BadShape, "ndim")
    add("unused-shape-slot", lambda b: M(b).tensor(0, "shape3", 5).fix_crc().bytes(), E.NonZeroReserved, "shape")
    add("entry-reserved", lambda b: M(b).tensor(0, "reserved", 1).fix_crc().bytes(), E.NonZeroReserved, "reserved")
    add("layout-int4-2", lambda b: M(b).tensor(T(b, QP), "layout_id", 2).fix_crc().bytes(), E.UnknownLayout,
        "layout_id")
    add("layout-plain-1", lambda b: M(b).tensor(0, "layout_id", 1).fix_crc().bytes(), E.UnknownLayout, "layout_id")
    add("dim-zero", lambda b: M(b).tensor(0, "shape0", 0).fix_crc().bytes(), E.BadShape, "dimension")
    add("int4-ndim-3", lambda b: M(b).tensor(T(b, QP), "ndim", 3).tensor(T(b, QP), "shape2", 1).fix_crc().bytes(),
        E.BadShape, "int4g ndim")
    for g in (0, 16, 48, 512):
        add(f"group-size-{g}", lambda b, g=g: M(b).tensor(T(b, QP), "group_size", g).fix_crc().bytes(),
            E.BadGroupSize, "group_size")
    add("group-size-not-dividing-K", lambda b: M(b).tensor(T(b, QP), "group_size", 128).fix_crc().bytes(),
        E.BadGroupSize, "K=64")
    add("group-size-on-plain", lambda b: M(b).tensor(0, "group_size", 32).fix_crc().bytes(), E.BadGroupSize,
        "group_size")
    add("shape-overflow", lambda b: M(b).tensor(0, "shape0", 2**62).fix_crc().bytes(), E.SizeOverflow, "2^64")
    add("offset-overflow", lambda b: M(b).tensor(0, "offset", 2**64 - 128).fix_crc().bytes(), E.SizeOverflow,
        "2^64")
    add("nbytes-short", lambda b: M(b).tensor(T(b, KB), "nbytes", 62).fix_crc().bytes(), E.ByteLengthMismatch,
        "nbytes")
    add("nbytes-int4-without-padding",
        lambda b: M(b).tensor(T(b, "lm_head.weight"), "nbytes", 2592 + 81 * 2 * 2).fix_crc().bytes(),
        E.ByteLengthMismatch, "lm_head.weight")
    add("offset-misaligned", lambda b: M(b).tensor(1, "offset", M(b).get_tensor(1, "offset") + 8).fix_crc().bytes(),
        E.MisalignedOffset, "offset")
    add("offset-overlaps", lambda b: M(b).tensor(1, "offset", M(b).get_tensor(0, "offset")).fix_crc().bytes(),
        E.OverlappingTensors, "overlapping")
    add("offset-hole", lambda b: M(b).tensor(1, "offset", M(b).get_tensor(1, "offset") + 128).fix_crc().bytes(),
        E.HoleInData, "hole")
    add("padding-between-items",
        lambda b: M(b).byte(b["info"][KB].offset + 64 + 3, 0x55).bytes(), E.NonZeroPadding, "padding before")
    add("int4-internal-padding",
        lambda b: M(b).byte(b["info"]["lm_head.weight"].offset + 2592 + 5, 1).bytes(), E.NonZeroPadding,
        "between qweight and scales")
    # --- blob entries (rules 29-33)
    add("blob-kind-6", lambda b: M(b).blob(0, "kind", 6).fix_crc().bytes(), E.UnknownBlobKind, "kind")
    add("blob-kind-0", lambda b: M(b).blob(0, "kind", 0).fix_crc().bytes(), E.UnknownBlobKind, "kind")
    add("blob-duplicate-kind", lambda b: M(b).blob(1, "kind", 1).fix_crc().bytes(), E.DuplicateName, "TOKENIZER_JSON")
    add("blob-encoding", lambda b: M(b).blob(0, "encoding", 2).fix_crc().bytes(), E.BadBlobEncoding, "encoding")
    add("blob-reserved", lambda b: M(b).byte(M(b).blob_base(1) + 40, 1).fix_crc().bytes(), E.NonZeroReserved,
        "reserved")
    add("blob-out-of-range", lambda b: M(b).blob(1, "nbytes", M(b).get_blob(1, "nbytes") + 1000).fix_crc().bytes(),
        E.OffsetOutOfRange, "CHAT_TEMPLATE")
    add("blob-offset-overflow", lambda b: M(b).blob(1, "offset", 2**64 - 16).fix_crc().bytes(), E.SizeOverflow,
        "2^64")
    # --- end of file and tensor set (rules 34-37)
    add("hole-at-end", lambda b: Mutator(b["raw"] + bytes(128)).header("file_size", len(b["raw"]) + 128)
        .fix_crc().bytes(), E.HoleInData, "file_size")
    add("unknown-name", lambda b: M(b).tensor(T(b, "model.norm.weight"), "name", "model.norm.bias").fix_crc().bytes(),
        E.UnknownTensorName, "model.norm.bias")
    add("missing-tensor", lambda b: M(b).config("n_layers", 3).fix_crc().bytes(), E.MissingTensor,
        "model.layers.2.")
    add("tied-flag-makes-lm-head-unknown", lambda b: M(b).config("config_flags", 3).fix_crc().bytes(),
        E.UnknownTensorName, "lm_head.weight")
    # --- item checksums (rule 38)
    add("tensor-data-crc", lambda b: M(b).byte(b["info"][QP].offset + 17, M(b).b[b["info"][QP].offset + 17] ^ 4)
        .bytes(), E.ChecksumMismatch, QP)
    add("blob-data-crc", lambda b: M(b).byte(Mutator(b["raw"]).get_blob(0, "offset") + 2, ord("x")).bytes(),
        E.ChecksumMismatch, "TOKENIZER_JSON")
    # --- int4g scales (rule 39), tensor CRC re-computed so that only the scale rule fails
    for bits, label in ((0x7C00, "inf"), (0x7E00, "nan"), (0xBC00, "negative"), (0x8000, "minus-zero")):
        add(f"scale-{label}", lambda b, v=bits: _set_scale(b, QP, 3, v), E.BadScale, QP)
    return c


def _set_scale(b, name, index, bits):
    """Overwrite scale number `index` of int4g tensor `name` with f16 `bits`, fix its CRC and the header CRC."""
    t = b["info"][name]
    n, k = t.shape
    pos = t.offset + (n * k // 2 + 127) // 128 * 128 + 2 * index
    m = Mutator(b["raw"])
    m.b[pos:pos + 2] = bits.to_bytes(2, "little")
    return m.fix_item_crc("tensor", b["idx"][name]).bytes()


@pytest.mark.parametrize("mutate,err,sub", _cases())
def test_corrupt_file_raises_specific_error(base, tmp_path, mutate, err, sub):
    path = tmp_path / "bad.nanoqwen"
    path.write_bytes(mutate(base))
    with pytest.raises(err) as ei:
        open_file(path)
    msg = str(ei.value)
    assert type(ei.value) is err, f"expected exactly {err.__name__}, got {type(ei.value).__name__}: {msg}"
    assert sub in msg, msg
    assert "expected" in msg and "found" in msg, msg


def test_base_file_is_valid(base, tmp_path):
    path = tmp_path / "ok.nanoqwen"
    path.write_bytes(base["raw"])
    with open_file(path) as f:
        assert f.config == BASE_CFG.canonical()
        assert f.tensors["lm_head.weight"].nbytes == 2688 + 81 * 2 * 2


def test_checksum_skipped_then_verified(base, tmp_path):
    """verify_checksums=False opens a file with a bad tensor CRC; verify_checksums() then names the tensor."""
    m = Mutator(base["raw"])
    off = base["info"][KB].offset
    m.byte(off, m.b[off] ^ 0x10)
    path = tmp_path / "bad.nanoqwen"
    path.write_bytes(m.bytes())
    with open_file(path, verify_checksums=False) as f:
        with pytest.raises(E.ChecksumMismatch, match="k_proj.bias"):
            f.verify_checksums()


def test_bad_blob_content_raises_lazily(base, tmp_path):
    """Blob UTF-8/JSON validity is checked when read (spec §10): invalid UTF-8 and invalid JSON, CRCs fixed."""
    m = Mutator(base["raw"])
    m.byte(m.get_blob(1, "offset") + 3, 0xFF).fix_item_crc("blob", 1)        # chat template: invalid UTF-8
    m.byte(m.get_blob(0, "offset"), ord("x")).fix_item_crc("blob", 0)        # tokenizer.json: not JSON
    path = tmp_path / "bad.nanoqwen"
    path.write_bytes(m.bytes())
    with open_file(path) as f:
        with pytest.raises(E.BadBlobEncoding, match="CHAT_TEMPLATE.*UTF-8"):
            f.blob_text(BlobKind.CHAT_TEMPLATE)
        with pytest.raises(E.BadBlobEncoding, match="TOKENIZER_JSON.*JSON"):
            f.blob_json(BlobKind.TOKENIZER_JSON)


def test_empty_and_missing_files(tmp_path):
    empty = tmp_path / "empty.nanoqwen"
    empty.write_bytes(b"")
    with pytest.raises(E.HeaderTooShort):
        open_file(empty)
    with pytest.raises(FileNotFoundError):
        open_file(tmp_path / "absent.nanoqwen")


def test_every_rule_class_has_a_case():
    classes = {getattr(E, n) for n in dir(E) if isinstance(getattr(E, n), type)
               and issubclass(getattr(E, n), E.NanoqwenFormatError)}
    covered = {p.values[1] for p in _cases()}
    assert classes - covered == {E.NanoqwenFormatError, E.WriterUsageError}
