"""AWQ import (AutoAWQ GEMM packing): exact dequantization, then our symmetric quantizer (layout 1 has no zero
points). Checkpoints from the independent packer in tests/quant_sources.py, Qwen AWQ repos' tensor names."""
import numpy as np
import pytest
from click.testing import CliRunner

from nanoqwen_format import BlobKind, open_file
from nanoqwen_quant.convert import main as convert_main
from nanoqwen_quant.load import load_checkpoint
from nanoqwen_quant.quantize import quantize_reference
from nanoqwen_quant.sources.awq import unpack_awq
from nanoqwen_quant.verify import verify_file
from quant_sources import make_quantized, pack_awq
from synth import make_checkpoint

SMALL = dict(hidden=256, intermediate=512, n_layers=2, n_heads=4, n_kv_heads=2, vocab=320)


def test_unpack_matches_the_per_element_packer():
    codes = np.random.default_rng(1).integers(0, 16, size=(5, 32))
    packed = pack_awq(codes)
    assert packed.shape == (5, 4) and packed.dtype == np.int32
    np.testing.assert_array_equal(unpack_awq(packed), codes)
    # the documented order: nibble 1 of word 0 holds column 2, nibble 4 holds column 1
    assert (packed.view(np.uint32)[0, 0] >> 4) & 0xF == codes[0, 2]
    assert (packed.view(np.uint32)[0, 0] >> 16) & 0xF == codes[0, 1]


@pytest.mark.parametrize("mode", ["rtn", "mse"])
def test_awq_requantized(tmp_path, mode):
    src = make_checkpoint(tmp_path / "src", **SMALL)
    meaning = make_quantized(src, tmp_path / "awq", "awq")
    ck = load_checkpoint(tmp_path / "awq")
    assert ck.exact_int4_group("model.layers.0.mlp.up_proj.weight") is None
    np.testing.assert_array_equal(ck.read_f32("model.layers.0.mlp.up_proj.weight"),
                                  meaning["model.layers.0.mlp.up_proj.weight"])
    out = tmp_path / "m.nanoqwen"
    r = CliRunner().invoke(convert_main, [str(tmp_path / "awq"), "-o", str(out), "--mode", mode])
    assert r.exit_code == 0, r.output
    assert "import: awq source: 0 int4 tensors repacked losslessly" in r.output and "asymmetric" in r.output
    assert ("import: hint: --mode mse" in r.output) == (mode == "rtn"), r.output
    with open_file(out) as f:
        for name, w in meaning.items():
            q, s = f.int4(name)
            rq, rs = quantize_reference(w, 128, mode)
            np.testing.assert_array_equal(q, rq, err_msg=name)
            np.testing.assert_array_equal(s.view(np.uint16), rs.view(np.uint16), err_msg=name)
        imp = f.blob_json(BlobKind.PROVENANCE)["import"]
        assert imp["format"] == "awq" and imp["requantized_int4"] == 14
        # the requantization error reaches the file (the summary is taken after the tensors are written)
        assert np.isfinite(imp["requant_snr_db_min"]) and imp["requant_rel_rmse_max"] > 0
    assert verify_file(out, tmp_path / "awq")["ok"]


def test_awq_requantized_with_gptq(tmp_path):
    """--mode gptq on an already-quantized source: GPTQ runs on the exact dequantized weights (it failed after the
    whole calibration, with 'mode: expected one of (rtn, mse)')."""
    src = make_checkpoint(tmp_path / "src", **SMALL)
    make_quantized(src, tmp_path / "awq", "awq")
    out = tmp_path / "g.nanoqwen"
    r = CliRunner().invoke(convert_main, [str(tmp_path / "awq"), "-o", str(out), "--mode", "gptq"])
    assert r.exit_code == 0, r.output
    with open_file(out) as f:
        assert f.blob_json(BlobKind.PROVENANCE)["quantizer"]["mode"] == "gptq"
    assert verify_file(out, tmp_path / "awq")["ok"]


def test_fast_dequantize_equals_the_reference(tmp_path):
    from nanoqwen_quant.sources.awq import dequantize_reference
    from nanoqwen_quant.sources import read_tensor
    src = make_checkpoint(tmp_path / "src", **SMALL)
    meaning = make_quantized(src, tmp_path / "awq", "awq")
    from nanoqwen_quant.hf import discover_tensors
    found = discover_tensors(tmp_path / "awq")
    ck = load_checkpoint(tmp_path / "awq")
    for name in ("model.layers.0.self_attn.o_proj.weight", "model.layers.1.mlp.gate_proj.weight"):
        p = name[:-len(".weight")]
        ref = dequantize_reference(read_tensor(found[p + ".qweight"]), read_tensor(found[p + ".qzeros"]),
                                   read_tensor(found[p + ".scales"]), 128)
        fast = ck.imported[name].dequantize()
        np.testing.assert_array_equal(fast, ref)
        np.testing.assert_array_equal(fast, meaning[name])
