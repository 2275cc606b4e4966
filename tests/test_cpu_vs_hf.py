"""CPU backend vs Hugging Face transformers (a reference nobody here wrote) on tiny random Qwen2 / Llama models.

Each case: a random model made with torch.manual_seed → save_pretrained (safetensors, fp32 or bf16) →
nanoqwen_quant.convert_checkpoint (--quant none: f16 weights; int4: layout-1 int4) → CPUBackend. The reference is
transformers in fp32 with exactly the weights the file holds (f16-rounded, or int4-dequantized by the format's own
reader), so the comparison isolates the forward pass. Checked: prompt + 32 greedy decode steps (prefill, then
decode with the KV cache), the batched logits_all path, and greedy tokens identical to transformers' own argmax.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from nanoqwen_format import open_file  # noqa: E402
from nanoqwen_quant.convert import convert_checkpoint  # noqa: E402
from nanoqwen_rt.backends.cpu import CPUBackend  # noqa: E402

# Both sides run float32 with bit-identical weights, so they differ only in summation order (f32 eps 6e-8 times
# sqrt(K) over K ≤ 512 and 1-2 layers): observed ≤ ~2e-6 on logits of magnitude ~1-5. 2e-4 leaves ≥ 50x margin and
# is still orders of magnitude below the error of any real bug (wrong RoPE pairing, missing bias, GQA mapping,
# norm epsilon, yarn scaling: all ≥ 1e-2 on these models).
LOGIT_ATOL = 2e-4
N_PROMPT = 12
N_DECODE = 32
VOCAB = 320

CASES = {
    # name: (arch, hidden, inter, layers, heads, kv_heads, head_dim, tied, theta, rope, src dtype, group)
    "qwen2-hd64-gqa2-untied-1e6-f32src": ("qwen2", 256, 512, 2, 4, 2, 64, False, 1e6, None, "float32", 128),
    "qwen2-hd128-gqa1-tied-1e4-bf16src": ("qwen2", 256, 256, 1, 2, 2, 128, True, 1e4, None, "bfloat16", 128),
    "llama-hd64-gqa7-nobias-1e4": ("llama", 448, 256, 1, 7, 1, 64, False, 1e4, None, "float32", 64),
    "qwen2-yarn4": ("qwen2", 128, 256, 1, 2, 1, 64, False, 1e4,
                    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}, "float32", 64),
    "llama-linear2-tied-hd128": ("llama", 256, 256, 1, 2, 1, 128, True, 1e4,
                                 {"rope_type": "linear", "factor": 2.0}, "bfloat16", 128),
}


def _hf_model(arch, hidden, inter, layers, heads, kv, hd, tied, theta, rope, seed):
    rp = {"rope_type": "default", "rope_theta": theta} if rope is None else {**rope, "rope_theta": theta}
    common = dict(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
                  num_key_value_heads=kv, vocab_size=VOCAB, max_position_embeddings=128, rms_norm_eps=1e-6,
                  tie_word_embeddings=tied, rope_parameters=rp)
    if arch == "qwen2":
        assert hd == hidden // heads
        cfg = transformers.Qwen2Config(**common)
        cls = transformers.Qwen2ForCausalLM
    else:
        cfg = transformers.LlamaConfig(**common, head_dim=hd, attention_bias=False, mlp_bias=False)
        cls = transformers.LlamaForCausalLM
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    # transformers' init leaves biases at 0 and norms at 1: replace everything with non-trivial values
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            elif "embed_tokens" in name or "lm_head" in name:
                p.copy_(0.5 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
    return model


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """case name → (hf dir, {quant: file path}); converted once per module."""
    cache = {}

    def get(name, quant, lm_head="fp16"):
        key = (name, quant, lm_head)
        if key not in cache:
            arch, hidden, inter, layers, heads, kv, hd, tied, theta, rope, src, g = CASES[name]
            d = tmp_path_factory.mktemp(name.replace(".", "_"))
            if (name, "src") not in cache:
                m = _hf_model(arch, hidden, inter, layers, heads, kv, hd, tied, theta, rope,
                              seed=sorted(CASES).index(name))
                m.to(getattr(torch, src)).save_pretrained(d / "hf")
                cache[(name, "src")] = d / "hf"
            out = d / f"{quant}-{lm_head}.nanoqwen"
            convert_checkpoint(cache[(name, "src")], out, quant=quant, group_size=g, mode="rtn", lm_head=lm_head)
            cache[key] = out
        return cache[(name, "src")], cache[key]
    return get


def _reference_model(hf_dir, path):
    """transformers model in fp32 holding exactly the file's weights (f16-rounded or int4-dequantized)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with open_file(path) as f:
        sd = {n: torch.from_numpy(f.float32(n).copy()) for n in f.tensors}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected
    # only lm_head may be missing, and only when tied (it is the embedding then)
    assert set(missing) <= ({"lm_head.weight"} if model.config.tie_word_embeddings else set()), missing
    if model.config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model


def _run_case(hf_dir, path, seed, atol=LOGIT_ATOL):
    ref = _reference_model(hf_dir, path)
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, VOCAB, size=N_PROMPT).astype(np.int32)
    be = CPUBackend(path)
    be.poison()                                   # any read of an unwritten KV slot → NaN logits
    try:
        ours = [be.prefill(prompt)]               # (vocab,) per step
        toks = []
        for _ in range(N_DECODE):
            toks.append(int(np.argmax(ours[-1])))
            ours.append(be.decode(toks[-1]))
        assert be.position == N_PROMPT + N_DECODE
        ours = np.stack(ours)                     # (N_DECODE+1, vocab) = positions N_PROMPT-1 .. end
        # transformers' own greedy loop (full forward each step: no shared cache logic with ours)
        seq = [int(t) for t in prompt]
        hf_toks = []
        with torch.no_grad():
            for _ in range(N_DECODE):
                logits = ref(torch.tensor([seq])).logits[0, -1]
                hf_toks.append(int(torch.argmax(logits)))
                seq.append(hf_toks[-1])
            full = ref(torch.tensor([seq])).logits[0].numpy()          # (N_PROMPT+N_DECODE, vocab)
        assert toks == hf_toks, "greedy tokens differ from transformers"
        assert np.isfinite(ours).all()
        np.testing.assert_allclose(ours, full[N_PROMPT - 1:], rtol=0, atol=atol)
        # batched path (prefill of the whole sequence at once) on the same sequence
        all_ = be.logits_all(np.array(seq, dtype=np.int32))
        assert all_.shape == (len(seq), be.config.vocab_rows)
        np.testing.assert_allclose(all_, full, rtol=0, atol=atol)
        # sanity that the comparison is not vacuous: logits are far from constant
        assert full.std() > 0.1
    finally:
        be.close()


@pytest.mark.parametrize("name", sorted(CASES))
def test_f16_file_matches_transformers(converted, name):
    hf_dir, path = converted(name, "none")
    with open_file(path) as f:
        assert all(t.dtype.name in ("F16",) for n, t in f.tensors.items() if n.endswith("proj.weight"))
    _run_case(hf_dir, path, seed=1)


@pytest.mark.parametrize("name", sorted(CASES))
def test_int4_file_matches_transformers_dequantized(converted, name):
    hf_dir, path = converted(name, "int4")
    with open_file(path) as f:
        assert all(t.dtype.name == "INT4G" for n, t in f.tensors.items() if n.endswith("proj.weight"))
    _run_case(hf_dir, path, seed=2)


def test_int4_lm_head_matches_transformers(converted):
    hf_dir, path = converted("qwen2-hd64-gqa2-untied-1e6-f32src", "int4", lm_head="int4")
    with open_file(path) as f:
        assert f.tensors["lm_head.weight"].dtype.name == "INT4G"
    _run_case(hf_dir, path, seed=3)
