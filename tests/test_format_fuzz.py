"""Property/fuzz test (hypothesis): any mutation of a valid file (bit flips, truncation, appended bytes, header /
directory field values, with and without a re-computed header CRC) either opens and reads cleanly or raises a
NanoqwenFormatError subclass — never another exception, a crash or a hang. Plus: hostile size fields never make
the reader allocate beyond the file's own size."""
import atexit
import os
import shutil
import struct
import tempfile
import tracemalloc
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nanoqwen_format import BlobKind, DType, ModelConfig, NanoqwenFormatError, open_file

from format_corrupt import BLOB_FIELDS, CONFIG_FIELDS, HEADER_FIELDS, TENSOR_FIELDS, Mutator
from format_helpers import make_random_file

CFG = ModelConfig(arch="qwen2", n_layers=1, hidden_size=32, intermediate_size=64, n_heads=2, n_kv_heads=1,
                  head_dim=16, vocab_rows=24, max_positions=64, rope_theta=1e6, tied_embeddings=False, qkv_bias=True,
                  eos_token_id=3)


def _dtypes(name, shape):
    if "proj.weight" in name:
        return DType.INT4G, 32
    return (DType.BF16, 0) if "embed" in name else (DType.F16, 0) if "lm_head" in name else (DType.F32, 0)


_DIR = tempfile.mkdtemp(prefix="nanoqwen-fuzz-")
atexit.register(shutil.rmtree, _DIR, True)
_BASE_PATH = os.path.join(_DIR, "base.nanoqwen")
make_random_file(_BASE_PATH, cfg=CFG, seed=5, dtype_for=_dtypes,
                 blobs={BlobKind.TOKENIZER_JSON: b'{"model": {"type": "BPE"}}', BlobKind.CHAT_TEMPLATE: b"{{ x }}",
                        BlobKind.PROVENANCE: b'{"by": "fuzz"}'})
BASE = open(_BASE_PATH, "rb").read()
HEADER_SIZE = struct.unpack_from("<I", BASE, 12)[0]
N_TENSORS = struct.unpack_from("<I", BASE, 32)[0]
N_BLOBS = struct.unpack_from("<I", BASE, 36)[0]

_FMT_BITS = {"I": 32, "i": 32, "Q": 64, "f": 32, "d": 64}


def _interesting_ints(bits):
    top = 2**bits - 1
    return st.one_of(st.sampled_from([0, 1, 2, 3, 7, 8, 31, 32, 64, 127, 128, 129, 255, 256, 4096, 65536, 65537,
                                      2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**62, 2**63, top - 127, top] if bits == 64
                                     else [0, 1, 2, 3, 7, 8, 16, 31, 32, 48, 64, 127, 128, 256, 4096, 65536,
                                           65537, 2**31 - 1, 2**31, 2**32 - 1]),
                     st.integers(0, top))


@st.composite
def field_mutation(draw):
    """(position, struct fmt, value) of one header / config / entry field."""
    where = draw(st.sampled_from(["header", "config", "tensor", "blob"]))
    if where == "header":
        name = draw(st.sampled_from(sorted(k for k in HEADER_FIELDS if k != "magic")))
        pos, fmt = HEADER_FIELDS[name]
    elif where == "config":
        name = draw(st.sampled_from(sorted(CONFIG_FIELDS)))
        pos, fmt = CONFIG_FIELDS[name]
        pos += 48
    elif where == "tensor":
        name = draw(st.sampled_from(sorted(k for k in TENSOR_FIELDS if k != "name")))
        pos, fmt = TENSOR_FIELDS[name]
        pos += 256 + 136 * draw(st.integers(0, N_TENSORS - 1))
    else:
        name = draw(st.sampled_from(sorted(BLOB_FIELDS)))
        pos, fmt = BLOB_FIELDS[name]
        pos += 256 + 136 * N_TENSORS + 64 * draw(st.integers(0, N_BLOBS - 1))
    if fmt in ("f", "d"):
        value = draw(st.floats(allow_nan=True, allow_infinity=True, width=32 if fmt == "f" else 64))
    else:
        value = draw(_interesting_ints(_FMT_BITS[fmt]))
        if fmt == "i":
            value = value - 2**32 if value >= 2**31 else value
    return pos, fmt, value


@st.composite
def mutated_file(draw):
    kind = draw(st.sampled_from(["bitflip", "truncate", "append", "field", "mixed"]))
    m = Mutator(BASE)
    fix = draw(st.booleans())
    if kind in ("bitflip", "mixed"):
        for _ in range(draw(st.integers(1, 8))):
            # most flips land in the header/directory (where the structure lives), some in the data, few in magic
            region = draw(st.sampled_from(["directory"] * 5 + ["data"] * 2 + ["magic"]))
            lo, hi = {"directory": (8, HEADER_SIZE + 127), "data": (HEADER_SIZE, len(BASE) - 1),
                      "magic": (0, 7)}[region]
            pos = draw(st.integers(lo, hi))
            m.b[pos] ^= 1 << draw(st.integers(0, 7))
    if kind in ("field", "mixed"):
        for _ in range(draw(st.integers(1, 3))):
            pos, fmt, value = draw(field_mutation())
            struct.pack_into("<" + fmt, m.b, pos, value)
    if fix:
        m.fix_crc()
    data = m.bytes()
    if kind == "truncate":
        data = data[:draw(st.integers(0, len(data) - 1))]
    if kind == "append":
        data = data + draw(st.binary(min_size=1, max_size=300))
    return data


def _exercise(path):
    """Open and read everything; only NanoqwenFormatError may escape."""
    with open_file(path) as f:
        for name, t in f.tensors.items():
            a = f.float32(name)
            assert a.shape == t.shape
            if t.dtype == DType.INT4G:
                f.int4(name)
            else:
                f.array(name)
        for kind in BlobKind:
            f.blob(kind)
            try:
                f.blob_json(kind) if kind != BlobKind.CHAT_TEMPLATE else f.blob_text(kind)
            except NanoqwenFormatError:
                pass
        f.verify_checksums()


def test_base_file_opens():
    _exercise(_BASE_PATH)


# deadline: a hang guard only (a typical example takes a few ms); derandomize: the same examples on every CI run
@pytest.mark.timeout(600)
@settings(max_examples=200, deadline=timedelta(seconds=10), derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=mutated_file())
def test_mutations_raise_only_format_errors(data):
    path = os.path.join(_DIR, "mutant.nanoqwen")
    with open(path, "wb") as fh:
        fh.write(data)
    try:
        _exercise(path)
    except NanoqwenFormatError as e:
        assert str(e)  # every error carries a message


@pytest.mark.parametrize("field,value", [
    (("header", "n_tensors"), 65536), (("header", "header_size"), 16 * 2**20), (("header", "file_size"), 2**62),
    (("tensor", "shape0"), 2**40), (("tensor", "nbytes"), 2**62), (("tensor", "offset"), 2**63),
    (("blob", "nbytes"), 2**62), (("header", "data_offset"), 2**62)])
@pytest.mark.parametrize("fix", [False, True])
def test_hostile_sizes_do_not_allocate(field, value, fix, tmp_path):
    m = Mutator(BASE)
    where, name = field
    if where == "header":
        m.header(name, value)
        if name == "n_tensors":
            m.header("header_size", 256 + 136 * value + 64 * N_BLOBS)  # consistent, so only the file length stops it
    elif where == "tensor":
        m.tensor(0, name, value)
    else:
        m.blob(0, name, value)
    if fix:
        m.fix_crc()
    path = tmp_path / "hostile.nanoqwen"
    path.write_bytes(m.bytes())
    tracemalloc.start()
    try:
        with pytest.raises(NanoqwenFormatError):
            open_file(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # the reader may copy the header (<= file) and build small per-entry objects; 1 MiB of slack for the
    # interpreter's own bookkeeping (exception objects, tracebacks), far below any size the fields claim
    assert peak < len(BASE) + 2**20, peak
