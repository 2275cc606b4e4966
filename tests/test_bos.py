"""BOS on text prompts, end to end: a Llama-family checkpoint whose tokenizer adds a BOS → nanoqwen-convert → the
Engine's text prompt starts with that BOS, as transformers' tokenizer does, and the logits equal transformers' on
transformers' own ids. Both ways a checkpoint says so: tokenizer_config.json's add_bos_token (Llama-2 family), and
a TemplateProcessing post-processor in tokenizer.json (Llama-3 style, no add_bos_token key)."""
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from nanoqwen_quant.convert import convert_checkpoint  # noqa: E402
from nanoqwen_rt import Engine  # noqa: E402
from quant_sources import LOGIT_ATOL  # noqa: E402
from synth import make_checkpoint  # noqa: E402

TEXT = "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"
BOS = "<|endoftext|>"            # the synthetic tokenizer's first special token (id 317 of 320)
TEMPLATE_BOS = {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": BOS, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": BOS, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                         {"SpecialToken": {"id": BOS, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {BOS: {"id": BOS, "ids": [317], "tokens": [BOS]}}}


def _llama(tmp_path, *, add_bos_token=None, post_processor=None):
    """A small Llama checkpoint in f16 (the f16 file holds exactly its values) with the tokenizer changed."""
    src = make_checkpoint(tmp_path / "src", arch="llama", qkv_bias=False, hidden=128, intermediate=256, n_layers=2,
                          n_heads=2, n_kv_heads=1, vocab=320, dtype="f16")
    tc = json.loads((src / "tokenizer_config.json").read_text())
    tc.update(bos_token=BOS, tokenizer_class="PreTrainedTokenizerFast")
    if add_bos_token is not None:
        tc["add_bos_token"] = add_bos_token
    (src / "tokenizer_config.json").write_text(json.dumps(tc))
    if post_processor is not None:
        tj = json.loads((src / "tokenizer.json").read_text())
        tj["post_processor"] = post_processor
        (src / "tokenizer.json").write_text(json.dumps(tj))
    return src, convert_checkpoint(src, tmp_path / "m.nanoqwen", quant="none")


def _logits_match_transformers(src, path, hf_ids):
    model = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = model(torch.tensor([hf_ids])).logits[0].numpy()
    # the float32 oracle numerics: the tolerance below is a summation-order bound (the Engine's default fast CPU
    # numerics round the activations and the lm_head, ~1e-2 on these logits)
    with Engine(path, device="cpu", cpu_numerics="oracle") as eng:
        ids = eng.encode(TEXT)
        assert ids.tolist() == hf_ids
        ours = eng.logits(ids)
        without_bos = eng.logits(ids[1:])
    np.testing.assert_allclose(ours, ref, rtol=0, atol=LOGIT_ATOL)
    # not vacuous: the prompt without its BOS ends on clearly different logits
    assert np.abs(without_bos[-1] - ours[-1]).max() > 100 * LOGIT_ATOL


def test_add_bos_token_in_tokenizer_config(tmp_path):
    from tokenizers import Tokenizer as HFTok
    src, path = _llama(tmp_path, add_bos_token=True)
    # transformers' Llama tokenizer class is what reads add_bos_token (its generic class ignores the key)
    hf = transformers.LlamaTokenizerFast(tokenizer_object=HFTok.from_file(str(src / "tokenizer.json")),
                                         bos_token=BOS, add_bos_token=True, add_eos_token=False)
    hf_ids = hf(TEXT)["input_ids"]
    assert hf_ids[0] == 317
    _logits_match_transformers(src, path, hf_ids)


def test_bos_from_the_tokenizer_json_post_processor(tmp_path):
    pp = {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}, TEMPLATE_BOS]}
    src, path = _llama(tmp_path, post_processor=pp)
    hf_ids = transformers.AutoTokenizer.from_pretrained(src)(TEXT)["input_ids"]
    assert hf_ids[0] == 317
    _logits_match_transformers(src, path, hf_ids)


def test_no_bos_when_the_config_says_false_or_nothing_adds_one(tmp_path):
    """add_bos_token false wins over a post-processor (the config is explicit); the synthetic Qwen-style
    tokenizer (no key, a post-processor without special tokens) adds none, as Qwen's does."""
    _, path = _llama(tmp_path, add_bos_token=False, post_processor=TEMPLATE_BOS)
    with Engine(path, device="cpu") as eng:
        assert eng.tokenizer.bos_token_id is None and eng.encode(TEXT)[0] != 317
    src = make_checkpoint(tmp_path / "qwen", hidden=128, intermediate=256, n_layers=1, n_heads=2, n_kv_heads=1)
    hf_ids = transformers.AutoTokenizer.from_pretrained(src)(TEXT)["input_ids"]
    with Engine(convert_checkpoint(src, tmp_path / "q.nanoqwen", quant="none"), device="cpu") as eng:
        assert eng.tokenizer.bos_token_id is None and eng.encode(TEXT).tolist() == hf_ids
