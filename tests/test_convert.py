"""nanoqwen-convert / convert_checkpoint on synthetic checkpoints: round trip, exact bytes vs the numpy reference
quantizer, refusals with one-line errors, atomic output, the hub path with a local fake."""
import json
import os
import shutil
import struct

import numpy as np
import pytest
from click.testing import CliRunner

from nanoqwen_format import BlobKind, DType, open_file
from nanoqwen_quant import convert as convert_mod
from nanoqwen_quant.convert import convert_checkpoint, main as convert_main
from nanoqwen_quant.hf import ConvertError
from nanoqwen_quant.quantize import quantize_reference
from nanoqwen_quant.verify import main as verify_main
from synth import load_source_f32, make_checkpoint

CONFIGS = {
    "default": dict(),
    "tied_f16": dict(tied=True, dtype="f16"),
    "hd128": dict(hidden=512, n_heads=4, n_kv_heads=4, intermediate=256),
    "gqa7": dict(hidden=896, n_heads=14, n_kv_heads=2, intermediate=256, n_layers=1),
    "sharded_index": dict(sharded=True, n_layers=3),
    "f32_hf5": dict(dtype="f32", config_style="hf5"),
    "llama": dict(arch="llama", qkv_bias=False, n_heads=2, n_kv_heads=1),
}


def _cli(cmd, args):
    r = CliRunner().invoke(cmd, [str(a) for a in args])
    return r.exit_code, r.output, r.stderr if hasattr(r, "stderr") else r.output


def _one_line_error(text):
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    assert "Traceback" not in text
    return lines[-1] if lines else ""


def _check_tensors_exact(path_file, src_dir, group_size=128, mode="rtn", lm_head="fp16", quant="int4"):
    """Every tensor equals what the reference quantizer / f16 rounding makes of the source, bit for bit."""
    src = load_source_f32(src_dir)
    with open_file(path_file) as f:
        assert set(f.tensors) == set(src) - ({"lm_head.weight"} if f.config.tied_embeddings else set())
        for name, info in f.tensors.items():
            w = src[name]
            linear = name.endswith("_proj.weight") or (name == "lm_head.weight" and lm_head == "int4")
            if quant == "int4" and linear:
                assert info.dtype == DType.INT4G and info.group_size == group_size, name
                q, s = f.int4(name)
                rq, rs = quantize_reference(w, group_size, mode)
                np.testing.assert_array_equal(q, rq, err_msg=name)
                np.testing.assert_array_equal(s.view(np.uint16), rs.view(np.uint16), err_msg=name)
            else:
                assert info.dtype == DType.F16, name
                np.testing.assert_array_equal(f.array(name), w.astype(np.float16), err_msg=name)


@pytest.mark.parametrize("case", list(CONFIGS))
def test_round_trip_convert_verify(tmp_path, case):
    kw = CONFIGS[case]
    src = make_checkpoint(tmp_path / "src", **kw)
    out = tmp_path / "m.nanoqwen"
    code, output, _ = _cli(convert_main, [src, "-o", out, "--quiet"])
    assert code == 0, output
    _check_tensors_exact(out, src)
    cfg_json = json.loads((src / "config.json").read_text())
    with open_file(out) as f:
        c = f.config
        assert c.arch == kw.get("arch", "qwen2")
        assert (c.hidden_size, c.n_layers, c.n_heads, c.n_kv_heads) == (
            cfg_json["hidden_size"], cfg_json["num_hidden_layers"], cfg_json["num_attention_heads"],
            cfg_json["num_key_value_heads"])
        assert c.head_dim == c.hidden_size // c.n_heads
        assert c.tied_embeddings == kw.get("tied", False) and c.qkv_bias == (c.arch == "qwen2")
        assert c.rope_theta == 1e6 and c.vocab_rows == cfg_json["vocab_size"]
        assert c.eos_token_id == cfg_json["eos_token_id"]
        assert f.blob(BlobKind.TOKENIZER_JSON) == (src / "tokenizer.json").read_bytes()
        tcfg = json.loads((src / "tokenizer_config.json").read_text())
        assert f.blob_text(BlobKind.CHAT_TEMPLATE) == tcfg["chat_template"]
        assert f.blob_json(BlobKind.GENERATION_CONFIG) == json.loads((src / "generation_config.json").read_text())
        assert f.blob_json(BlobKind.TOKENIZER_CONFIG) == tcfg
        prov = f.blob_json(BlobKind.PROVENANCE)
        assert prov["source"] == str(src.resolve()) and prov["quantizer"]["group_size"] == 128
        assert prov["quantizer"]["mode"] == "rtn" and prov["converter_version"] and prov["date"]
    code, output, _ = _cli(verify_main, [out, "--source", src])
    assert code == 0, output
    assert "OK" in output.splitlines()[-1]


@pytest.mark.parametrize("opts", [
    dict(quant="none"),
    dict(group_size=64, mode="mse"),
    dict(lm_head="int4"),
])
def test_options(tmp_path, opts):
    src = make_checkpoint(tmp_path / "src", seed=4)
    out = convert_checkpoint(src, tmp_path / "m.nanoqwen", **opts)
    _check_tensors_exact(out, src, group_size=opts.get("group_size", 128), mode=opts.get("mode", "rtn"),
                         lm_head=opts.get("lm_head", "fp16"), quant=opts.get("quant", "int4"))
    code, output, _ = _cli(verify_main, [out, "--source", src])
    assert code == 0, output


def test_transformers_save_pretrained_checkpoint(tmp_path):
    """What the CPU-runtime tests feed us: transformers 5.x save_pretrained (rope_parameters, dtype, f32)."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Qwen2Config(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, vocab_size=300,
                                   tie_word_embeddings=True, rope_theta=1e6,
                                   rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                 "original_max_position_embeddings": 4096})
    transformers.Qwen2ForCausalLM(cfg).save_pretrained(tmp_path / "src")
    out = convert_checkpoint(tmp_path / "src", tmp_path / "m.nanoqwen")
    with open_file(out) as f:
        c = f.config
        assert (c.rope_scaling_type, c.rope_scaling_factor, c.rope_original_max_positions) == ("yarn", 4.0, 4096)
        assert c.tied_embeddings and c.rope_theta == 1e6
    _check_tensors_exact(out, tmp_path / "src")


def test_fallback_f16_for_indivisible_shapes(tmp_path):
    src = make_checkpoint(tmp_path / "src", intermediate=320)      # down_proj K = 320: not a multiple of 128
    out = tmp_path / "m.nanoqwen"
    code, output, _ = _cli(convert_main, [src, "-o", out, "-q"])
    assert code == 2 and "down_proj" in _one_line_error(output) and "320" in output
    assert not out.exists()
    code, output, _ = _cli(convert_main, [src, "-o", out, "-q", "--fallback-f16"])
    assert code == 0, output
    with open_file(out) as f:
        assert f.tensors["model.layers.0.mlp.down_proj.weight"].dtype == DType.F16
        assert f.tensors["model.layers.0.mlp.up_proj.weight"].dtype == DType.INT4G
        assert "model.layers.0.mlp.down_proj.weight" in f.blob_json(BlobKind.PROVENANCE)["quantizer"]["fallback_f16"]
    code, output, _ = _cli(verify_main, [out, "--source", src])
    assert code == 0, output


# ------------------------------------------------------------------------------------------ refusals
def _edit_config(d, **changes):
    p = d / "config.json"
    cfg = json.loads(p.read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    p.write_text(json.dumps(cfg))


def _truncate(d):
    p = d / "model.safetensors"
    data = p.read_bytes()
    p.write_bytes(data[: len(data) - 1000])


def _garbage_header(d):
    p = d / "model.safetensors"
    data = bytearray(p.read_bytes())
    data[8:40] = b"{not json at all!!!!!!!!!!!!!!!!"
    p.write_bytes(bytes(data))


def _drop_tensor(d):
    """Rewrite model.safetensors without its last tensor, lm_head.weight (header entry and data removed)."""
    p = d / "model.safetensors"
    raw = p.read_bytes()
    (hl,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + hl])
    start, end = header.pop("lm_head.weight")["data_offsets"]
    assert end == len(raw) - 8 - hl
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    p.write_bytes(struct.pack("<Q", len(hb)) + hb + raw[8 + hl:8 + hl + start])


def _retype(d, name="model.norm.weight", dtype="I16"):
    """Relabel one bf16 tensor as another 2-byte safetensors dtype (offsets stay valid)."""
    p = d / "model.safetensors"
    raw = p.read_bytes()
    (hl,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + hl])
    header[name]["dtype"] = dtype
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    p.write_bytes(struct.pack("<Q", len(hb)) + hb + raw[8 + hl:])


REFUSALS = {
    "int_dtype": (_retype, "'model.norm.weight' has dtype I16"),
    "no_config": (lambda d: (d / "config.json").unlink(), "config.json"),
    "bad_config_json": (lambda d: (d / "config.json").write_text("{oops"), "config.json"),
    "unknown_arch": (lambda d: _edit_config(d, architectures=["MistralForCausalLM"]), "MistralForCausalLM"),
    "unknown_rope": (lambda d: _edit_config(d, rope_scaling={"type": "dynamic", "factor": 2.0}), "dynamic"),
    "quantized": (lambda d: _edit_config(d, quantization_config={"quant_method": "bitsandbytes"}),
                  "quant_method 'bitsandbytes' is not supported"),
    "sliding": (lambda d: _edit_config(d, use_sliding_window=True), "sliding"),
    "truncated": (_truncate, "model.safetensors"),
    "garbage_header": (_garbage_header, "not a valid safetensors"),
    "missing_tensor": (_drop_tensor, "'lm_head.weight' required by config.json is missing"),
    "no_weights": (lambda d: (d / "model.safetensors").unlink(), "no model.safetensors"),
    "wrong_shape": (lambda d: _edit_config(d, intermediate_size=640), "shape"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refusals_are_one_line_exit_2(tmp_path, case):
    src = make_checkpoint(tmp_path / "src", tokenizer=False, n_layers=2)
    breaker, needle = REFUSALS[case]
    breaker(src)
    out = tmp_path / "m.nanoqwen"
    code, output, _ = _cli(convert_main, [src, "-o", out, "-q"])
    assert code == 2, output
    line = _one_line_error(output)
    assert line.startswith("nanoqwen-convert: error: ") and needle in line, output
    assert not out.exists() and os.listdir(tmp_path) == ["src"]


def test_missing_shard(tmp_path):
    src = make_checkpoint(tmp_path / "src", sharded=3, tokenizer=False)
    (src / "model-00002-of-00003.safetensors").unlink()
    code, output, _ = _cli(convert_main, [src, "-o", tmp_path / "m.nanoqwen", "-q"])
    assert code == 2 and "model-00002-of-00003.safetensors" in _one_line_error(output)


def test_bad_output_and_source_paths(tmp_path):
    src = make_checkpoint(tmp_path / "src", tokenizer=False)
    code, output, _ = _cli(convert_main, [src, "-o", tmp_path / "nodir" / "m.nanoqwen", "-q"])
    assert code == 2 and "does not exist" in _one_line_error(output)
    code, output, _ = _cli(convert_main, [tmp_path / "nothing here", "-o", tmp_path / "m.nanoqwen", "-q"])
    assert code == 2 and "no such directory" in _one_line_error(output)


def test_no_progress_bar_when_not_a_tty(tmp_path):
    src = make_checkpoint(tmp_path / "src", tokenizer=False)
    code, output, _ = _cli(convert_main, [src, "-o", tmp_path / "m.nanoqwen"])
    assert code == 0 and "%|" not in output and "wrote" in output


# ------------------------------------------------------------------------------------------ atomic output
@pytest.mark.parametrize("exc, code", [(KeyboardInterrupt, 130), (RuntimeError, 3)])
def test_interrupted_convert_leaves_nothing(tmp_path, monkeypatch, exc, code):
    src = make_checkpoint(tmp_path / "src", tokenizer=False, n_layers=3)
    out = tmp_path / "out" / "m.nanoqwen"
    out.parent.mkdir()
    real = convert_mod.quantize
    calls = []

    def flaky(*a, **k):
        calls.append(1)
        if len(calls) == 5:
            raise exc("stop")
        return real(*a, **k)

    monkeypatch.setattr(convert_mod, "quantize", flaky)
    got, output, _ = _cli(convert_main, [src, "-o", out, "-q"])
    assert got == code, output
    assert len(calls) == 5
    assert os.listdir(out.parent) == []                  # no output, no temp file
    _one_line_error(output)


def test_existing_output_replaced_atomically_only_on_success(tmp_path, monkeypatch):
    src = make_checkpoint(tmp_path / "src", tokenizer=False)
    out = tmp_path / "m.nanoqwen"
    out.write_bytes(b"previous")
    monkeypatch.setattr(convert_mod, "quantize", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        convert_checkpoint(src, out, force=True)
    assert out.read_bytes() == b"previous"
    monkeypatch.undo()
    convert_checkpoint(src, out, force=True)
    with open_file(out) as f:
        assert f.config.n_layers == 2


# ------------------------------------------------------------------------------------------ hub (faked)
def test_hub_id_uses_snapshot_download(tmp_path, monkeypatch):
    import huggingface_hub
    src = make_checkpoint(tmp_path / "src")
    commit = "0123456789abcdef0123456789abcdef01234567"
    snap = tmp_path / "hub" / "snapshots" / commit
    shutil.copytree(src, snap)
    seen = {}

    def fake_snapshot_download(repo_id, revision=None, allow_patterns=None, **kw):
        seen.update(repo_id=repo_id, revision=revision, allow_patterns=allow_patterns)
        return str(snap)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    out = tmp_path / "m.nanoqwen"
    code, output, _ = _cli(convert_main, ["Qwen/Fake-Tiny", "-o", out, "--revision", "v1.0", "-q"])
    assert code == 0, output
    assert seen["repo_id"] == "Qwen/Fake-Tiny" and seen["revision"] == "v1.0"
    pats = seen["allow_patterns"]
    assert {"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json", "*.safetensors",
            "model.safetensors.index.json"} <= set(pats)
    with open_file(out) as f:
        prov = f.blob_json(BlobKind.PROVENANCE)
    assert prov["source"] == "Qwen/Fake-Tiny" and prov["revision"] == "v1.0" and prov["commit"] == commit
    _check_tensors_exact(out, src)


def test_hub_offline_is_one_line(tmp_path, monkeypatch):
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    def offline(repo_id, revision=None, allow_patterns=None, **kw):
        raise LocalEntryNotFoundError("Cannot find the requested files in the disk cache and outgoing traffic "
                                      "has been disabled.\nSecond line of detail")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    out = tmp_path / "m.nanoqwen"
    code, output, _ = _cli(convert_main, ["Qwen/Qwen2.5-Coder-7B-Instruct", "-o", out, "-q"])
    assert code == 2
    line = _one_line_error(output)
    assert "Qwen/Qwen2.5-Coder-7B-Instruct" in line and "hub" in line and "Second line" not in output
    assert not out.exists()


def test_chat_template_from_jinja_file(tmp_path):
    """transformers >= 4.50 writes the template to chat_template.jinja instead of tokenizer_config.json."""
    src = make_checkpoint(tmp_path / "src")
    tcfg = json.loads((src / "tokenizer_config.json").read_text())
    tmpl = tcfg.pop("chat_template")
    (src / "tokenizer_config.json").write_text(json.dumps(tcfg))
    (src / "chat_template.jinja").write_text(tmpl)
    out = convert_checkpoint(src, tmp_path / "m.nanoqwen")
    with open_file(out) as f:
        assert f.blob_text(BlobKind.CHAT_TEMPLATE) == tmpl


def test_chat_template_file_takes_priority(tmp_path):
    """Where both tokenizer_config.json and chat_template.jinja hold a template, transformers uses the file's
    (its tokenizer loading: separate template files take priority); so does the converter."""
    src = make_checkpoint(tmp_path / "src")
    tmpl = "{% for m in messages %}<<{{ m['content'] }}>>{% endfor %}"
    (src / "chat_template.jinja").write_text(tmpl)
    out = convert_checkpoint(src, tmp_path / "m.nanoqwen")
    with open_file(out) as f:
        assert f.blob_text(BlobKind.CHAT_TEMPLATE) == tmpl


def test_tied_config_with_a_different_lm_head_is_refused(tmp_path):
    """tie_word_embeddings: true beside an lm_head.weight: the same values convert tied (the extra tensor is the
    embedding's copy); other values are refused (transformers would run them untied)."""
    from safetensors.numpy import load_file, save_file
    src = make_checkpoint(tmp_path / "src", tied=True, dtype="f16")
    (st,) = src.glob("*.safetensors")
    tensors = load_file(st)
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].copy()
    save_file(tensors, st)
    with open_file(convert_checkpoint(src, tmp_path / "same.nanoqwen")) as f:
        assert f.config.tied_embeddings and "lm_head.weight" not in f.tensors
    tensors["lm_head.weight"][5, 7] += np.float16(0.5)   # one value differs
    save_file(tensors, st)
    with pytest.raises(ConvertError, match="tie_word_embeddings"):
        convert_checkpoint(src, tmp_path / "diff.nanoqwen")
    assert not (tmp_path / "diff.nanoqwen").exists()


@pytest.mark.parametrize("bad_name, value, needle", [
    ("model.layers.1.mlp.gate_proj.weight", np.nan, "NaN or Inf"),
    ("model.layers.0.self_attn.o_proj.weight", 1e7, "overflows float16"),
    ("model.embed_tokens.weight", 1e6, "outside the float16 range"),
    ("model.layers.0.input_layernorm.weight", np.inf, "non-finite"),
])
def test_bad_source_values_refused(tmp_path, bad_name, value, needle):
    from synth import random_tensor
    rng = np.random.default_rng(0)

    def fn(name, shape):
        w = random_tensor(name, shape, rng)
        if name == bad_name:
            w.reshape(-1)[7] = value
        return w

    src = make_checkpoint(tmp_path / "src", dtype="f32", tokenizer=False, tensor_fn=fn)
    out = tmp_path / "m.nanoqwen"
    code, output, _ = _cli(convert_main, [src, "-o", out, "-q"])
    assert code == 2, output
    line = _one_line_error(output)
    assert bad_name in line and needle in line, line
    assert not out.exists()
