"""CPU test (runs in CI, no GPU needed): csrc/ compiles with nvcc, libnanoqwen.so exports the production C ABI and
nothing else, libnanoqwen_testing.so the kernel test/bench entry points, the host rules it exposes hold (the page
table's argument rule, the decode GEMV's launch plans), and the C loader applies the spec's validation rules (it
parses and validates before it looks for a device, so on a machine without a GPU a valid file gets NQ_E_NO_DEVICE
and a corrupt one NQ_E_FORMAT naming the rule).
Skipped when nvcc is not on PATH (the package then runs on the CPU backend only)."""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from format_corrupt import Mutator  # noqa: E402  (tests/format_corrupt.py)

ROOT = Path(__file__).resolve().parent.parent
VECTORS = sorted((ROOT / "spec" / "vectors").glob("*.nanoqwen"))
NQ_E_FORMAT, NQ_E_NO_DEVICE, NQ_E_IO, NQ_E_UNSUPPORTED = -3, -7, -2, -4
SPEC_ERROR_NAMES = {c["error"] for c in json.loads(
    (ROOT / "spec" / "vectors" / "corrupt" / "manifest.json").read_text())["cases"].values()}

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None or shutil.which("cmake") is None,
                                reason="nvcc/cmake not on PATH: the CUDA library is not built here")


@pytest.fixture(scope="module")
def libpath():
    """Build with scripts/build_native.sh (sm_90a + sm_80, as shipped) in its default build dir, so a build the
    quick-start scripts already made is reused incrementally (CI compiles csrc once)."""
    env = dict(os.environ)
    env.pop("NANOQWEN_CUDA_ARCHS", None)
    r = subprocess.run(["bash", str(ROOT / "scripts" / "build_native.sh")], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    so = Path(env.get("NANOQWEN_BUILD_DIR", ROOT / "build" / "csrc")) / "libnanoqwen.so"
    assert so.is_file()
    return so


def test_short_context_bound_is_read_from_kernels_h():
    """The GPU tests and bench/attn_bench.py take the short-context graphs' bound from csrc/src/kernels.h
    (nq_testing_lib.short_context_keys): the parse finds it, it scales as 1 / head_dim, and it is whole 16-key tiles
    over the cluster's 8 blocks at both Qwen2.5 head sizes."""
    from nq_testing_lib import short_context_keys
    for d in (64, 128):
        assert short_context_keys(d) > 0 and short_context_keys(d) % (8 * 16) == 0
    assert short_context_keys(64) == 2 * short_context_keys(128)


TESTING_PREFIXES = ("nq_test_", "nq_bench_")


def _exported(path):
    nm = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True, check=True)
    return {line.split()[-1] for line in nm.stdout.splitlines() if " T " in line}


def test_exports_every_abi_symbol(libpath):
    from nanoqwen_rt.backends.cuda.abi import EXPORTED_SYMBOLS
    exported = _exported(libpath)
    production = {s for s in EXPORTED_SYMBOLS if not s.startswith(TESTING_PREFIXES)}
    missing = (production | {"nq_model_check", "nq_abi_describe"}) - exported
    assert not missing, f"not exported: {sorted(missing)}"
    # nothing but the C ABI leaks (C++ internals are hidden), and no test or bench entry point ships
    assert all(s.startswith("nq_") for s in exported), sorted(s for s in exported if not s.startswith("nq_"))
    assert not [s for s in exported if s.startswith(TESTING_PREFIXES)], sorted(exported)
    # the CUDA runtime is linked statically, and the product does not depend on the testing library
    ldd = subprocess.run(["ldd", str(libpath)], capture_output=True, text=True)
    assert "libcudart" not in ldd.stdout and "nanoqwen_testing" not in ldd.stdout


def test_testing_library_exports_its_entry_points(libpath):
    from nq_testing_lib import SIGNATURES
    testing = libpath.parent / "libnanoqwen_testing.so"
    exported = _exported(testing)
    missing = set(SIGNATURES) - exported
    assert not missing, f"not exported by {testing.name}: {sorted(missing)}"
    assert all(s.startswith("nq_") for s in exported)
    # it loads on its own (no GPU needed to load) and reports its own errors
    lib = ctypes.CDLL(str(testing))
    lib.nq_last_error.restype = ctypes.c_char_p
    assert lib.nq_bench_gemv_int4_mode(0, 0, 128, 0, 1, None) == -1     # NQ_E_INVALID_ARG: NULL output
    assert b"bad argument" in lib.nq_last_error()
    # a group that does not fit K is refused before anything divides by it (group 0 was a SIGFPE)
    ms = ctypes.c_float()
    for group in (0, 48):
        assert lib.nq_bench_gemv_int4_mode(4096, 4096, group, 0, 1, ctypes.byref(ms)) == -1
        assert b"group" in lib.nq_last_error()
    # int4g layouts are 1 and 2; any other is refused before anything is allocated
    for layout in (0, 3):
        assert lib.nq_bench_gemv_int4_layout(4096, 4096, 128, 0, layout, 1, ctypes.byref(ms)) == -1
        assert b"bad argument" in lib.nq_last_error()
        assert lib.nq_bench_gemm_int4_layout(64, 4096, 4096, 128, 1, layout, 1, ctypes.byref(ms)) == -1
        assert b"bad argument" in lib.nq_last_error()


def test_sm90a_and_sm80_code_present(libpath):
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump is None:
        pytest.skip("cuobjdump not on PATH")
    r = subprocess.run([cuobjdump, "--list-elf", str(libpath)], capture_output=True, text=True, check=True)
    assert "sm_90a" in r.stdout and "sm_80" in r.stdout, r.stdout


@pytest.fixture(scope="module")
def lib(libpath):
    lib = ctypes.CDLL(str(libpath))
    lib.nq_last_error.restype = ctypes.c_char_p
    lib.nq_model_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)]
    lib.nq_model_free.argtypes = [ctypes.c_void_p]
    return lib


def _open(lib, path, verify=1):
    h = ctypes.c_void_p()
    rc = lib.nq_model_open(str(path).encode(), verify, ctypes.byref(h))
    if rc == 0:
        lib.nq_model_free(h)
    return rc, lib.nq_last_error().decode()


def test_loads_without_gpu_and_reports_devices(lib):
    from nanoqwen_rt.backends.cuda.abi import NQ_ABI_VERSION
    assert lib.nq_abi_version() == NQ_ABI_VERSION   # the binding's one copy of the number
    assert lib.nq_device_count() >= 0          # 0 here: no driver/GPU, and no abort


def test_kv_pool_entry_points_refuse_bad_arguments_by_name(lib):
    """The pool's C ABI without a device: NULL handles are named, and the free-memory query says there is no
    device (here) instead of failing some other way."""
    P = ctypes.c_void_p
    free, total = ctypes.c_uint64(), ctypes.c_uint64()
    assert lib.nq_device_memory(ctypes.byref(free), ctypes.byref(total)) in (0, NQ_E_NO_DEVICE)
    assert lib.nq_device_memory(None, ctypes.byref(total)) == -1
    assert lib.nq_last_error() == b"nq_device_memory: NULL argument"
    assert lib.nq_kv_pool_create(None, 4, ctypes.byref(P())) == -1
    assert lib.nq_last_error() == b"nq_kv_pool_create: NULL argument"
    lib.nq_session_set_pages.argtypes = [P, P, ctypes.c_int32, ctypes.c_int32]
    assert lib.nq_session_set_pages(None, None, 0, 0) == -1
    assert lib.nq_last_error() == b"nq_session_set_pages: NULL session"
    lib.nq_kv_pool_free.argtypes = [P]
    lib.nq_kv_pool_free(None)                  # allowed, as every *_free


@pytest.mark.parametrize("pages,position,message", [
    ([1, 2, 3], 48, None),                                      # 3 full pages: positions 0..47 held, 48 next
    ([], 0, None),                                              # no pages (an ended sequence's session)
    ([1, 2, 3], 49, "set_pages: position 49 outside [0, 48] (3 pages of 16 positions, max_context 64)"),
    ([1, 2, 12], 0, "set_pages: page id 12 at index 2 out of range [0, 10)"),
    ([1, -1], 0, "set_pages: page id -1 at index 1 out of range [0, 10)"),
    ([1, 2, 1], 0, "set_pages: page id 1 listed twice"),
    ([1, 2, 3, 4, 5], 0, "set_pages: 5 pages outside [0, 4] (the session's max_context 64)"),
    ([1, 2, 3], -1, "set_pages: position -1 outside [0, 48] (3 pages of 16 positions, max_context 64)"),
])
def test_set_pages_argument_rule(libpath, pages, position, message):
    """nq_session_set_pages' rule (check_session_pages, run through the testing library: no device needed) for a
    session of max_context 64 (4 page-table entries) on a pool of 10 pages."""
    from nq_testing_lib import SIGNATURES
    t = ctypes.CDLL(str(libpath.parent / "libnanoqwen_testing.so"))
    res, args = SIGNATURES["nq_test_check_pages"]
    t.nq_test_check_pages.restype, t.nq_test_check_pages.argtypes = res, args
    t.nq_last_error.restype = ctypes.c_char_p
    a = (ctypes.c_int32 * max(1, len(pages)))(*pages)
    rc = t.nq_test_check_pages(10, 4, 64, a if pages else None, len(pages), position)
    if message is None:
        assert rc == 0
    else:
        assert rc == -1 and t.nq_last_error().decode() == message


def test_set_pages_position_is_bounded_by_max_context_too(libpath):
    t = ctypes.CDLL(str(libpath.parent / "libnanoqwen_testing.so"))
    t.nq_last_error.restype = ctypes.c_char_p
    a = (ctypes.c_int32 * 3)(0, 1, 2)
    assert t.nq_test_check_pages(10, 3, 40, a, 3, 40) == 0      # 3 pages hold 48, the context 40
    assert t.nq_test_check_pages(10, 3, 40, a, 3, 41) == -1
    assert t.nq_last_error() == b"set_pages: position 41 outside [0, 40] (3 pages of 16 positions, max_context 40)"


@pytest.mark.parametrize("vec", VECTORS, ids=[v.name for v in VECTORS])
def test_golden_vectors_pass_validation(lib, vec):
    rc, msg = _open(lib, vec)
    # The loader applies every spec rule (checksums included: verify=1) before any "this library does not run it"
    # check, so the only verdicts a valid file can get here are: unsupported (the golden vectors are tiny, head_dim
    # < 64), or no device (this machine has no GPU). tests/test_contract.py shows the order on the corrupt
    # vectors, whose base file is just as unsupported yet is rejected by the spec's error name.
    assert rc in (NQ_E_UNSUPPORTED, NQ_E_NO_DEVICE), (rc, msg)
    assert msg and msg.split(":", 1)[0] not in SPEC_ERROR_NAMES, msg


def _mutations(raw: bytes):
    m = Mutator
    first_off = m(raw).get_tensor(0, "offset")
    return {
        "BadMagic": m(raw).header("magic", b"NANOQWEX").bytes(),
        "UnsupportedVersion": m(raw).header("version", 2).fix_crc().bytes(),
        "HeaderTooLarge": m(raw).header("n_tensors", 70000).fix_crc().bytes(),
        "HeaderSizeMismatch": m(raw).header("header_size", m(raw).get_header("header_size") + 8).fix_crc().bytes(),
        "ChecksumMismatch": m(raw).config("rope_theta", 123.0).bytes(),                   # header CRC not fixed
        "TruncatedFile": raw[:-1],
        "NonZeroReserved": m(raw).header("flags", 1).fix_crc().bytes(),
        "ConfigMismatch": m(raw).config("n_kv_heads", 3).fix_crc().bytes(),
        "UnknownDType": m(raw).tensor(0, "dtype", 9).fix_crc().bytes(),
        "ByteLengthMismatch": m(raw).tensor(0, "nbytes", m(raw).get_tensor(0, "nbytes") + 2).fix_crc().bytes(),
        "MisalignedOffset": m(raw).tensor(0, "offset", first_off + 8).fix_crc().bytes(),
        "tensor ChecksumMismatch": m(raw).byte(first_off, raw[first_off] ^ 0xFF).bytes(),
    }


@pytest.mark.parametrize("rule", ["BadMagic", "UnsupportedVersion", "HeaderTooLarge", "HeaderSizeMismatch",
                                  "ChecksumMismatch", "TruncatedFile", "NonZeroReserved", "ConfigMismatch",
                                  "UnknownDType", "ByteLengthMismatch", "MisalignedOffset",
                                  "tensor ChecksumMismatch"])
def test_corrupt_files_are_rejected_by_name(lib, tmp_path, rule):
    raw = VECTORS[0].read_bytes()
    bad = tmp_path / "bad.nanoqwen"
    bad.write_bytes(_mutations(raw)[rule])
    rc, msg = _open(lib, bad)
    assert rc == NQ_E_FORMAT, (rc, msg)
    assert msg.split(":", 1)[0] == rule.split()[-1], msg


def test_missing_file_is_io_error(lib, tmp_path):
    rc, msg = _open(lib, tmp_path / "nope.nanoqwen")
    assert rc == NQ_E_IO and "nope.nanoqwen" in msg


# The decode GEMV's launch plans (gemv_frag.cuh frag_plan) for each Qwen2.5 size's four GEMVs at group 128 on 132 SMs
# (H100 / H200), as measured and chosen in bench/NOTES.md "Session 37" §2, "Session 38" §1-2 and "Session 40" §2 (the
# 14B's gate/up in 5-warp blocks): "wWsS" = W warps a
# block, K in S splits. A change of frag_plan that moves one of them must come with its measurement, and this table.
FRAG_PLANS_G128 = {
    "0.5B": {"qkv": "w4s4", "o": "w4s4", "gate": "w4s2", "down": "w4s16"},
    "1.5B": {"qkv": "w4s8", "o": "w4s8", "gate": "w4s2", "down": "w4s8"},
    "3B": {"qkv": "w4s4", "o": "w4s8", "gate": "w4s1", "down": "w4s8"},
    "7B": {"qkv": "w4s4", "o": "w4s4", "gate": "w4s1", "down": "w8s4"},
    "14B": {"qkv": "w4s4", "o": "w4s4", "gate": "w5s1", "down": "w4s4"},
    "32B": {"qkv": "w4s4", "o": "w4s4", "gate": "w4s2", "down": "w4s4"},
}
# Where group 32 differs (its SwiGLU build has 4 blocks an SM, not 5, and no wider block): the 7B's 592 gate/up tiles
# are past one wave and split in 2, the 1.5B's 280 stay whole (560 halves would pass 528 slots), and the 14B's keep
# 4 warps
FRAG_PLANS_G32 = {("7B", "gate"): "w4s2", ("1.5B", "gate"): "w4s1", ("14B", "gate"): "w4s1"}


def _frag_plan(t, N, K, mode, group, sms=132):
    plan = (ctypes.c_int32 * 3)()
    assert t.nq_test_frag_plan(N, K, mode, group, sms, plan) == 0, t.nq_last_error()
    return tuple(plan)


@pytest.fixture(scope="module")
def testing_lib(libpath):
    from nq_testing_lib import SIGNATURES
    t = ctypes.CDLL(str(libpath.parent / "libnanoqwen_testing.so"))
    for name in ("nq_test_frag_plan", "nq_last_error"):
        getattr(t, name).restype, getattr(t, name).argtypes = SIGNATURES[name]
    return t


@pytest.mark.parametrize("size", sorted(FRAG_PLANS_G128))
def test_frag_plan_of_every_size(testing_lib, size):
    """frag_plan's plans for a size's q/k/v (store), o (residual add), gate/up (SwiGLU pair: 32 outputs a tile) and
    down at groups 32-256 (host code through the testing library: no device needed)."""
    from nanoqwen_format.shapes import QWEN25_SHAPES
    sh = QWEN25_SHAPES[size]
    gemvs = {"qkv": (sh.qkv_rows, sh.hidden, 0), "o": (sh.hidden, sh.n_heads * sh.head_dim, 1),
             "gate": (sh.intermediate, sh.hidden, 2), "down": (sh.hidden, sh.intermediate, 1)}
    for group in (32, 64, 128, 256):
        for name, (N, K, mode) in gemvs.items():
            if K % group:
                continue
            splits, warps, _ = _frag_plan(testing_lib, N, K, mode, group)
            want = FRAG_PLANS_G32.get((size, name), FRAG_PLANS_G128[size][name]) if group == 32 else \
                FRAG_PLANS_G128[size][name]
            assert f"w{warps}s{splits}" == want, f"{size} {name} group {group}"


def test_frag_plan_is_always_a_built_launch(testing_lib):
    """Every plan is one gemv_frag_spg launches: splits a power of two of at most 16 (the largest cluster) and at most
    K's 128-k chunks; 4 or 8 warps (8 only for K >= 8192), SwiGLU 4, or 5 at one block a tile and groups >= 64; a
    budget of >= 2 blocks an SM. Over output counts (1-2,000 tiles), K, modes and groups on 78-144 SMs; arguments
    gemv() never passes are refused."""
    for sms in (78, 114, 132, 144):
        for N in (64, 128, 448, 896, 3584, 7232, 17920, 37888, 55296, 128000):
            for K in (128, 896, 2048, 3584, 5120, 8192, 18944, 27648):
                for mode in (0, 1, 2):
                    for group in (32, 64, 128, 256):
                        if K % group:
                            continue
                        splits, warps, blocks = _frag_plan(testing_lib, N, K, mode, group, sms)
                        assert splits in (1, 2, 4, 8, 16) and splits <= K // 128, (N, K, mode, group, sms)
                        assert warps == 4 or (warps == 8 and mode != 2 and K >= 8192) or \
                            (warps == 5 and mode == 2 and splits == 1 and group >= 64), (N, K, mode, group, sms)
                        assert blocks >= 2
    plan = (ctypes.c_int32 * 3)()
    for args in ((0, 4096, 0, 128, 132), (96, 4096, 0, 128, 132), (512, 4000, 0, 128, 132), (512, 4096, 3, 128, 132),
                 (512, 4096, 0, 48, 132), (512, 128, 0, 256, 132), (512, 4096, 0, 128, 0)):
        assert testing_lib.nq_test_frag_plan(*args, plan) == -1
        assert b"bad argument" in testing_lib.nq_last_error()
    assert testing_lib.nq_test_frag_plan(512, 4096, 0, 128, 132, None) == -1
