"""nanoqwen_rt.tokenizer vs transformers' tokenizer (encode/decode, chat template rendering), stream decoding."""
from __future__ import annotations

import json

import pytest

transformers = pytest.importorskip("transformers")

from synth import make_checkpoint  # noqa: E402  (tests/synth.py)

from nanoqwen_rt.tokenizer import ChatTemplateError, StreamDecoder, Tokenizer  # noqa: E402

TEXTS = ["def fib(n):\n    return n", "héllo wörld", "emoji 😀🐍 and ñ, 中文字符, ✓",
         "  leading spaces\tand\ttabs\n\n", "<|im_start|>user\nhi<|im_end|>", "a"]

# Exercises what transformers' jinja setup changes: trim_blocks/lstrip_blocks (plain {% %} on their own lines),
# loop controls (break/continue), its json.dumps-based tojson (no HTML escaping), raise_exception, namespace,
# and the special-token variables (bos_token, eos_token) taken from tokenizer_config.
TEMPLATE = """{% set ns = namespace(n=0) %}
{% for m in messages %}
    {% if m['role'] == 'tool' %}
        {{ raise_exception('tool messages are not supported: ' + m['content']) }}
    {% endif %}
    {% if m['role'] == 'skip' %}
        {% continue %}
    {% endif %}
    {% set ns.n = ns.n + 1 %}
{{ bos_token }}<|im_start|>{{ m['role'] }}
{{ m['content'] }}{% if m['meta'] is defined %} {{ m['meta'] | tojson }}{% endif %}
<|im_end|>{{ eos_token }}
    {% if ns.n >= 4 %}{% break %}{% endif %}
{% endfor %}
{% if add_generation_prompt %}
<|im_start|>assistant
{% endif %}"""

CONVERSATIONS = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "be <b>brief</b> & nice"}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "und 😀?", "meta": {"a": "<é>", "b": [1, 2]}}],
    [{"role": "user", "content": "x"}, {"role": "skip", "content": "y"}, {"role": "user", "content": "z"},
     {"role": "assistant", "content": "1"}, {"role": "user", "content": "2"}, {"role": "user", "content": "3"}],
    [{"role": "user", "content": "none key", "name": None}],
]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok") / "hf"
    make_checkpoint(d, dtype="f32", n_layers=1, hidden=128, intermediate=256, n_heads=2, n_kv_heads=1)
    return d


def _ours(d, template=None, **cfg_over):
    tcfg = json.loads((d / "tokenizer_config.json").read_text())
    tcfg.update(cfg_over)
    if template is not None:
        tcfg["chat_template"] = template
    return Tokenizer((d / "tokenizer.json").read_text(), chat_template=tcfg.get("chat_template"),
                     tokenizer_config=tcfg, generation_config=json.loads((d / "generation_config.json").read_text()))


def _hf(d, tmp_path, template=None, **cfg_over):
    """transformers' tokenizer from a copy of the dir with the same tokenizer_config edits."""
    import shutil
    e = tmp_path / "hfcopy"
    shutil.copytree(d, e)
    tcfg = json.loads((e / "tokenizer_config.json").read_text())
    tcfg.update(cfg_over)
    if template is not None:
        tcfg["chat_template"] = template
    (e / "tokenizer_config.json").write_text(json.dumps(tcfg))
    return transformers.AutoTokenizer.from_pretrained(e)


def test_encode_decode_match_transformers(ckpt, tmp_path):
    ours, hf = _ours(ckpt), _hf(ckpt, tmp_path)
    for t in TEXTS:
        ids = ours.encode(t)
        assert ids == hf.encode(t, add_special_tokens=False)
        assert ours.decode(ids, skip_special_tokens=False) == hf.decode(ids, skip_special_tokens=False)
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True)


def test_shipped_chat_template_matches_transformers(ckpt, tmp_path):
    ours, hf = _ours(ckpt), _hf(ckpt, tmp_path)
    for conv in CONVERSATIONS[:2]:
        for gen in (True, False):
            assert ours.apply_chat_template(conv, add_generation_prompt=gen) == \
                hf.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen)


def test_feature_template_matches_transformers(ckpt, tmp_path):
    over = {"bos_token": "<|endoftext|>", "eos_token": {"content": "<|im_end|>", "special": True}}
    ours, hf = _ours(ckpt, TEMPLATE, **over), _hf(ckpt, tmp_path, TEMPLATE, bos_token="<|endoftext|>")
    for conv in CONVERSATIONS:
        for gen in (True, False):
            a = ours.apply_chat_template(conv, add_generation_prompt=gen)
            assert a == hf.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen)
            assert "&lt;" not in a          # tojson must not HTML-escape
    with pytest.raises(ChatTemplateError, match="tool messages are not supported: boom"):
        ours.apply_chat_template([{"role": "tool", "content": "boom"}])


@pytest.mark.parametrize("bad", [[], ["not a dict"], [{"content": "no role"}]])
def test_bad_messages_are_named_errors(ckpt, bad):
    with pytest.raises(ChatTemplateError):
        _ours(ckpt).apply_chat_template(bad)


def test_no_template_is_a_named_error(ckpt):
    tj = (ckpt / "tokenizer.json").read_text()
    with pytest.raises(ChatTemplateError, match="no chat template"):
        Tokenizer(tj).apply_chat_template([{"role": "user", "content": "x"}])


def test_stop_ids_from_generation_config(ckpt):
    tok = _ours(ckpt)
    gen = json.loads((ckpt / "generation_config.json").read_text())
    assert list(tok.stop_token_ids[:len(gen["eos_token_id"])]) == gen["eos_token_id"]


def test_stream_decoder_never_splits_characters(ckpt, tmp_path):
    ours = _ours(ckpt)
    for t in TEXTS:
        ids = ours.encode(t)
        dec = StreamDecoder(ours, skip_special_tokens=False)
        pieces = [dec.push([i]) for i in ids]
        pieces.append(dec.flush())
        assert "".join(pieces) == ours.decode(ids, skip_special_tokens=False) == t
        assert all("\ufffd" not in p for p in pieces)
    # the byte-level vocabulary splits the emoji into several byte tokens: a one-at-a-time decode would emit
    # replacement characters; the stream decoder holds the bytes back until the character is complete
    emoji_ids = ours.encode("😀")
    assert len(emoji_ids) > 1
    assert "\ufffd" in ours.decode(emoji_ids[:1])
    dec = StreamDecoder(ours)
    assert [dec.push([i]) for i in emoji_ids] == [""] * (len(emoji_ids) - 1) + ["😀"]


def test_stream_decoder_flushes_incomplete_tail(ckpt):
    ours = _ours(ckpt)
    ids = ours.encode("ok 😀")
    dec = StreamDecoder(ours)
    got = "".join(dec.push([i]) for i in ids[:-1])
    assert got == "ok "
    assert dec.flush().startswith("\ufffd")


# -- BOS: follow tokenizer_config's add_bos_token as transformers' Llama tokenizer does --------------------------
def test_add_bos_token_matches_transformers_llama_tokenizer():
    from pathlib import Path

    from tokenizers import Tokenizer as HFTok
    from transformers import LlamaTokenizerFast
    tj = (Path(__file__).resolve().parents[1] / "models" / "tiny-py" / "tokenizer.json").read_text()
    bos = "<|im_start|>"
    hf = LlamaTokenizerFast(tokenizer_object=HFTok.from_str(tj), bos_token=bos, eos_token="<|endoftext|>",
                            add_bos_token=True, add_eos_token=False)
    ours = Tokenizer(tj, tokenizer_config={"add_bos_token": True, "bos_token": bos})
    plain = Tokenizer(tj, tokenizer_config={"add_bos_token": False, "bos_token": bos})
    for text in TEXTS:
        if not text.startswith(bos):     # the one deliberate difference, asserted below
            assert ours.encode(text, add_bos=True) == hf(text)["input_ids"], text
        assert plain.encode(text, add_bos=True) == plain.encode(text) == hf(text, add_special_tokens=False)["input_ids"]
    # a rendered chat template that writes bos_token itself gets no second one
    assert ours.encode(bos + "hi", add_bos=True) == ours.encode(bos + "hi")


def test_lone_surrogate_is_a_named_error():
    from nanoqwen_rt.tokenizer import TokenizerError
    tok = Tokenizer(json.dumps(json.loads(_tiny_tokenizer_json())))
    with pytest.raises(TokenizerError, match="surrogate"):
        tok.encode("def \ud800(")


def _tiny_tokenizer_json() -> str:
    from pathlib import Path
    return (Path(__file__).resolve().parents[1] / "models" / "tiny-py" / "tokenizer.json").read_text()
