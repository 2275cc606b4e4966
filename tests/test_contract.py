"""The one contract between Python, the C++ library and ctypes (CPU test, no GPU needed).

(a) csrc/src/format_contract.h is what scripts/gen_contract.py generates from nanoqwen_format now;
(b) when libnanoqwen.so is built: nq_abi_describe()'s "format" equals the Python facts, and its "structs" /
    "status" equal the ctypes structures and status codes of nanoqwen_rt.backends.cuda.abi, field by field;
(c) nq_model_check accepts the spec's golden vectors (NQ_OK, or NQ_E_UNSUPPORTED naming why: they are tiny) and
    rejects every corrupt vector of spec/vectors/corrupt/manifest.json with NQ_E_FORMAT and the spec's error name
    first in its message (the checksum rules 38-39 through nq_model_open with checksums on), and names the same
    rule as the Python reader on seeded random corruptions.
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
NQ_OK, NQ_E_IO, NQ_E_FORMAT, NQ_E_UNSUPPORTED, NQ_E_NO_DEVICE = 0, -2, -3, -4, -7


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
    lib.nq_model_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)]
    lib.nq_model_free.argtypes = [ctypes.c_void_p]
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


CORRUPT = ROOT / "spec" / "vectors" / "corrupt"
MANIFEST = json.loads((CORRUPT / "manifest.json").read_text())["cases"]
CHECKSUM_RULES = ("38", "39", "39b")   # spec §12: applied only when the caller verifies checksums


def _error_name(msg: str) -> str:
    """The library's format messages start with the spec's error name, then ': '."""
    return msg.split(":", 1)[0]


def _open_verified(lib, path):
    h = ctypes.c_void_p()
    rc = lib.nq_model_open(str(path).encode(), 1, ctypes.byref(h))
    if rc == NQ_OK:
        lib.nq_model_free(h)
    return rc, lib.nq_last_error().decode()


def test_manifest_covers_the_open_rules():
    """The walk below sees what the spec ships: cases that fail at open, and blob-content cases."""
    at_open = [n for n, c in MANIFEST.items() if "read_blob" not in c]
    assert len(at_open) == 119 and len(MANIFEST) - len(at_open) == 14
    assert all((CORRUPT / n).is_file() for n in MANIFEST)


@pytest.mark.parametrize("case", sorted(MANIFEST), ids=sorted(MANIFEST))
def test_model_check_rejects_every_corrupt_vector_by_name(lib, case):
    want = MANIFEST[case]
    path = CORRUPT / case
    if "read_blob" in want:
        # rules 40-41 apply when a blob's content is read; libnanoqwen never reads blobs, and the file itself is
        # valid: every rule at open passes.
        rc, msg = _check(lib, path)
        assert rc in (NQ_OK, NQ_E_UNSUPPORTED), (rc, msg)
        pytest.skip(f"rule {want['rule']} ({want['error']}): blob content, checked when a blob is read; "
                    "the library does not read blobs")
    if want["rule"] in CHECKSUM_RULES:
        rc, msg = _open_verified(lib, path)   # validates before it looks for a device
        assert rc == NQ_E_FORMAT and _error_name(msg) == want["error"], (rc, msg)
        rc, msg = _check(lib, path)           # nq_model_check does not verify checksums: every other rule passes
        assert rc in (NQ_OK, NQ_E_UNSUPPORTED), (rc, msg)
        return
    rc, msg = _check(lib, path)
    assert rc == NQ_E_FORMAT, (rc, msg)
    assert _error_name(msg) == want["error"], msg


# Seeded random corruptions of the golden vectors' directories (header CRC refixed most of the time, so the later
# rules are reached): the C++ loader and the Python reader (nanoqwen_format) must name the same first failing rule.
DIFFERENTIAL_CASES = 400


def test_loader_and_python_reader_agree_on_random_corruptions(lib, tmp_path):
    import random
    import struct
    from nanoqwen_format.crc import crc32c
    from nanoqwen_format.errors import NanoqwenFormatError
    from nanoqwen_format.reader import open_file

    rng = random.Random(7)
    bases = [v.read_bytes() for v in VECTORS]
    path = tmp_path / "mutated.nanoqwen"
    failures, rejected = [], 0
    for case in range(DIFFERENTIAL_CASES):
        raw = bytearray(rng.choice(bases))
        header_size = struct.unpack_from("<I", raw, 12)[0]
        for _ in range(rng.choice([1, 1, 2])):
            pos = rng.randrange(header_size if rng.random() < 0.9 else len(raw))
            raw[pos] = rng.randrange(256) if rng.random() < 0.5 else raw[pos] ^ (1 << rng.randrange(8))
        new_size = struct.unpack_from("<I", raw, 12)[0]
        if rng.random() < 0.9 and 44 <= new_size <= len(raw):
            head = bytearray(raw[:new_size])
            head[40:44] = bytes(4)
            struct.pack_into("<I", raw, 40, crc32c(bytes(head)))
        path.write_bytes(bytes(raw))
        try:
            open_file(path, verify_checksums=True)
            want = None
        except NanoqwenFormatError as e:
            want = type(e).__name__
        rc, msg = _open_verified(lib, path)
        got = _error_name(msg) if rc == NQ_E_FORMAT else None
        rejected += want is not None
        if got != want or (want is None and rc not in (NQ_OK, NQ_E_UNSUPPORTED, NQ_E_NO_DEVICE)):
            failures.append((case, want, rc, msg))
    assert not failures, failures[:5]
    assert rejected > DIFFERENTIAL_CASES // 2, "the mutations mostly reach a rule"


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


def test_model_check_int4_tied_embedding_is_unsupported(lib, tmp_path):
    """A tied int4 embedding is valid (spec/vectors/tiny_int4_tied.nanoqwen is one) but the CUDA embedding gather
    reads plain rows: "unsupported", naming the embedding. The golden vector's head_dim 16 would be refused first,
    so this file keeps everything else inside the library's limits (head_dim 64, multiples of 64)."""
    from format_helpers import make_random_file  # tests/format_helpers.py
    from nanoqwen_format import DType, ModelConfig
    cfg = ModelConfig(arch="llama", n_layers=1, hidden_size=64, intermediate_size=128, n_heads=2, n_kv_heads=1,
                      head_dim=64, vocab_rows=80, max_positions=128, rope_theta=10_000.0, rms_norm_eps=1e-5,
                      tied_embeddings=True, qkv_bias=False, bos_token_id=-1, eos_token_id=1, pad_token_id=-1)

    def int4_matrices(name, shape):
        return (DType.INT4G, 32) if len(shape) == 2 else (DType.F32, 0)

    path = tmp_path / "int4_tied_hd64.nanoqwen"
    make_random_file(path, cfg, seed=3, dtype_for=int4_matrices)
    rc, msg = _check(lib, path)
    assert rc == NQ_E_UNSUPPORTED, (rc, msg)
    assert "embed_tokens" in msg and "int4" in msg, msg
    assert "\n" not in msg


def _layout_2_file(path, qkv_layouts=(2, 2, 2)):
    """A random model inside the library's limits (head_dim 64, multiples of 64) whose projections are int4g layout 2
    (q/k/v as qkv_layouts says), written by the format's writer; returns the path."""
    import numpy as np
    from format_helpers import random_payload, specs_for, write_file  # tests/format_helpers.py
    from nanoqwen_format import DType, ModelConfig, TensorSpec
    from nanoqwen_format.constants import LAYOUT_INT4_ROWMAJOR_K8, LAYOUT_INT4_ROWMAJOR_K8_ASYM
    cfg = ModelConfig(arch="qwen2", n_layers=1, hidden_size=128, intermediate_size=192, n_heads=2, n_kv_heads=1,
                      head_dim=64, vocab_rows=80, max_positions=128, rope_theta=10_000.0, rms_norm_eps=1e-6,
                      tied_embeddings=False, qkv_bias=True, bos_token_id=-1, eos_token_id=1, pad_token_id=-1)
    rng = np.random.default_rng(5)
    lay = {"q_proj": qkv_layouts[0], "k_proj": qkv_layouts[1], "v_proj": qkv_layouts[2]}
    specs, payloads = [], {}
    for sp in specs_for(cfg, lambda name, shape: (DType.INT4G, 32) if "proj.weight" in name else (DType.F16, 0)):
        if sp.dtype == DType.INT4G:
            asym = lay.get(sp.name.split(".")[-2], 2) == 2
            sp = TensorSpec(sp.name, sp.dtype, sp.shape, sp.group_size,
                            LAYOUT_INT4_ROWMAJOR_K8_ASYM if asym else LAYOUT_INT4_ROWMAJOR_K8)
            q, sc = random_payload(sp, rng)
            payloads[sp.name] = (q, sc, rng.integers(0, 16, size=sc.shape, dtype=np.uint8)) if asym else (q, sc)
        else:
            payloads[sp.name] = random_payload(sp, rng)
        specs.append(sp)
    return write_file(path, cfg, specs, payloads)


def test_model_check_accepts_int4_layout_2(lib, tmp_path):
    """The asymmetric int4g layout 2 (spec 9.5) runs on the CUDA backend (its kernels' layout-2 builds): a valid
    layout-2 model inside the library's limits passes nq_model_check (the golden vector tiny_int4_asym is refused for
    its head_dim 16, not for its layout)."""
    rc, msg = _check(lib, _layout_2_file(tmp_path / "asym.nanoqwen"))
    assert rc == NQ_OK, msg
    rc, msg = _check(lib, ROOT / "spec" / "vectors" / "tiny_int4_asym.nanoqwen")
    assert rc == NQ_E_UNSUPPORTED and "head_dim" in msg and "layout" not in msg, (rc, msg)


def test_model_check_refuses_mixed_qkv_layouts(lib, tmp_path):
    """q/k/v of one layer in different int4 layouts: the fused decode GEMV takes one layout per launch group, and the
    loader keeps fused weights alike (as it does for dtype and group size): unsupported, naming the layer."""
    rc, msg = _check(lib, _layout_2_file(tmp_path / "mixed.nanoqwen", qkv_layouts=(2, 1, 2)))
    assert rc == NQ_E_UNSUPPORTED and "layer 0" in msg and "int4 layout" in msg, (rc, msg)
    assert "\n" not in msg
