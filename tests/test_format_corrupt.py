"""One handcrafted corrupt file per validation rule of spec §12, each asserting its specific error class and that
the message names the field/tensor with expected vs found values."""
import json

import pytest

from nanoqwen_format import BlobKind, open_file
from nanoqwen_format import errors as E

from format_corrupt import BASE_CFG, KB, Mutator, build_base, corrupt_cases, write_corpus

@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return build_base(tmp_path_factory.mktemp("corrupt") / "base.nanoqwen")


@pytest.mark.parametrize("mutate,err,sub", [pytest.param(fn, err, sub, id=i) for i, fn, err, sub in corrupt_cases()])
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
    covered = {err for _, _, err, _ in corrupt_cases()}
    assert classes - covered == {E.NanoqwenFormatError, E.WriterUsageError}


def test_written_corpus_matches_expected(tmp_path):
    """The corpus for other implementations (python tests/format_corrupt.py OUT_DIR) raises what it claims."""
    expected = write_corpus(tmp_path)
    assert json.loads((tmp_path / "expected.json").read_text()) == expected
    with open_file(tmp_path / "base.nanoqwen"):
        pass
    for case_id, err_name in expected.items():
        with pytest.raises(E.NanoqwenFormatError) as ei:
            open_file(tmp_path / f"{case_id}.nanoqwen")
        assert type(ei.value).__name__ == err_name, case_id
