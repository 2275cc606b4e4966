"""GPTQ import: Qwen's GPTQ-Int4 layout (4-bit, g128, sym, no act-order) is repacked into layout 1 losslessly,
asymmetric checkpoints (sym: false) into layout 2 losslessly; act-order checkpoints (and, with --int4-layout 1,
asymmetric ones) are dequantized exactly and requantized. Checkpoints are packed by the
independent packer in tests/quant_sources.py, with the tensor names of Qwen's official repos."""
import json

import numpy as np
import pytest
from click.testing import CliRunner

from nanoqwen_format import LAYOUT_INT4_ROWMAJOR_K8, LAYOUT_INT4_ROWMAJOR_K8_ASYM, BlobKind, DType, open_file
from nanoqwen_quant.convert import convert_checkpoint, main as convert_main
from nanoqwen_quant.load import load_checkpoint
from nanoqwen_quant.quantize import dequantize, quantize_reference
from nanoqwen_quant.sources.gptq import unpack_along_cols, unpack_along_rows
from nanoqwen_quant.verify import main as verify_main, verify_file
from quant_sources import assert_logits_match_transformers, make_quantized, pack_gptq
from synth import make_checkpoint

SMALL = dict(hidden=256, intermediate=512, n_layers=2, n_heads=4, n_kv_heads=2, vocab=320)


def _gptq(tmp_path, **kw):
    src = make_checkpoint(tmp_path / "src", **SMALL)
    meaning = make_quantized(src, tmp_path / "gptq", "gptq", **kw)
    return src, tmp_path / "gptq", meaning


def test_unpack_matches_the_per_element_packer():
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 16, size=(64, 24))
    zeros = rng.integers(1, 16, size=(2, 24))
    qw, qz = pack_gptq(codes, zeros, 1)
    assert qw.shape == (8, 24) and qz.shape == (2, 3) and qw.dtype == np.int32
    np.testing.assert_array_equal(unpack_along_rows(qw, 4), codes)
    np.testing.assert_array_equal(unpack_along_cols(qz, 4), zeros - 1)


def test_fast_repack_equals_the_reference():
    """gptq_words_to_layout1 (nibble shuffle + transpose) == unpack codes → pack_int4_reference."""
    from nanoqwen_quant.sources.gptq import gptq_words_to_layout1, layout1_from_codes
    rng = np.random.default_rng(2)
    words = rng.integers(-2**31, 2**31, size=(48, 40), dtype=np.int64).astype(np.int32)   # K = 384, N = 40
    s = rng.random((3, 40)).astype(np.float16)
    ref_q, ref_s = layout1_from_codes(unpack_along_rows(words, 4), s)
    fast = gptq_words_to_layout1(words)
    assert fast.dtype == np.uint32 and fast.flags.c_contiguous
    np.testing.assert_array_equal(fast, ref_q)
    np.testing.assert_array_equal(ref_s, s.T)


def test_qwen_tensor_names(tmp_path):
    """The official repos' names: model.layers.N.self_attn.q_proj.{qweight,qzeros,scales,g_idx,bias}, f16 rest."""
    _, d, _ = _gptq(tmp_path)
    from safetensors import safe_open
    with safe_open(str(d / "model.safetensors"), "numpy") as f:
        keys = set(f.keys())
    for part in ("qweight", "qzeros", "scales", "g_idx", "bias"):
        assert f"model.layers.0.self_attn.q_proj.{part}" in keys
    assert "model.layers.1.mlp.down_proj.qweight" in keys and "model.layers.1.mlp.down_proj.weight" not in keys
    ck = load_checkpoint(d)
    assert len(ck.imported) == 2 * 7 and ck.exact_int4("model.layers.1.mlp.down_proj.weight") == (128, LAYOUT_INT4_ROWMAJOR_K8)


@pytest.mark.parametrize("fmt", [None, "gptq_v2"])
def test_lossless_repack(tmp_path, fmt):
    """Qwen's GPTQ-Int4 settings: every int4 tensor dequantizes to exactly the GPTQ meaning, bit for bit."""
    _, d, meaning = _gptq(tmp_path, checkpoint_format=fmt, zero_bias=True)
    out = tmp_path / "m.nanoqwen"
    r = CliRunner().invoke(convert_main, [str(d), "-o", str(out), "--group-size", "64"])
    assert r.exit_code == 0, r.output
    assert "14 int4 tensors repacked losslessly (group size 128 from the source), 0 requantized" in r.output
    with open_file(out) as f:
        for name, w in meaning.items():
            info = f.tensors[name]
            assert info.dtype == DType.INT4G and info.group_size == 128, name
            q, s = f.int4(name)
            np.testing.assert_array_equal(dequantize(q, s, 128), w, err_msg=name)
        assert f.array("model.layers.0.self_attn.q_proj.bias").dtype == np.float16
        imp = f.blob_json(BlobKind.PROVENANCE)["import"]
        assert imp["format"] == "gptq" and imp["exact_int4"] == 14 and imp["requantized_int4"] == 0
    rep = verify_file(out, d)
    assert rep["ok"], rep
    int4 = [t for t in rep["tensors"] if t["dtype"] == "int4g"]
    assert len(int4) == 14 and all(t["snr_db"] == float("inf") and t["max_abs_err"] == 0 for t in int4)
    r = CliRunner().invoke(verify_main, [str(out), "--source", str(d)])
    assert r.exit_code == 0 and "exact" in r.output, r.output


def test_source_group_size_decides_for_exact_tensors(tmp_path):
    """A g32 source whose down_proj has K = 352 (a multiple of 32, not of the default --group-size 128): the
    lossless g32 repack is taken (it was refused, or stored f16 with --fallback-f16, by --group-size's rule)."""
    src = make_checkpoint(tmp_path / "src", **{**SMALL, "intermediate": 352})
    meaning = make_quantized(src, tmp_path / "gptq", "gptq", g=32)
    out = tmp_path / "m.nanoqwen"
    r = CliRunner().invoke(convert_main, [str(tmp_path / "gptq"), "-o", str(out), "-q"])
    assert r.exit_code == 0, r.output
    with open_file(out) as f:
        name = "model.layers.0.mlp.down_proj.weight"
        assert f.tensors[name].dtype == DType.INT4G and f.tensors[name].group_size == 32
        np.testing.assert_array_equal(f.float32(name), meaning[name])


@pytest.mark.parametrize("fmt", [None, "gptq_v2"])
def test_asymmetric_exact_in_layout_2(tmp_path, fmt):
    """sym: false, no act-order: every int4 tensor in layout 2 with the source's codes, scales and zero points, its
    dequantization equal to the GPTQ meaning bit for bit; verify --source reports 0 error."""
    _, d, meaning = _gptq(tmp_path, sym=False, checkpoint_format=fmt)
    out = tmp_path / "m.nanoqwen"
    r = CliRunner().invoke(convert_main, [str(d), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert ("14 int4 tensors repacked losslessly (group size 128 from the source), 14 of them in the asymmetric "
            "layout 2 (the source's zero points), 0 requantized") in r.output, r.output
    with open_file(out) as f:
        for name, w in meaning.items():
            info = f.tensors[name]
            assert info.layout_id == LAYOUT_INT4_ROWMAJOR_K8_ASYM and info.group_size == 128, name
            np.testing.assert_array_equal(f.float32(name).view(np.uint32), w.view(np.uint32), err_msg=name)
    rep = verify_file(out, d)
    assert rep["ok"], rep
    int4 = [t for t in rep["tensors"] if t["dtype"] == "int4g"]
    assert len(int4) == 14 and all(t["snr_db"] == float("inf") and t["max_abs_err"] == 0 for t in int4)


def test_zero_16_of_the_gptq_format_is_requantized_and_named(tmp_path):
    """checkpoint_format "gptq" stores zero - 1, so a zero of 0 is stored as 15 and read back as 16: layout 2 cannot
    hold it; that tensor alone is requantized, with the reason printed; the others stay exact."""
    from quant_sources import pack_gptq
    from safetensors.numpy import load_file, save_file
    _, d, meaning = _gptq(tmp_path, sym=False)
    st = load_file(str(d / "model.safetensors"))
    key = "model.layers.0.mlp.up_proj.qzeros"
    z = st[key].view(np.uint32).copy()
    z[0, 0] |= np.uint32(0xF)                               # group 0, column 0: stored 15 → zero 16
    st[key] = z.view(np.int32)
    save_file(st, str(d / "model.safetensors"), metadata={"format": "pt"})
    out = tmp_path / "m.nanoqwen"
    r = CliRunner().invoke(convert_main, [str(d), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "13 of them in the asymmetric layout 2" in r.output and "1 requantized" in r.output, r.output
    assert "zero point 16 outside 0..15" in r.output and "wraps to 16" in r.output, r.output
    with open_file(out) as f:
        assert f.tensors["model.layers.0.mlp.up_proj.weight"].layout_id == LAYOUT_INT4_ROWMAJOR_K8
        assert f.tensors["model.layers.0.mlp.gate_proj.weight"].layout_id == LAYOUT_INT4_ROWMAJOR_K8_ASYM
    assert verify_file(out, d)["ok"]


@pytest.mark.parametrize("kw, args, reason", [
    (dict(desc_act=True), [], "desc_act"),
    (dict(sym=False, checkpoint_format="gptq_v2"), ["--int4-layout", "1"], "--int4-layout 1"),
    (dict(sym=False), ["--int4-layout", "1"], "asymmetric"),
])
def test_requantized_paths(tmp_path, kw, args, reason):
    """No exact form the converter may write (act-order: no int4 layout permutes K; asymmetric with --int4-layout
    1): the exact dequantization goes through our quantizer (bytes = the reference quantizer's), the error is
    reported, verify compares against the GPTQ meaning."""
    _, d, meaning = _gptq(tmp_path, **kw)
    out = tmp_path / "m.nanoqwen"
    r = CliRunner().invoke(convert_main, [str(d), "-o", str(out), *args])
    assert r.exit_code == 0, r.output
    assert "0 int4 tensors repacked losslessly" in r.output and "14 requantized" in r.output, r.output
    assert reason in r.output and "SNR min" in r.output
    with open_file(out) as f:
        for name, w in meaning.items():
            q, s = f.int4(name)
            rq, rs = quantize_reference(w, 128, "rtn")
            np.testing.assert_array_equal(q, rq, err_msg=name)
            np.testing.assert_array_equal(s.view(np.uint16), rs.view(np.uint16), err_msg=name)
    rep = verify_file(out, d)
    assert rep["ok"], rep


def test_act_order_without_g_idx_is_refused(tmp_path):
    """desc_act: true with no g_idx: the permutation is lost, and k // group_size would be another weight (it was
    repacked and called lossless)."""
    from safetensors.numpy import load_file, save_file
    _, d, _ = _gptq(tmp_path, desc_act=True)
    for st in d.glob("*.safetensors"):
        tensors = load_file(st)
        save_file({k: v for k, v in tensors.items() if not k.endswith(".g_idx")}, st)
    index = d / "model.safetensors.index.json"
    if index.exists():
        idx = json.loads(index.read_text())
        idx["weight_map"] = {k: v for k, v in idx["weight_map"].items() if not k.endswith(".g_idx")}
        index.write_text(json.dumps(idx))
    r = CliRunner().invoke(convert_main, [str(d), "-o", str(tmp_path / "x.nanoqwen"), "-q"])
    assert r.exit_code == 2 and "desc_act is true" in r.output and "Traceback" not in r.output, r.output
    assert not (tmp_path / "x.nanoqwen").exists()


def test_refusals(tmp_path):
    _, d, _ = _gptq(tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    for change, needle in [({"bits": 3}, "gptq bits 3"), ({"checkpoint_format": "marlin"}, "marlin"),
                           ({"quant_method": "bitsandbytes"}, "not supported")]:
        bad = dict(cfg, quantization_config=dict(cfg["quantization_config"], **change))
        (d / "config.json").write_text(json.dumps(bad))
        r = CliRunner().invoke(convert_main, [str(d), "-o", str(tmp_path / "x.nanoqwen"), "-q"])
        assert r.exit_code == 2 and needle in r.output and "Traceback" not in r.output, r.output
        assert not (tmp_path / "x.nanoqwen").exists()




def test_end_to_end_logits_match_transformers_on_the_gptq_meaning(tmp_path):
    """synthetic Qwen2 → GPTQ-packed → nanoqwen-convert → CPU backend logits == transformers (fp32) holding the
    GPTQ dequantized linears and the checkpoint's f16 tensors."""
    from synth import load_source_f32
    src, d, meaning = _gptq(tmp_path)
    out = convert_checkpoint(d, tmp_path / "m.nanoqwen")
    weights = {n: meaning[n] if n in meaning else w.astype(np.float16).astype(np.float32)
               for n, w in load_source_f32(src).items()}
    assert_logits_match_transformers(src, out, weights, seed=5, n_tokens=24)


def test_sharded_checkpoint_and_stray_bias(tmp_path):
    """Qwen's larger GPTQ repos are sharded (model-0000N-of-0000M.safetensors + index); a zero bias buffer on a
    bias-free linear (some quantizers write one) is accepted, a non-zero one refused."""
    from safetensors.numpy import load_file, save_file
    _, d, meaning = _gptq(tmp_path, zero_bias=True)
    sd = load_file(str(d / "model.safetensors"))
    (d / "model.safetensors").unlink()
    names = sorted(sd)
    half = len(names) // 2
    wm = {}
    for i, part in enumerate((names[:half], names[half:])):
        fname = f"model-{i + 1:05d}-of-00002.safetensors"
        save_file({n: sd[n] for n in part}, str(d / fname), metadata={"format": "pt"})
        wm.update({n: fname for n in part})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    out = convert_checkpoint(d, tmp_path / "m.nanoqwen")
    with open_file(out) as f:
        q, s = f.int4("model.layers.1.self_attn.o_proj.weight")
        np.testing.assert_array_equal(dequantize(q, s, 128), meaning["model.layers.1.self_attn.o_proj.weight"])
    fname = wm["model.layers.0.self_attn.o_proj.bias"]
    shard = load_file(str(d / fname))
    shard["model.layers.0.self_attn.o_proj.bias"] = np.full_like(shard["model.layers.0.self_attn.o_proj.bias"], 0.5)
    save_file(shard, str(d / fname), metadata={"format": "pt"})
    r = CliRunner().invoke(convert_main, [str(d), "-o", str(tmp_path / "x.nanoqwen"), "-q"])
    assert r.exit_code == 2 and "o_proj.bias" in r.output and "non-zero bias" in r.output, r.output


@pytest.mark.parametrize("kw", [dict(), dict(desc_act=True), dict(sym=False), dict(sym=False, checkpoint_format="gptq_v2")])
def test_fast_dequantize_equals_the_reference(tmp_path, kw):
    """The numba dequantizer (sources/dequant.py) == the numpy reference, bit for bit, and == the packer's meaning."""
    _, d, meaning = _gptq(tmp_path, **kw)
    ck = load_checkpoint(d)
    for name in ("model.layers.0.self_attn.k_proj.weight", "model.layers.1.mlp.down_proj.weight"):
        lin = ck.imported[name].dequantize.__self__
        fast, ref = lin.dequantize(), lin.dequantize_reference()
        assert fast.dtype == np.float32 and fast.flags.c_contiguous
        np.testing.assert_array_equal(fast, ref)
        np.testing.assert_array_equal(fast, meaning[name])
