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
    assert ("note: 2 of 14 linear tensors stay f16 although int4 was asked for (--fallback-f16): in_features "
            "K = 400 is not a multiple of 32, which int4 needs at every group size; e.g. "
            "model.layers.0.mlp.down_proj.weight") in r.output, r.output
    assert "--group-size" not in r.output          # no group size holds K = 400
    with open_file(out) as f:
        assert f.tensors["model.layers.0.mlp.down_proj.weight"].dtype == DType.F16
        assert f.tensors["model.layers.0.mlp.up_proj.weight"].dtype == DType.INT4G
    r = CliRunner().invoke(convert_main, [str(src), "-o", str(tmp_path / "n.nanoqwen")])
    assert r.exit_code == 2 and "--fallback-f16" in r.output
    r = CliRunner().invoke(convert_main, [str(src), "-o", str(tmp_path / "q.nanoqwen"), "--fallback-f16", "-q"])
    assert r.exit_code == 0 and r.output == ""


def test_fallback_names_the_group_size_that_would_hold_them(tmp_path):
    """K = 192 (as SmolLM2's 576): a multiple of 32 and 64, not of the default 128. The note and the refusal both
    name --group-size 64, which stores every such linear in int4."""
    src = make_checkpoint(tmp_path / "src", arch="llama", qkv_bias=False, hidden=192, intermediate=512, n_heads=3,
                          n_kv_heads=1, n_layers=2, tokenizer=False)
    r = CliRunner().invoke(convert_main, [str(src), "-o", str(tmp_path / "m.nanoqwen"), "--fallback-f16"])
    assert r.exit_code == 0, r.output
    assert ("note: 12 of 14 linear tensors stay f16 although int4 was asked for (--fallback-f16): in_features "
            "K = 192 is not a multiple of the group size 128; --group-size 64 stores them in int4; e.g. "
            "model.layers.0.self_attn.q_proj.weight") in r.output, r.output
    r = CliRunner().invoke(convert_main, [str(src), "-o", str(tmp_path / "n.nanoqwen")])
    assert r.exit_code == 2 and "use --group-size 64 or --fallback-f16" in r.output, r.output
    r = CliRunner().invoke(convert_main, [str(src), "-o", str(tmp_path / "g.nanoqwen"), "--group-size", "64"])
    assert r.exit_code == 0 and "note:" not in r.output, r.output
    with open_file(tmp_path / "g.nanoqwen") as f:
        assert f.tensors["model.layers.0.self_attn.q_proj.weight"].dtype == DType.INT4G


def test_missing_generation_config_warning_does_not_blame_the_tokenizer(tmp_path):
    src = make_checkpoint(tmp_path / "src")
    (src / "generation_config.json").unlink()
    r = CliRunner().invoke(convert_main, [str(src), "-o", str(tmp_path / "m.nanoqwen")])
    assert r.exit_code == 0, r.output
    line = next(ln for ln in r.output.splitlines() if ln.startswith("warning:"))
    assert line.endswith("has no generation_config.json; the file carries none"), line


def test_no_note_when_nothing_falls_back(tmp_path):
    src = make_checkpoint(tmp_path / "src", tokenizer=False)
    r = CliRunner().invoke(convert_main, [str(src), "-o", str(tmp_path / "m.nanoqwen"), "--fallback-f16"])
    assert r.exit_code == 0 and "note:" not in r.output and "import:" not in r.output, r.output
