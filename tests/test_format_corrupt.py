"""One corrupt file per validation rule of spec §12 (spec/vectors/make_corrupt.py, shipped in
spec/vectors/corrupt/): each raises its specific error class, with a message that names the field or tensor with
expected vs found values; the shipped manifest covers every rule of the spec text."""
import dataclasses
import json
import os
import re

import pytest

import nanoqwen_format.validate as V
from nanoqwen_format import BlobKind, open_file
from nanoqwen_format import errors as E
from nanoqwen_format.constants import BLOB_KIND_ENCODING, BlobEncoding

from format_corrupt import (ASYM_BASE_VECTOR, BASE_PATH, CORRUPT_DIR, KB, MANIFEST, VECTORS, Mutator, case_file, corrupt_cases,
                            shipped_base)

SPEC = (VECTORS.parents[1] / "spec" / "nanoqwen-format.md").read_text(encoding="utf-8")
ERROR_CLASSES = {n for n in dir(E) if isinstance(getattr(E, n), type) and issubclass(getattr(E, n),
                                                                                        E.NanoqwenFormatError)}
VECTORS_MAX_BYTES = 2 * 1024 * 1024   # spec/vectors/ stays small enough to vendor into another implementation


@pytest.fixture(scope="module")
def base():
    return shipped_base()


def _open_and_read(path, read_blob):
    """open_file (every rule 1-39); then, for a blob-content case, read that blob as its encoding says (40-41)."""
    with open_file(path) as f:
        if read_blob is not None:
            kind = BlobKind[read_blob]
            if BLOB_KIND_ENCODING[kind] == BlobEncoding.JSON_UTF8:
                f.blob_json(kind)
            else:
                f.blob_text(kind)


@pytest.mark.parametrize("case", corrupt_cases(), ids=lambda c: c.id)
def test_corrupt_file_raises_specific_error(base, tmp_path, case):
    path = tmp_path / "bad.nanoqwen"
    path.write_bytes(case.mutate(base))
    if case.read_blob is not None:
        with open_file(path):   # content rules are lazy: the file itself opens
            pass
    with pytest.raises(E.NanoqwenFormatError) as ei:
        _open_and_read(path, case.read_blob)
    msg = str(ei.value)
    assert type(ei.value).__name__ == case.error, f"expected exactly {case.error}, got {type(ei.value).__name__}: {msg}"
    assert case.mentions in msg, msg
    assert "expected" in msg and "found" in msg, msg


def test_base_file_is_valid(base):
    with open_file(BASE_PATH) as f:
        assert len(f.tensors) == len(base["desc"]["tensors"])
        for kind in f.blob_kinds:
            if BLOB_KIND_ENCODING[kind] == BlobEncoding.JSON_UTF8:
                assert f.blob_json(kind) == json.loads(base["desc"]["blobs"][base["blob_idx"][kind.name]]["text"])
            else:
                assert f.blob_text(kind) == base["desc"]["blobs"][base["blob_idx"][kind.name]]["text"]


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


@pytest.mark.parametrize("vector,error", [("39-scale-nan", E.BadScale), ("39-scale-negative", E.BadScale),
                                          ("39b-asym-zero-16", E.BadZero)])
def test_float32_checks_values_open_skipped(vector, error):
    """verify_checksums=False skips rules 38-39b at open; float32 still applies 39-39b to the tensor it dequantizes,
    so it raises the named error instead of returning NaN or raising the reference's ValueError."""
    with open_file(CORRUPT_DIR / f"{vector}.nanoqwen", verify_checksums=False) as f:
        int4 = [t.name for t in f.tensors.values() if t.dtype.name == "INT4G"]
        with pytest.raises(error):
            for name in int4:
                f.float32(name)


def test_fifo_is_refused_without_blocking(tmp_path):
    """open() of a FIFO blocks until a writer opens it: the reader refuses anything but a regular file first."""
    fifo = tmp_path / "m.nanoqwen"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="not a regular file"):
        open_file(fifo)


def test_empty_and_missing_files(tmp_path):
    empty = tmp_path / "empty.nanoqwen"
    empty.write_bytes(b"")
    with pytest.raises(E.HeaderTooShort):
        open_file(empty)
    with pytest.raises(FileNotFoundError):
        open_file(tmp_path / "absent.nanoqwen")


def test_every_rule_class_has_a_case():
    covered = {c.error for c in corrupt_cases()}
    assert ERROR_CLASSES - covered == {"NanoqwenFormatError", "WriterUsageError"}


# ------------------------------------------------------------------------------ the shipped corpus vs the spec
def spec_rules() -> dict:
    """{rule number: {error names}} from the tables of spec §12 (placement rows for rules 27 and 33)."""
    sec = SPEC[SPEC.index("## 12. Validation"):SPEC.index("## 13. Writing")]
    names = lambda text: set(re.findall(r"`([A-Z][A-Za-z]+)`", text)) & ERROR_CLASSES  # noqa: E731
    placement = names(sec[sec.index("Placement of an item"):sec.index("Blob content rules")])
    rules = {}
    for num, rule, err in re.findall(r"^\| (\d+b?) \| (.*) \| (.*) \|$", sec, re.M):
        errs = placement if "see below" in err else names(rule) if "see left" in err else names(err)
        assert errs, f"rule {num}: no error name parsed from {err!r}"
        assert num not in rules, f"rule {num} listed twice"
        rules[num] = errs
    return rules


def _manifest():
    return json.loads((CORRUPT_DIR / MANIFEST).read_text(encoding="utf-8"))


def test_spec_rule_list_parses():
    rules = spec_rules()
    assert [r for r in rules if not r.isdigit()] == ["15b", "31b", "39b"]
    assert sorted(int(r) for r in rules if r.isdigit()) == list(range(1, 42))
    assert rules["15"] == {"OverlappingTensors", "HoleInData"}
    assert rules["27"] == rules["33"] == {"SizeOverflow", "MisalignedOffset", "OverlappingTensors", "HoleInData",
                                          "OffsetOutOfRange", "NonZeroPadding"}


def test_manifest_covers_every_rule_and_error_of_the_spec():
    rules = spec_rules()
    cases = _manifest()["cases"]
    covered = {(c["rule"], c["error"]) for c in cases.values()}
    wanted = {(r, e) for r, errs in rules.items() for e in errs}
    assert wanted - covered == set(), f"spec rules without a corrupt vector: {sorted(wanted - covered)}"
    assert covered - wanted == set(), f"corrupt vectors naming a rule/error the spec does not: {covered - wanted}"


def test_manifest_lists_exactly_the_generated_cases():
    cases = _manifest()["cases"]
    assert cases == {case_file(c): {"rule": c.rule, "error": c.error, "mentions": c.mentions,
                                    **({"base": f"../{ASYM_BASE_VECTOR}.nanoqwen"} if c.asym else {}),
                                    **({"read_blob": c.read_blob} if c.read_blob else {})} for c in corrupt_cases()}
    assert sorted(p.name for p in CORRUPT_DIR.glob("*.nanoqwen")) == sorted(cases)
    assert (CORRUPT_DIR / _manifest()["base"]).resolve() == BASE_PATH.resolve()


@pytest.mark.parametrize("name", sorted(_manifest()["cases"]))
def test_shipped_corrupt_vector_raises_its_error(name):
    """What a second implementation runs: the Python reader on every file of spec/vectors/corrupt/."""
    entry = _manifest()["cases"][name]
    with pytest.raises(E.NanoqwenFormatError) as ei:
        _open_and_read(CORRUPT_DIR / name, entry.get("read_blob"))
    assert type(ei.value).__name__ == entry["error"], f"{name}: {type(ei.value).__name__}: {ei.value}"


def test_vectors_folder_is_small():
    total = sum(p.stat().st_size for p in VECTORS.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    assert total < VECTORS_MAX_BYTES, total


# ------------------------------------------------------------------------------ bounds and blob content rules
def test_missing_tensor_check_is_linear_in_the_directory_not_in_n_layers(base, monkeypatch):
    """Rules 35-37 on a directory of 15 names under configs claiming 256 and 2^32-1 layers: MissingTensor after
    looking at no more than n_tensors + 1 names of the canonical order (not ~12 * n_layers)."""
    with open_file(BASE_PATH) as f:
        cfg, items = f.config, [(t.name, t.shape) for t in f.tensors.values()]
    looked = []
    original = V.iter_expected_tensors

    def counting(c):
        for item in original(c):
            looked.append(item[0])
            yield item

    monkeypatch.setattr(V, "iter_expected_tensors", counting)
    for n_layers in (256, 2**32 - 1):
        looked.clear()
        with pytest.raises(E.MissingTensor, match=r"model\.layers\.1\.input_layernorm"):
            V.check_names_against_config(items, dataclasses.replace(cfg, n_layers=n_layers))
        assert len(looked) <= len(items) + 1, len(looked)


def test_layer_count_cap_applies_to_the_writer_config_too():
    from nanoqwen_format.config import validate_config
    from format_helpers import TINY
    validate_config(dataclasses.replace(TINY, n_layers=256))
    with pytest.raises(E.ConfigMismatch, match="n_layers.*256.*257"):
        validate_config(dataclasses.replace(TINY, n_layers=257))


@pytest.mark.parametrize("text", ['{"a": 1}', ' \n[1, -0, 1e400, "\\u00e9"]\t', '"s"', "null", '{"a": {"a": 1}}'])
def test_valid_json_blobs_parse(text):
    assert V.parse_blob_json(BlobKind.PROVENANCE, text) == json.loads(text)


@pytest.mark.parametrize("text", ["", "NaN", "[Infinity]", '{"a": -Infinity}', '{"a": 1, "a": 1}', "{} []",
                                  "[" * 100_000 + "]" * 100_000])
def test_invalid_json_blobs_are_named_errors(text):
    with pytest.raises(E.BadBlobEncoding, match="PROVENANCE"):
        V.parse_blob_json(BlobKind.PROVENANCE, text)


def test_check_blob_content_for_writers():
    V.check_blob_content(BlobKind.CHAT_TEMPLATE, b"")           # an empty text blob is allowed
    V.check_blob_content(BlobKind.TOKENIZER_JSON, b'{"x": 1}')
    for kind, data in [(BlobKind.CHAT_TEMPLATE, b"\xef\xbb\xbfhi"), (BlobKind.TOKENIZER_JSON, b""),
                       (BlobKind.GENERATION_CONFIG, b'{"t": NaN}'), (BlobKind.CHAT_TEMPLATE, b"\xc0\xaf")]:
        with pytest.raises(E.BadBlobEncoding, match=kind.name):
            V.check_blob_content(kind, data)
