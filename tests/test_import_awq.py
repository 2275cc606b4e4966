"""AWQ import (AutoAWQ GEMM packing): the codes, scales and zero points kept exactly in int4 layout 2 (the
default), or, with --int4-layout 1, the exact dequantization requantized by our symmetric quantizer into layout 1.
Checkpoints from the independent packer in tests/quant_sources.py, Qwen AWQ repos' tensor names."""
import numpy as np
import pytest
from click.testing import CliRunner

from nanoqwen_format import LAYOUT_INT4_ROWMAJOR_K8, LAYOUT_INT4_ROWMAJOR_K8_ASYM, BlobKind, DType, open_file
from nanoqwen_quant.convert import main as convert_main
from nanoqwen_quant.load import load_checkpoint
from nanoqwen_quant.quantize import quantize_reference
from nanoqwen_quant.sources.awq import unpack_awq
from nanoqwen_quant.verify import main as verify_main, verify_file
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


@pytest.mark.parametrize("group", [128, 64])
def test_awq_exact_in_layout_2(tmp_path, group):
    """The default: every AWQ linear in layout 2 with the source's own codes, scales and zero points (whatever
    --group-size says), its dequantization equal to AWQ's meaning bit for bit; nanoqwen-verify --source reports 0
    error; the CPU backend runs it."""
    src = make_checkpoint(tmp_path / "src", **SMALL)
    meaning = make_quantized(src, tmp_path / "awq", "awq", g=group)
    ck = load_checkpoint(tmp_path / "awq")
    assert ck.exact_int4("model.layers.0.mlp.up_proj.weight") == (group, LAYOUT_INT4_ROWMAJOR_K8_ASYM)
    assert ck.exact_int4("model.layers.0.mlp.up_proj.weight", (LAYOUT_INT4_ROWMAJOR_K8,)) is None
    out = tmp_path / "m.nanoqwen"
    r = CliRunner().invoke(convert_main, [str(tmp_path / "awq"), "-o", str(out), "--group-size", "32"])
    assert r.exit_code == 0, r.output
    assert (f"import: awq source: 14 int4 tensors repacked losslessly (group size {group} from the source), 14 of "
            f"them in the asymmetric layout 2 (the source's zero points), 0 requantized") in r.output, r.output
    assert "hint" not in r.output
    with open_file(out) as f:
        zs = []
        for name, w in meaning.items():
            info = f.tensors[name]
            assert info.dtype == DType.INT4G and info.layout_id == LAYOUT_INT4_ROWMAJOR_K8_ASYM
            assert info.group_size == group
            np.testing.assert_array_equal(f.float32(name).view(np.uint32), w.view(np.uint32), err_msg=name)
            zs.append(f.int4_asym(name)[2])
        assert len(np.unique(np.concatenate([z.ravel() for z in zs]))) > 3     # real zero points, not all 8
        prov = f.blob_json(BlobKind.PROVENANCE)
        imp = prov["import"]
        assert imp["exact_int4"] == 14 and imp["exact_int4_asym"] == 14 and imp["requantized_int4"] == 0
        assert prov["quantizer"]["int4_layout"] == "auto"
    rep = verify_file(out, tmp_path / "awq")
    assert rep["ok"], rep
    int4 = [t for t in rep["tensors"] if t["dtype"] == "int4g"]
    assert len(int4) == 14 and all(t["snr_db"] == float("inf") and t["max_abs_err"] == 0 for t in int4)
    r = CliRunner().invoke(verify_main, [str(out), "--source", str(tmp_path / "awq")])
    assert r.exit_code == 0 and "exact" in r.output, r.output


def test_awq_end_to_end_logits_match_transformers(tmp_path):
    """synthetic Qwen2 → AWQ-packed → nanoqwen-convert (layout 2) → CPU backend logits == transformers (fp32)
    holding the AWQ dequantized linears and the checkpoint's f16 tensors."""
    from quant_sources import assert_logits_match_transformers
    from synth import load_source_f32
    src = make_checkpoint(tmp_path / "src", **SMALL)
    meaning = make_quantized(src, tmp_path / "awq", "awq")
    from nanoqwen_quant.convert import convert_checkpoint
    out = convert_checkpoint(tmp_path / "awq", tmp_path / "m.nanoqwen")
    weights = {n: meaning[n] if n in meaning else w.astype(np.float16).astype(np.float32)
               for n, w in load_source_f32(src).items()}
    assert_logits_match_transformers(src, out, weights, seed=6, n_tokens=24)


@pytest.mark.parametrize("mode", ["rtn", "mse"])
def test_awq_requantized_with_int4_layout_1(tmp_path, mode):
    """--int4-layout 1 (for a runtime that runs layout 1 only): the exact dequantization through our quantizer,
    bytes = the reference quantizer's, the reason and the error reported."""
    src = make_checkpoint(tmp_path / "src", **SMALL)
    meaning = make_quantized(src, tmp_path / "awq", "awq")
    ck = load_checkpoint(tmp_path / "awq")
    np.testing.assert_array_equal(ck.read_f32("model.layers.0.mlp.up_proj.weight"),
                                  meaning["model.layers.0.mlp.up_proj.weight"])
    out = tmp_path / "m.nanoqwen"
    r = CliRunner().invoke(convert_main, [str(tmp_path / "awq"), "-o", str(out), "--mode", mode,
                                          "--int4-layout", "1"])
    assert r.exit_code == 0, r.output
    assert "import: awq source: 0 int4 tensors repacked losslessly" in r.output and "asymmetric" in r.output
    assert "--int4-layout 1" in r.output, r.output
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
    r = CliRunner().invoke(convert_main, [str(tmp_path / "awq"), "-o", str(out), "--mode", "gptq",
                                          "--int4-layout", "1"])
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
