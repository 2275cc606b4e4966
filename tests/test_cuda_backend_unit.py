"""CPU tests of nanoqwen_rt.backends.cuda's pure-Python parts: supports() mirrors the C loader's limits, and
available() is False (never raises) where the library or a GPU is missing."""
from __future__ import annotations

import dataclasses

import pytest

from nanoqwen_format import DType, ModelConfig
from nanoqwen_rt.backends.cuda import backend as cuda_backend

QWEN25_7B = ModelConfig(arch="qwen2", n_layers=28, hidden_size=3584, intermediate_size=18944, n_heads=28,
                        n_kv_heads=4, head_dim=128, vocab_rows=152064, max_positions=32768, rope_theta=1e6,
                        rope_scaling_type="none", rope_scaling_factor=1.0, rope_original_max_positions=0,
                        rms_norm_eps=1e-6, tied_embeddings=False, qkv_bias=True, bos_token_id=151643,
                        eos_token_id=151645, pad_token_id=151643)


def test_supports_every_qwen25_size():
    sizes = {"0.5B": (896, 4864, 14, 2), "1.5B": (1536, 8960, 12, 2), "3B": (2048, 11008, 16, 2),
             "7B": (3584, 18944, 28, 4), "14B": (5120, 13824, 40, 8), "32B": (5120, 27648, 40, 8)}
    for name, (h, i, nh, kv) in sizes.items():
        cfg = dataclasses.replace(QWEN25_7B, hidden_size=h, intermediate_size=i, n_heads=nh, n_kv_heads=kv,
                                  head_dim=h // nh)
        assert cuda_backend.supports(cfg) is None, name


@pytest.mark.parametrize("change,word", [
    (dict(head_dim=32, hidden_size=896, n_heads=28), "head_dim"),
    (dict(rope_scaling_type="yarn", rope_scaling_factor=4.0, rope_original_max_positions=32768), "yarn"),
    (dict(intermediate_size=18900), "intermediate_size"),
    (dict(n_kv_heads=2), "query heads"),
])
def test_supports_names_the_reason(change, word):
    cfg = dataclasses.replace(QWEN25_7B, **change)
    why = cuda_backend.supports(cfg)
    assert why is not None and word in why


def test_supports_rejects_f32_linear_weights():
    why = cuda_backend.supports(QWEN25_7B, {"model.layers.0.mlp.down_proj.weight": DType.F32,
                                            "model.norm.weight": DType.F32})
    assert why is not None and "down_proj" in why
    assert cuda_backend.supports(QWEN25_7B, {"model.norm.weight": DType.F32}) is None


def test_available_never_raises(monkeypatch, tmp_path):
    monkeypatch.setattr(cuda_backend, "_lib", None)
    monkeypatch.setattr(cuda_backend, "_lib_error", None)
    monkeypatch.setenv("NANOQWEN_LIB", str(tmp_path / "missing.so"))
    assert cuda_backend.available() is False
    with pytest.raises(cuda_backend.BackendError, match="missing.so"):
        cuda_backend.load_library()
