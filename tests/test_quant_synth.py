"""tests/synth.py makes checkpoints that transformers loads with exactly the weights we wrote."""
import json

import numpy as np
import pytest

from synth import bf16_bits_to_f32, f32_to_bf16_bits, load_source_f32, make_checkpoint

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CASES = [
    dict(),
    dict(tied=True, dtype="f16", sharded=True, config_style="hf5"),
    dict(arch="llama", qkv_bias=False, dtype="f32", n_heads=2, n_kv_heads=1),
    dict(hidden=448, n_heads=7, n_kv_heads=1, sharded=2),  # GQA 7:1, head_dim 64
    dict(arch="llama", qkv_bias=False, n_heads=4, n_kv_heads=2, head_dim=128, tied=True),  # head_dim != H / heads
]


@pytest.mark.parametrize("kw", CASES, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "default")
def test_transformers_loads_exact_weights(tmp_path, kw):
    d = make_checkpoint(tmp_path / "ckpt", **kw)
    cls = transformers.LlamaForCausalLM if kw.get("arch") == "llama" else transformers.Qwen2ForCausalLM
    model, info = cls.from_pretrained(d, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    want_dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[kw.get("dtype", "bf16")]
    assert model.dtype == want_dtype
    src = load_source_f32(d)
    sd = model.state_dict()
    for name, arr in src.items():
        got = sd[name].float().numpy()
        np.testing.assert_array_equal(got, arr, err_msg=name)  # same bits, so exact
        assert np.abs(arr).max() > 0, name  # never zeros
    if kw.get("tied"):
        assert "lm_head.weight" not in src
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3, 4]])).logits
    assert torch.isfinite(logits).all()


def test_tokenizer_and_chat_template(tmp_path):
    from tokenizers import Tokenizer
    d = make_checkpoint(tmp_path / "ckpt")
    tok = Tokenizer.from_str((d / "tokenizer.json").read_text())
    cfg = json.loads((d / "config.json").read_text())
    assert tok.token_to_id("<|im_end|>") == cfg["eos_token_id"] < cfg["vocab_size"]
    text = "def fib(n):\n    return n"
    assert tok.decode(tok.encode(text).ids) == text
    hf_tok = transformers.AutoTokenizer.from_pretrained(d)
    s = hf_tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert s.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_deterministic(tmp_path):
    a = make_checkpoint(tmp_path / "a", seed=3)
    b = make_checkpoint(tmp_path / "b", seed=3)
    for f in ["model.safetensors", "tokenizer.json", "config.json"]:
        assert (a / f).read_bytes() == (b / f).read_bytes(), f


def test_bf16_rounding_matches_torch():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(10000) * 10.0 ** rng.integers(-8, 8, 10000)).astype(np.float32)
    ours = f32_to_bf16_bits(x)
    ref = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(ours, ref)
    np.testing.assert_array_equal(bf16_bits_to_f32(ours), torch.from_numpy(x).to(torch.bfloat16).float().numpy())
