"""The one contract between Python, the C++ library and ctypes (CPU test, no GPU needed).

(a) csrc/src/format_contract.h is what scripts/gen_contract.py generates from nanoqwen_format now;
(b) when libnanoqwen.so is built: nq_abi_describe()'s "format" equals the Python facts, and its "structs" /
    "status" equal the ctypes structures and status codes of nanoqwen_rt.backends.cuda.abi, field by field;
(c) nq_model_check accepts the spec's golden vectors (NQ_OK, or NQ_E_UNSUPPORTED naming why: they are tiny) and
    rejects corrupt files with NQ_E_FORMAT and a message naming the rule.
"""
from __future__ import annotations

import ctypes
import json
import math
import sys
from pathlib import Path

import pytest

from format_corrupt import Mutator  # tests/format_corrupt.py

ROOT = Path(__file__).resolve().parent.parent
VECTORS = sorted((ROOT / "spec" / "vectors").glob("*.nanoqwen"))
NQ_OK, NQ_E_IO, NQ_E_FORMAT, NQ_E_UNSUPPORTED = 0, -2, -3, -4


def _gen_contract():
    """scripts/gen_contract.py as a module (scripts/ is not a package)."""
    if str(ROOT / "scripts") not in sys.path:
        sys.path.insert(0, str(ROOT / "scripts"))
    import gen_contract
    return gen_contract


def test_generated_header_is_current():
    gen = _gen_contract()
    committed = (ROOT / "csrc" / "src" / "format_contract.h").read_text()
    assert gen.render(gen.facts()) == committed, "csrc/src/format_contract.h is stale: run python scripts/gen_contract.py"


def test_facts_come_from_the_python_package():
    """A spot check that facts() reads the package (not a copy): the values the spec defines."""
    from nanoqwen_format import constants as C
    from nanoqwen_format.shapes import KV_PAGE_TOKENS
    f = _gen_contract().facts()
    assert f["int4_perm"] == list(C.INT4_PERM) and f["int4_group_sizes"] == list(C.INT4_GROUP_SIZES)
    assert f["dtypes"] == {"f32": 0, "f16": 1, "bf16": 2, "int4g": 3}
    assert f["max_n_layers"] == C.MAX_N_LAYERS and f["kv_page_tokens"] == KV_PAGE_TOKENS
    assert f["header"]["header_crc32c"] == C.HEADER_CRC_OFFSET
    assert f["tensor_entry"]["name"] == 0 and f["tensor_entry"]["dtype"] == C.TENSOR_NAME_SIZE


@pytest.fixture(scope="module")
def lib():
    from nanoqwen_rt.backends.cuda.abi import library_path
    path = library_path()
    if not path.is_file():
        pytest.skip(f"{path} is not built (scripts/build_native.sh builds it where nvcc is present)")
    lib = ctypes.CDLL(str(path))
    lib.nq_abi_describe.restype = ctypes.c_char_p
    lib.nq_last_error.restype = ctypes.c_char_p
    lib.nq_model_check.argtypes = [ctypes.c_char_p]
    return lib


@pytest.fixture(scope="module")
def described(lib):
    return json.loads(lib.nq_abi_describe().decode())


def test_library_format_equals_python(described):
    assert described["format"] == _gen_contract().facts()


def test_library_abi_version(lib, described):
    assert described["abi_version"] == lib.nq_abi_version()


_CTYPE_NAMES = {ctypes.c_int32: "i32", ctypes.c_uint32: "u32", ctypes.c_float: "f32", ctypes.c_double: "f64",
                ctypes.c_uint64: "u64", ctypes.c_int64: "i64"}


@pytest.mark.parametrize("c_name,py_name", [("nq_config", "NqConfig"), ("nq_sampling", "NqSampling")])
def test_ctypes_structs_match_the_library(described, c_name, py_name):
    from nanoqwen_rt.backends.cuda import abi
    cls = getattr(abi, py_name)
    want = described["structs"][c_name]
    got = {name: [getattr(cls, name).offset, _CTYPE_NAMES[ctype]] for name, ctype in cls._fields_}
    assert got == want["fields"], f"{py_name} vs {c_name}"
    assert list(got) == list(want["fields"]), f"{py_name}: field order differs from {c_name}"
    assert ctypes.sizeof(cls) == want["size"]


def test_status_codes_match_the_library(described):
    from nanoqwen_rt.backends.cuda import abi
    assert described["status"] == abi.NQ_STATUS, "status names and codes: library vs binding"


def _check(lib, path):
    rc = lib.nq_model_check(str(path).encode())
    return rc, lib.nq_last_error().decode()


@pytest.mark.parametrize("vec", VECTORS, ids=[v.name for v in VECTORS])
def test_model_check_accepts_golden_vectors(lib, vec):
    rc, msg = _check(lib, vec)
    assert rc in (NQ_OK, NQ_E_UNSUPPORTED), (rc, msg)
    if rc == NQ_E_UNSUPPORTED:
        assert msg, "an unsupported verdict names its reason"


def _corrupt(raw: bytes) -> dict:
    m = Mutator
    return {
        "BadMagic": m(raw).header("magic", b"NANOQWEX").bytes(),
        "MAX_N_LAYERS": m(raw).config("n_layers", 300).fix_crc().bytes(),
        "rope_scaling_factor": m(raw).config("rope_scaling_factor", math.nan).fix_crc().bytes(),
        "ChecksumMismatch": m(raw).config("rope_theta", 123.0).bytes(),       # header CRC not fixed
        "TruncatedFile": raw[:-1],
    }


@pytest.mark.parametrize("rule", ["BadMagic", "MAX_N_LAYERS", "rope_scaling_factor", "ChecksumMismatch",
                                  "TruncatedFile"])
def test_model_check_rejects_corrupt_files_by_name(lib, tmp_path, rule):
    bad = tmp_path / "bad.nanoqwen"
    bad.write_bytes(_corrupt(VECTORS[0].read_bytes())[rule])
    rc, msg = _check(lib, bad)
    assert rc == NQ_E_FORMAT, (rc, msg)
    assert rule in msg, msg


def test_model_check_missing_file_is_io_error(lib, tmp_path):
    rc, msg = _check(lib, tmp_path / "nope.nanoqwen")
    assert rc == NQ_E_IO and "nope.nanoqwen" in msg
