"""--fallback-f16 says what it did: how many linears stayed f16 although int4 was asked for, and why."""
from click.testing import CliRunner

from nanoqwen_format import DType, open_file
from nanoqwen_quant.convert import main as convert_main
from synth import make_checkpoint


def test_fallback_f16_is_reported(tmp_path):
    # intermediate 400: down_proj has K = 400, not a multiple of 32 (nor of any group size): int4 cannot hold it
    src = make_checkpoint(tmp_path / "src", hidden=256, intermediate=400, n_layers=2, tokenizer=False)
    out = tmp_path / "m.nanoqwen"
    r = CliRunner().invoke(convert_main, [str(src), "-o", str(out), "--fallback-f16"])
    assert r.exit_code == 0, r.output
    assert "note: 2 of 14 linear tensors stay f16 (--fallback-f16): their in_features K (400)" in r.output, r.output
    with open_file(out) as f:
        assert f.tensors["model.layers.0.mlp.down_proj.weight"].dtype == DType.F16
        assert f.tensors["model.layers.0.mlp.up_proj.weight"].dtype == DType.INT4G
    r = CliRunner().invoke(convert_main, [str(src), "-o", str(tmp_path / "n.nanoqwen")])
    assert r.exit_code == 2 and "--fallback-f16" in r.output
    r = CliRunner().invoke(convert_main, [str(src), "-o", str(tmp_path / "q.nanoqwen"), "--fallback-f16", "-q"])
    assert r.exit_code == 0 and r.output == ""


def test_no_note_when_nothing_falls_back(tmp_path):
    src = make_checkpoint(tmp_path / "src", tokenizer=False)
    r = CliRunner().invoke(convert_main, [str(src), "-o", str(tmp_path / "m.nanoqwen"), "--fallback-f16"])
    assert r.exit_code == 0 and "note:" not in r.output and "import:" not in r.output, r.output
