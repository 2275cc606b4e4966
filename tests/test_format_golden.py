"""Golden vectors (spec/vectors/): the reader decodes each file as its <name>.json describes, and the writer
reproduces each file byte for byte from the description (make_vectors.py's deterministic generator)."""
import hashlib
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from nanoqwen_format import BlobKind, DType, ModelConfig, open_file, unpack_int4_reference
from nanoqwen_format.constants import LAYOUT_INT4_ROWMAJOR_K8, LAYOUT_INT4_ROWMAJOR_K8_ASYM

ROOT = Path(__file__).resolve().parents[1]
VECTORS = ROOT / "spec" / "vectors"
JSONS = sorted(VECTORS.glob("*.json"))


def _make_vectors():
    spec = importlib.util.spec_from_file_location("make_vectors", VECTORS / "make_vectors.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_there_are_golden_vectors():
    names = {p.stem for p in JSONS}
    assert {"tiny_f16", "tiny_int4_tied", "tiny_blobs"} <= names
    for p in JSONS:
        assert (VECTORS / (p.stem + ".nanoqwen")).is_file()


@pytest.mark.parametrize("jpath", JSONS, ids=lambda p: p.stem)
def test_reader_matches_description(jpath):
    desc = json.loads(jpath.read_text(encoding="utf-8"))
    path = VECTORS / desc["file"]
    raw = path.read_bytes()
    assert hashlib.sha256(raw).hexdigest() == desc["sha256"]
    with open_file(path) as f:
        h = desc["header"]
        assert (f.version, f.file_size, f.header_size, f.data_offset) == (h["version"], h["file_size"],
                                                                          h["header_size"], h["data_offset"])
        assert f.config == ModelConfig(**desc["config"]).canonical()
        assert list(f.tensors) == [t["name"] for t in desc["tensors"]]
        for jt in desc["tensors"]:
            t = f.tensors[jt["name"]]
            assert (t.dtype.name, list(t.shape), t.offset, t.nbytes, t.crc32c, t.group_size, t.layout_id) == (
                jt["dtype"], jt["shape"], jt["offset"], jt["nbytes"], int(jt["crc32c"], 16), jt["group_size"],
                jt["layout_id"])
            if t.dtype == DType.INT4G:
                asym = t.layout_id == LAYOUT_INT4_ROWMAJOR_K8_ASYM
                if asym:
                    q, s, z = f.int4_asym(t.name)
                    assert z.reshape(-1)[:4].tolist() == jt["first_zeros"]
                    zero = np.float32(z[0, 0])
                else:
                    q, s = f.int4(t.name)
                    assert "first_zeros" not in jt
                    zero = np.float32(8)
                assert [f"{int(w):#010x}" for w in q.reshape(-1)[:2]] == jt["first_qweight_words"]
                assert s.reshape(-1)[:4].astype(float).tolist() == jt["first_scales"]
                w = f.float32(t.name)
                g = t.group_size
                codes = np.array(jt["first_codes"], dtype=np.float32)
                # first 16 values of row 0: codes 0..15 all lie in group 0 (g >= 32)
                np.testing.assert_array_equal(w[0, :16], np.float32(s[0, 0]) * (codes - zero))
                assert g >= 32
            else:
                got = f.float32(t.name).reshape(-1)[:4].astype(float).tolist()
                assert got == jt["first_values"], t.name
                if t.dtype == DType.BF16:
                    assert [f"{int(b):#06x}" for b in f.array(t.name).reshape(-1)[:4]] == jt["first_bf16_bits"]
        assert [k.name for k in f.blob_kinds] == [b["kind"] for b in desc["blobs"]]
        for jb in desc["blobs"]:
            kind = BlobKind[jb["kind"]]
            assert f.blob_text(kind) == jb["text"]
            if jb["encoding"] == 1:
                assert f.blob_json(kind) == json.loads(jb["text"])
        f.verify_checksums()


@pytest.mark.parametrize("jpath", JSONS, ids=lambda p: p.stem)
def test_writer_reproduces_golden_bytes(jpath, tmp_path):
    mv = _make_vectors()
    desc = json.loads(jpath.read_text(encoding="utf-8"))
    (v,) = [v for v in mv.VECTORS if v["name"] == desc["name"]]
    # the description's config / dtype rule / blobs are what the generator uses
    assert v["config"] == desc["config"] and [list(r) for r in v["dtypes"]] == desc["dtypes"]
    assert [[k, t] for k, t in v["blobs"]] == [[b["kind"], b["text"]] for b in desc["blobs"]]
    out = tmp_path / desc["file"]
    mv.build(v, str(out))
    assert out.read_bytes() == (VECTORS / desc["file"]).read_bytes()
    assert json.loads(json.dumps(mv.describe(v, str(out)))) == desc


def test_make_vectors_check_mode_passes():
    assert _make_vectors().main(["--check"]) == 0


@pytest.mark.parametrize("jpath", JSONS, ids=lambda p: p.stem)
def test_reader_matches_decoded_tensors(jpath):
    """decoded/<vector>/<tensor>.f32.npy (and .codes.npy for int4g) pin whole tensors: the reader's float32()
    matches them bit for bit, and the int4g codes it unpacks are the shipped codes."""
    desc = json.loads(jpath.read_text(encoding="utf-8"))
    with open_file(VECTORS / desc["file"]) as f:
        for jt in desc["tensors"]:
            if "decoded" not in jt:
                continue
            want = np.load(VECTORS / jt["decoded"]["f32"], allow_pickle=False)
            assert want.dtype == np.float32 and list(want.shape) == jt["shape"]
            got = f.float32(jt["name"])
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=jt["name"])
            if jt["dtype"] == "INT4G":
                codes = np.load(VECTORS / jt["decoded"]["codes"], allow_pickle=False)
                assert codes.dtype == np.uint8 and list(codes.shape) == jt["shape"]
                if jt["layout_id"] == LAYOUT_INT4_ROWMAJOR_K8_ASYM:
                    q, _, z = f.int4_asym(jt["name"])
                    zeros = np.load(VECTORS / jt["decoded"]["zeros"], allow_pickle=False)
                    assert zeros.dtype == np.uint8 and zeros.shape == z.shape
                    np.testing.assert_array_equal(z, zeros)
                else:
                    q = f.int4(jt["name"])[0]
                np.testing.assert_array_equal(unpack_int4_reference(q), codes)
                assert codes[0, :16].tolist() == jt["first_codes"]
            else:
                assert want.reshape(-1)[:4].astype(float).tolist() == jt["first_values"]


def test_every_dtype_and_group_size_has_a_decoded_tensor():
    seen = set()
    for p in JSONS:
        for jt in json.loads(p.read_text(encoding="utf-8"))["tensors"]:
            if "decoded" in jt:
                seen.add((jt["dtype"], jt["group_size"], jt["layout_id"]))
                want = {"f32"}
                if jt["dtype"] == "INT4G":
                    want = {"f32", "codes", "zeros"} if jt["layout_id"] == LAYOUT_INT4_ROWMAJOR_K8_ASYM else {"f32", "codes"}
                assert set(jt["decoded"]) == want
    assert {d for d, _, _ in seen} == {"F32", "F16", "BF16", "INT4G"}
    for layout in (LAYOUT_INT4_ROWMAJOR_K8, LAYOUT_INT4_ROWMAJOR_K8_ASYM):
        assert {g for d, g, lay in seen if d == "INT4G" and lay == layout} >= {32, 64}, layout
