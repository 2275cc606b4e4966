"""config.json → ModelConfig: what transformers 4.x / 5.x write, and clear refusals of what the runtime lacks."""
import pytest

from nanoqwen_quant.hf import ConvertError, model_config_from_hf
from synth import hf_config, make_checkpoint


def _cfg(style="hf4", **kw):
    base = dict(arch="qwen2", hidden=256, intermediate=512, n_layers=2, n_heads=4, n_kv_heads=2, vocab=512,
                tied=False, qkv_bias=True, rope_theta=1e6, dtype="bf16", bos=1, eos=2)
    base.update(kw)
    return hf_config(config_style=style, **base)


@pytest.mark.parametrize("style", ["hf4", "hf5"])
def test_basic_fields(style):
    c = model_config_from_hf(_cfg(style))
    assert (c.arch, c.n_layers, c.hidden_size, c.intermediate_size, c.n_heads, c.n_kv_heads, c.head_dim) == \
        ("qwen2", 2, 256, 512, 4, 2, 64)
    assert c.rope_theta == 1e6 and c.rope_scaling_type == "none" and c.qkv_bias and not c.tied_embeddings
    assert (c.bos_token_id, c.eos_token_id, c.pad_token_id, c.vocab_rows) == (1, 2, -1, 512)


@pytest.mark.parametrize("style", ["hf4", "hf5"])
@pytest.mark.parametrize("scaling, want", [
    ({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}, ("yarn", 4.0, 32768)),
    ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8192, "beta_fast": 32.0,
      "beta_slow": 1.0}, ("yarn", 2.0, 8192)),
    ({"type": "linear", "factor": 2.0}, ("linear", 2.0, 0)),
    ({"rope_type": "default"}, ("none", 1.0, 0)),
])
def test_rope_scaling(style, scaling, want):
    c = model_config_from_hf(_cfg(style, rope_scaling=scaling))
    assert (c.rope_scaling_type, c.rope_scaling_factor, c.rope_original_max_positions) == want


@pytest.mark.parametrize("scaling, msg", [
    ({"type": "dynamic", "factor": 2.0}, "unsupported rope scaling type 'dynamic'"),
    ({"rope_type": "llama3", "factor": 8.0}, "'llama3'"),
    ({"rope_type": "longrope", "factor": 8.0}, "'longrope'"),
    ({"type": "yarn", "factor": 4.0, "beta_fast": 16}, "beta_fast"),
    ({"type": "yarn", "factor": 4.0, "attention_factor": 0.5}, "attention_factor"),
    # transformers' truncate=False keeps the correction range unrounded; the runtime rounds it (its default)
    ({"type": "yarn", "factor": 4.0, "truncate": False}, "truncate"),
    ({"type": "linear"}, "numeric factor"),
])
def test_rope_refusals(scaling, msg):
    with pytest.raises(ConvertError, match=msg):
        model_config_from_hf(_cfg(rope_scaling=scaling))


def test_token_ids_list_and_generation_config_fallback():
    cfg = _cfg(eos=[7, 3])
    cfg["bos_token_id"] = None
    c = model_config_from_hf(cfg, {"bos_token_id": 5, "pad_token_id": 6})
    assert (c.bos_token_id, c.eos_token_id, c.pad_token_id) == (5, 7, 6)


@pytest.mark.parametrize("change, msg", [
    (dict(architectures=["MistralForCausalLM"]), "unsupported architecture"),
    (dict(architectures=None, model_type="gemma"), "unsupported model_type"),
    (dict(quantization_config={"quant_method": "awq"}), "already quantized"),
    (dict(hidden_act="gelu"), "hidden_act"),
    (dict(num_attention_heads=5), "hidden_size 256 is not a multiple"),
    (dict(num_key_value_heads=3), "num_key_value_heads"),
    (dict(head_dim=32), "head_dim"),
    (dict(hidden_size=None), "missing required field 'hidden_size'"),
    (dict(num_hidden_layers=0), "num_hidden_layers must be a positive integer"),
    (dict(eos_token_id=99999), "eos_token_id"),
    (dict(tie_word_embeddings="yes"), "tie_word_embeddings"),
    (dict(use_sliding_window=True), "sliding"),
    (dict(rms_norm_eps=-1.0), "rms_norm_eps"),
])
def test_refusals(change, msg):
    cfg = _cfg()
    for k, v in change.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    with pytest.raises(ConvertError, match=msg):
        model_config_from_hf(cfg)


def test_llama_head_dim_and_attention_bias():
    cfg = hf_config(arch="llama", hidden=256, intermediate=512, n_layers=2, n_heads=4, n_kv_heads=1, vocab=512,
                    tied=True, qkv_bias=False, rope_theta=5e5, dtype="f16", bos=1, eos=2, head_dim=128)
    c = model_config_from_hf(cfg)
    assert (c.arch, c.head_dim, c.qkv_bias, c.tied_embeddings) == ("llama", 128, False, True)
    cfg["attention_bias"] = True
    with pytest.raises(ConvertError, match="attention_bias"):
        model_config_from_hf(cfg)
    cfg["attention_bias"] = False
    cfg["mlp_bias"] = True
    with pytest.raises(ConvertError, match="mlp_bias"):
        model_config_from_hf(cfg)


def test_llama_head_dim_128_converts(tmp_path):
    """Llama with head_dim != hidden / n_heads round-trips through convert + verify."""
    from click.testing import CliRunner
    from nanoqwen_quant.convert import convert_checkpoint
    from nanoqwen_quant.verify import main as verify_main
    src = make_checkpoint(tmp_path / "src", arch="llama", qkv_bias=False, n_heads=4, n_kv_heads=2, head_dim=128)
    out = convert_checkpoint(src, tmp_path / "m.nanoqwen")
    r = CliRunner().invoke(verify_main, [str(out), "--source", str(src)])
    assert r.exit_code == 0, r.output


def test_rope_theta_in_two_places_must_agree():
    """transformers 5 reads rope_parameters.rope_theta, 4.x the top-level rope_theta: where both are given and
    differ, the file would silently follow one of them, so the converter refuses; where they agree it converts."""
    cfg = _cfg("hf5")
    cfg["rope_parameters"] = {**(cfg.get("rope_parameters") or {}), "rope_type": "default", "rope_theta": 10000.0}
    cfg["rope_theta"] = 500000.0
    with pytest.raises(ConvertError, match="disagree"):
        model_config_from_hf(cfg)
    cfg["rope_theta"] = 10000
    assert model_config_from_hf(cfg).rope_theta == 10000.0
