"""The shipped default model `models/tiny-py/`: it loads in transformers, matches what models/README.md says,
fits the size budget, its tokenizer round-trips, its chat template renders ChatML, and it writes Python.

The reference for every check here is either the brief's requirement (sizes, ChatML, Qwen2 architecture) or a
library nobody here wrote (transformers, tokenizers, jinja2); nothing is compared against its own output.
"""
from __future__ import annotations

import importlib.util
import json
import math
import re
import sysconfig
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
CKPT = ROOT / "models" / "tiny-py"
README = ROOT / "models" / "README.md"
TRAIN_SCRIPT = ROOT / "models" / "train_tiny_py.py"
MAX_CHECKPOINT_BYTES = 10 * 1000 * 1000  # the issue's budget: "≤ 10 MB" (decimal, the stricter reading)
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def _load_json(name: str) -> dict:
    return json.loads((CKPT / name).read_text(encoding="utf-8"))


def _train_module():
    spec = importlib.util.spec_from_file_location("train_tiny_py", TRAIN_SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def hf_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(CKPT)


@pytest.fixture(scope="module")
def raw_tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(CKPT / "tokenizer.json"))


@pytest.fixture(scope="module")
def hf_model():
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(CKPT, dtype=torch.float32)
    model.eval()
    return model


# ---- files and sizes --------------------------------------------------------------------------------------------

def test_checkpoint_has_the_hf_files_and_fits_the_size_budget():
    required = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                "generation_config.json", "special_tokens_map.json", "heldout_files.txt", "training_info.json"]
    missing = [f for f in required if not (CKPT / f).is_file()]
    assert not missing, f"missing from {CKPT}: {missing}"
    total = sum(f.stat().st_size for f in CKPT.iterdir() if f.is_file())
    assert total <= MAX_CHECKPOINT_BYTES, f"checkpoint is {total} bytes > {MAX_CHECKPOINT_BYTES}"


def test_safetensors_are_fp16_finite_and_tied():
    import numpy as np
    from safetensors.numpy import load_file

    tensors = load_file(str(CKPT / "model.safetensors"))
    assert "lm_head.weight" not in tensors, "embeddings are tied: lm_head.weight must be absent"
    assert "model.embed_tokens.weight" in tensors
    for name, t in tensors.items():
        assert t.dtype == np.float16, (name, t.dtype)
        assert np.isfinite(t).all(), name
        assert float(np.abs(t).max()) > 0, f"{name} is all zeros: the model is not trained"
    cfg = _load_json("config.json")
    assert cfg["torch_dtype"] == "float16" and cfg.get("dtype", "float16") == "float16"


# ---- config vs README vs the issue's requirements ----------------------------------------------------------------

def _readme_config_rows() -> dict[str, str]:
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+?) \|", README.read_text(encoding="utf-8"), flags=re.M)
    assert rows, "models/README.md has no `| `key` | value |` config table"
    return dict(rows)


def test_config_is_what_the_readme_says():
    cfg = _load_json("config.json")
    for key, text in _readme_config_rows().items():
        assert key in cfg, f"README lists {key}, config.json lacks it"
        assert json.loads(text.strip().lower() if text.strip() in ("true", "false") else text) == cfg[key], key


def test_config_meets_the_issue_requirements():
    cfg = _load_json("config.json")
    assert cfg["architectures"] == ["Qwen2ForCausalLM"] and cfg["model_type"] == "qwen2"
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    assert head_dim == 64
    assert cfg["num_attention_heads"] % cfg["num_key_value_heads"] == 0
    assert cfg["num_key_value_heads"] < cfg["num_attention_heads"], "GQA required"
    # INT4 with group 128 needs every linear layer's input dim (hidden, intermediate, q/kv out) divisible by 128.
    for k in ("hidden_size", "intermediate_size"):
        assert cfg[k] % 128 == 0, k
    assert cfg["tie_word_embeddings"] is True
    assert cfg["rope_theta"] == cfg["rope_parameters"]["rope_theta"]
    info = _load_json("training_info.json")
    assert 4_000_000 <= info["n_parameters"] <= 8_000_000


def test_readme_records_the_measured_heldout_loss():
    info = _load_json("training_info.json")
    text = README.read_text(encoding="utf-8")
    assert f"{info['heldout_loss_saved_dtype']:.4f}" in text, "README's held-out loss differs from training_info"
    assert f"{info['heldout_ppl_saved_dtype']:.2f}" in text, "README's perplexity differs from training_info"
    assert info["python_version"] in text, "README must name the Python version whose stdlib trained the model"


# ---- tokenizer --------------------------------------------------------------------------------------------------

def test_vocab_matches_embedding_rows_and_specials(raw_tokenizer, hf_tokenizer):
    cfg = _load_json("config.json")
    assert raw_tokenizer.get_vocab_size() == cfg["vocab_size"] == len(hf_tokenizer)
    ids = [raw_tokenizer.token_to_id(s) for s in SPECIALS]
    assert None not in ids and len(set(ids)) == 3
    # A special token in the text is one token, not split into bytes.
    enc = raw_tokenizer.encode("a" + "".join(SPECIALS) + "b").ids
    for i in ids:
        assert enc.count(i) == 1
    assert hf_tokenizer.eos_token == "<|endoftext|>" and hf_tokenizer.pad_token == "<|endoftext|>"
    gen = _load_json("generation_config.json")
    assert set(gen["eos_token_id"]) == {raw_tokenizer.token_to_id("<|endoftext|>"),
                                        raw_tokenizer.token_to_id("<|im_end|>")}


# Python-ish text plus arbitrary unicode (astral planes, combining marks, control characters): byte-level BPE
# with no normalizer must give the exact string back.
_code_chars = st.sampled_from(list("defclassreturn ()[]{}:=+-*/_.,'\"#\n\t    0123456789abcXYZ"))
_texts = st.one_of(st.text(min_size=0, max_size=200),
                   st.lists(_code_chars, min_size=1, max_size=300).map("".join))


@settings(max_examples=150, deadline=None)
@given(_texts)
def test_tokenizer_round_trips_exactly(raw_tokenizer, hf_tokenizer, text):
    ids = raw_tokenizer.encode(text).ids
    assert raw_tokenizer.decode(ids, skip_special_tokens=False) == text
    # transformers' Qwen2Tokenizer class NFC-normalises its input whatever tokenizer.json says; the embedded
    # model's tokenizer.json has no normalizer (Qwen's own files carry NFC), so the two agree on NFC text only
    # (e.g. U+F900 and U+2F800 are not NFC-stable).
    if unicodedata.normalize("NFC", text) == text:
        assert hf_tokenizer.encode(text, add_special_tokens=True) == ids, "transformers adds or changes tokens"
        assert hf_tokenizer.decode(ids) == text


# ---- chat template ---------------------------------------------------------------------------------------------

def _chatml(messages, add_generation_prompt):
    """ChatML as Qwen2 documents it, written out by hand (independent of the template's jinja)."""
    out = ""
    if messages[0]["role"] != "system":
        out += "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    for m in messages:
        out += f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n"
    if add_generation_prompt:
        out += "<|im_start|>assistant\n"
    return out


_content = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60)
_messages = st.lists(st.tuples(st.sampled_from(["user", "assistant"]), _content), min_size=1, max_size=4)


@settings(max_examples=60, deadline=None)
@given(_messages, st.booleans(), st.one_of(st.none(), _content))
def test_chat_template_renders_chatml(hf_tokenizer, msgs, add_generation_prompt, system):
    import jinja2

    messages = ([{"role": "system", "content": system}] if system is not None else []) + \
        [{"role": r, "content": c} for r, c in msgs]
    expected = _chatml(messages, add_generation_prompt)
    got = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert got == expected
    # The runtime renders tokenizer_config.json's template with plain jinja2; it must agree too.
    template = _load_json("tokenizer_config.json")["chat_template"]
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    assert env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt) \
        == expected
    jinja_file = CKPT / "chat_template.jinja"
    if jinja_file.exists():
        assert jinja_file.read_text(encoding="utf-8") == template


# ---- held-out split -------------------------------------------------------------------------------------------

def test_heldout_list_is_a_deterministic_five_percent_of_the_stdlib():
    info = _load_json("training_info.json")
    held = (CKPT / "heldout_files.txt").read_text(encoding="utf-8").splitlines()
    assert held == sorted(set(held)) and held, "held-out list must be sorted, unique, non-empty"
    assert all(h.endswith(".py") and not h.startswith("/") for h in held)
    n_total = info["n_train_files"] + info["n_heldout_files"]
    assert len(held) == info["n_heldout_files"]
    assert 0.02 <= len(held) / n_total <= 0.10, "about 5 % of files are held out"
    train = _train_module()
    assert all(train.is_heldout(h) for h in held)
    for part in ("test", "idlelib", "site-packages"):
        assert not any(part in Path(h).parts[:-1] for h in held)


def test_file_selection_excludes_tests_idlelib_site_packages_and_big_files(tmp_path):
    train = _train_module()
    keep = ["a.py", "pkg/b.py", "pkg/sub/c.py", "testing.py", "pkg/test_util.py"]
    drop = ["test/x.py", "pkg/tests/y.py", "idlelib/z.py", "site-packages/w.py", "big.py", "data.txt"]
    for rel in keep + drop:
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("x = 1\n" * (60_000 if rel == "big.py" else 1))  # big.py: 360 KB > 200 KB
    assert train.list_stdlib_files(tmp_path) == sorted(keep)


# ---- the model itself -------------------------------------------------------------------------------------------

def test_greedy_completion_of_fibonacci_is_python_like(hf_model, hf_tokenizer):
    import torch

    def greedy(prompt: str) -> str:
        ids = hf_tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            out = hf_model.generate(ids, max_new_tokens=48, do_sample=False)
        return hf_tokenizer.decode(out[0, ids.shape[1]:])

    keyword = r"\b(return|if|for|while|yield|raise|else|pass)\b"
    # A function header is followed by a newline and an indented body that opens as Python does: a docstring (as
    # most standard-library functions do) or a statement.
    text = greedy("def fibonacci(n):")
    assert re.match(r'\s*\n(    |\t)("""|\'\'\'|' + keyword + ")", text), repr(text)
    # With the docstring given, the body is code.
    text = greedy('def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n')
    assert re.match(r"(    |\t)\S", text) and re.search(keyword, text), repr(text)


def test_heldout_text_is_predicted_far_better_than_uniform(hf_model, raw_tokenizer):
    import torch
    import torch.nn.functional as F

    root = Path(sysconfig.get_paths()["stdlib"])
    held = [root / h for h in (CKPT / "heldout_files.txt").read_text(encoding="utf-8").splitlines()]
    held = [p for p in held if p.is_file()]
    if not held:
        pytest.skip(f"none of the held-out files exist in this interpreter's stdlib ({root})")
    # The first 256 tokens of up to 8 held-out files (prose-heavy module docstrings and code alike), one batch.
    rows = [raw_tokenizer.encode(p.read_text(encoding="utf-8")).ids[:257] for p in held[:8]]
    rows = [r for r in rows if len(r) == 257]
    x = torch.tensor(rows)  # (n_files, 257)
    with torch.no_grad():
        logits = hf_model(input_ids=x[:, :-1]).logits  # (n_files, 256, vocab)
    nll = F.cross_entropy(logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1)).item()
    uniform = math.log(_load_json("config.json")["vocab_size"])  # 8.32 nats: an untrained model's loss
    # 0.6 x uniform (~5 nats): a unigram model fitted on the training files scores 6.37 nats/token on the whole
    # held-out set and 6.92 on this slice (measured, see models/README.md), so passing needs the model to use context.
    assert nll < 0.6 * uniform, f"held-out loss {nll:.3f} nats/token is not far below uniform {uniform:.3f}"
