"""RoPE parameters and rotation vs transformers' own rotary embedding modules."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from nanoqwen_format import ModelConfig  # noqa: E402
from nanoqwen_rt.rope import UnsupportedRope, apply_rope, cos_sin, rope_parameters  # noqa: E402

# inv_freq: theta ** (2i/d) in float32; torch's pow and ours may differ by 1 ulp on rare elements → rtol 2.4e-7
# (2 ulp of float32). cos/sin are then checked from transformers' OWN inv_freq, so that a 1-ulp inv_freq difference
# (amplified by large positions) does not hide in the tolerance: same f32 angle, numpy vs torch cos/sin agree to
# ~1 ulp of a value ≤ 1.14 (yarn scaling) → atol 1e-6.
INV_RTOL = 2.4e-7
TRIG_ATOL = 1e-6

ROPES = [
    (64, 1e6, None), (128, 1e4, None), (64, 1e4, {"rope_type": "linear", "factor": 2.0}),
    (64, 1e4, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}),
    (128, 1e6, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),
    (64, 5e5, {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096}),
]


def _cfgs(hd, theta, rope):
    heads = 2
    rp = {"rope_type": "default", "rope_theta": theta} if rope is None else {**rope, "rope_theta": theta}
    hf = transformers.Qwen2Config(hidden_size=hd * heads, intermediate_size=128, num_hidden_layers=1,
                                  num_attention_heads=heads, num_key_value_heads=1, vocab_size=64,
                                  max_position_embeddings=131072, rope_parameters=rp)
    kind = "none" if rope is None else rope["rope_type"]
    ours = ModelConfig(arch="qwen2", n_layers=1, hidden_size=hd * heads, intermediate_size=128, n_heads=heads,
                       n_kv_heads=1, head_dim=hd, vocab_rows=64, max_positions=131072, rope_theta=theta,
                       rope_scaling_type=kind, rope_scaling_factor=(rope or {}).get("factor", 1.0),
                       rope_original_max_positions=(rope or {}).get("original_max_position_embeddings", 0))
    return hf, ours


@pytest.mark.parametrize("hd,theta,rope", ROPES)
def test_rope_matches_transformers(hd, theta, rope):
    hf_cfg, cfg = _cfgs(hd, theta, rope)
    emb = transformers.models.qwen2.modeling_qwen2.Qwen2RotaryEmbedding(hf_cfg)
    inv, scaling = rope_parameters(cfg)
    np.testing.assert_allclose(inv, emb.inv_freq.numpy(), rtol=INV_RTOL)
    assert scaling == pytest.approx(emb.attention_scaling, rel=1e-12)
    pos = np.array([0, 1, 7, 100, 1000, 4095], dtype=np.int64)
    x = torch.randn(1, 1, len(pos), hd)
    hc, hs = emb(x, torch.from_numpy(pos)[None])
    c, s = cos_sin(emb.inv_freq.numpy(), scaling, pos)
    np.testing.assert_allclose(c, hc[0].numpy(), atol=TRIG_ATOL, rtol=0)
    np.testing.assert_allclose(s, hs[0].numpy(), atol=TRIG_ATOL, rtol=0)
    # rotation: ours (T, H, hd) vs transformers' apply_rotary_pos_emb on (1, H, T, hd)
    rng = np.random.default_rng(hd)
    q = rng.standard_normal((len(pos), 3, hd)).astype(np.float32)
    qt = torch.from_numpy(q.transpose(1, 0, 2).copy())[None]
    ref, _ = transformers.models.qwen2.modeling_qwen2.apply_rotary_pos_emb(qt, qt, hc, hs)
    np.testing.assert_allclose(apply_rope(q, c, s), ref[0].numpy().transpose(1, 0, 2), atol=1e-5, rtol=0)


def test_unknown_rope_kind_is_refused():
    class C:
        head_dim, rope_theta, rope_scaling_type = 64, 1e4, "dynamic"
    with pytest.raises(UnsupportedRope, match="dynamic"):
        rope_parameters(C())
