"""nanoqwen-verify: valid files pass, corrupt files and files that do not match their source fail with exit 1,
usage problems exit 2; --json carries the same verdict."""
import json

import numpy as np
import pytest
from click.testing import CliRunner

from nanoqwen_format import BlobKind, DType, NanoqwenWriter, TensorSpec, open_file
from nanoqwen_quant.convert import convert_checkpoint
from nanoqwen_quant.load import load_checkpoint
from nanoqwen_quant.quantize import quantize
from nanoqwen_quant.verify import INT4_MIN_SNR_DB, main as verify_main, verify_file
from synth import load_source_f32, make_checkpoint


def _run(*args):
    r = CliRunner().invoke(verify_main, [str(a) for a in args])
    assert "Traceback" not in r.output
    return r.exit_code, r.output


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    d = tmp_path_factory.mktemp("verify")
    src = make_checkpoint(d / "src", seed=1)
    out = convert_checkpoint(src, d / "m.nanoqwen")
    return src, out


def test_valid_file_and_json(converted):
    src, out = converted
    code, output = _run(out)
    assert code == 0 and output.strip().endswith("OK")
    code, output = _run(out, "--source", src, "--json")
    assert code == 0
    rep = json.loads(output)
    assert rep["valid"] and rep["ok"] and rep["checksums"] == "ok" and rep["config_matches_source"]
    assert {t["name"] for t in rep["tensors"]} == set(load_source_f32(src))
    int4 = [t for t in rep["tensors"] if t["dtype"] == "int4g"]
    assert int4 and all(INT4_MIN_SNR_DB < t["snr_db"] < 25 and t["bound_violations"] == 0 for t in int4)
    # rel-RMSE and SNR are two views of the same error energy: SNR = -20 log10(rel_rmse)
    for t in int4:
        assert t["snr_db"] == pytest.approx(-20 * np.log10(t["rel_rmse"]), rel=1e-9)
    f16 = [t for t in rep["tensors"] if t["dtype"] == "f16"]
    assert all(t["bound_violations"] == 0 for t in f16)
    assert rep["tokenizer"]["ok"] and "provenance" in rep["blobs"]


def test_corrupt_byte_fails_checksum(converted, tmp_path):
    _, out = converted
    data = bytearray(out.read_bytes())
    with open_file(out) as f:
        t = f.tensors["model.layers.0.mlp.up_proj.weight"]
    data[t.offset + 17] ^= 0x40
    bad = tmp_path / "bad.nanoqwen"
    bad.write_bytes(bytes(data))
    code, output = _run(bad)
    assert code == 1 and "ChecksumMismatch" in output and "up_proj" in output
    rep = verify_file(bad)
    assert not rep["valid"] and not rep["ok"]


def test_truncated_file_is_invalid(converted, tmp_path):
    _, out = converted
    bad = tmp_path / "short.nanoqwen"
    bad.write_bytes(out.read_bytes()[:-300])
    code, output = _run(bad)
    assert code == 1 and "INVALID" in output


def test_wrong_source_fails_thresholds(converted, tmp_path):
    """Same config, different random weights: structurally valid, but every weight is far off."""
    _, out = converted
    other = make_checkpoint(tmp_path / "other", seed=2)
    code, output = _run(out, "--source", other)
    assert code == 1 and "FAIL" in output and output.strip().endswith("FAILED")


def test_config_mismatch_fails(converted, tmp_path):
    _, out = converted
    other = make_checkpoint(tmp_path / "other", seed=1, rope_theta=1e4)
    code, output = _run(out, "--source", other)
    assert code == 1 and "CONFIG MISMATCH" in output and "rope_theta" in output


def _write_with_scales_times(src, path, factor):
    """A file whose int4 tensors use (the rtn scales x factor) with codes re-derived for those scales: every
    element stays within half a step of its (too coarse) scale, so only the SNR threshold can catch it."""
    ck = load_checkpoint(src)
    from nanoqwen_quant.convert import plan_tensors
    specs = plan_tensors(ck, quant="int4", group_size=128, lm_head="fp16", fallback_f16=False)
    with NanoqwenWriter(path, ck.config, specs, []) as w:
        for spec in specs:
            x = ck.read_f32(spec.name)
            if spec.dtype == DType.INT4G:
                _, s = quantize(x, 128, "rtn")
                big = (s.astype(np.float32) * factor).astype(np.float16)
                w.write_int4(spec.name, *_codes_for_scale(x, big))
            else:
                w.write_tensor(spec.name, x.astype(np.float16))


def _codes_for_scale(x, s16):
    from nanoqwen_format.int4_layout import pack_int4_reference
    g = 128
    s = np.repeat(s16.astype(np.float32), g, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(s == 0, 0, np.clip(np.rint(x / s), -8, 7))
    return pack_int4_reference((q + 8).astype(np.uint8)), s16


def test_too_coarse_scales_fail_snr(tmp_path):
    src = make_checkpoint(tmp_path / "src", seed=5, tokenizer=False)
    path = tmp_path / "coarse.nanoqwen"
    _write_with_scales_times(src, path, 4.0)
    code, output = _run(path, "--source", src, "--json")
    rep = json.loads(output)
    assert code == 1 and rep["valid"] and not rep["ok"]
    int4 = [t for t in rep["tensors"] if t["dtype"] == "int4g"]
    assert all(t["bound_violations"] == 0 and t["snr_db"] < INT4_MIN_SNR_DB and not t["ok"] for t in int4)


def test_usage_errors_exit_2(converted, tmp_path):
    _, out = converted
    code, output = _run(tmp_path / "missing.nanoqwen")
    assert code == 2 and "no such file" in output
    code, output = _run(out, "--source", tmp_path / "no-such-dir")
    assert code == 2 and "source" in output


@pytest.mark.parametrize("dtype, src_dtype", [(DType.F32, "f32"), (DType.BF16, "bf16")])
def test_plain_dtype_files_from_other_writers(tmp_path, dtype, src_dtype):
    """Files holding f32 / bf16 tensors (valid format, not what our converter writes) verify with their own bounds."""
    from synth import f32_to_bf16_bits
    src = make_checkpoint(tmp_path / "src", dtype=src_dtype, tokenizer=False, seed=6)
    ck = load_checkpoint(src)
    specs = [TensorSpec(n, dtype, s) for n, s in ((n, t.shape) for n, t in ck.tensors.items())]
    path = tmp_path / "plain.nanoqwen"
    with NanoqwenWriter(path, ck.config, specs, []) as w:
        for spec in specs:
            x = ck.read_f32(spec.name)
            w.write_tensor(spec.name, x if dtype == DType.F32 else f32_to_bf16_bits(x))
    code, output = _run(path, "--source", src)
    assert code == 0, output
