"""End to end on the embedded trained model (models/tiny-py): text in → Engine (CPU) → text out, vs transformers
with the same tokenizer files and the same (f16) weights in fp32."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from nanoqwen_quant.convert import convert_checkpoint  # noqa: E402
from nanoqwen_rt import Engine  # noqa: E402

MODEL = Path(__file__).resolve().parents[1] / "models" / "tiny-py"

# f16 file vs transformers fp32 on the same f16 weights: only summation order differs (see test_cpu_vs_hf.py);
# observed max abs diff 8.6e-6 on logits up to ~13 over 200 real tokens; 5e-4 leaves ~50x margin. The Engine runs
# the CPU oracle numerics here (float32 throughout): its fast numerics are bounded against the oracle in
# tests/test_cpu_fast.py.
LOGIT_ATOL = 5e-4
PROMPTS = ["def fibonacci(n):", "import os\n\nclass Config:\n    def __init__(self", "for i in range(10):"]


@pytest.fixture(scope="module")
def f16_file(tmp_path_factory):
    return convert_checkpoint(MODEL, tmp_path_factory.mktemp("tinypy") / "f16.nanoqwen", quant="none")


@pytest.fixture(scope="module")
def hf():
    tok = transformers.AutoTokenizer.from_pretrained(MODEL)
    model = transformers.AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval()
    return tok, model


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_text_matches_transformers(f16_file, hf, prompt):
    tok, model = hf
    with Engine(f16_file, device="cpu", max_context=256, cpu_numerics="oracle") as eng:
        assert eng.tokenizer.encode(prompt) == tok.encode(prompt, add_special_tokens=False)
        chunks = list(eng.generate(prompt, max_new_tokens=32, stop_token_ids=[]))
        ids = [t for c in chunks for t in c.token_ids]
        seq = tok.encode(prompt, add_special_tokens=False)
        with torch.no_grad():
            for _ in range(32):
                seq.append(int(torch.argmax(model(torch.tensor([seq])).logits[0, -1])))
            ref_logits = model(torch.tensor([seq])).logits[0].numpy()
        n_prompt = len(seq) - 32
        assert ids == seq[n_prompt:]
        assert "".join(c.text for c in chunks) == tok.decode(ids, skip_special_tokens=True)
        ours = eng.logits(seq)
        np.testing.assert_allclose(ours, ref_logits, rtol=0, atol=LOGIT_ATOL)


def test_chat_prompt_matches_transformers(f16_file, hf):
    tok, _ = hf
    msgs = [{"role": "user", "content": "Write a function that reverses a list."}]
    with Engine(f16_file, device="cpu", max_context=256, cpu_numerics="oracle") as eng:
        text = eng.tokenizer.apply_chat_template(msgs, add_generation_prompt=True)
        assert text == tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        list(eng.chat(msgs, max_new_tokens=4))
        ref_ids = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
        ref_ids = ref_ids["input_ids"] if isinstance(ref_ids, dict) or hasattr(ref_ids, "keys") else ref_ids
        assert eng.stats.prompt_tokens == len(ref_ids)
        assert set(eng.stop_token_ids) >= {tok.convert_tokens_to_ids("<|im_end|>")}
