"""GGUF import: files written with the gguf package's own GGUFWriter (and its quantizer where it has one) from a
synthetic checkpoint, read back through nanoqwen-convert: config, tensors (llama q/k permutation undone),
tokenizer rebuilt from tokenizer.ggml.* (same ids as the HF tokenizer), chat template, logits."""
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

gguf = pytest.importorskip("gguf")

from nanoqwen_format import BlobKind, DType, open_file  # noqa: E402
from nanoqwen_quant.convert import convert_checkpoint, main as convert_main  # noqa: E402
from nanoqwen_quant.load import load_checkpoint  # noqa: E402
from nanoqwen_quant.verify import verify_file  # noqa: E402
from quant_sources import assert_logits_match_transformers, write_gguf  # noqa: E402
from synth import CHATML_TEMPLATE, load_source_f32, make_checkpoint  # noqa: E402

QWEN = dict(hidden=256, intermediate=512, n_layers=2, n_heads=4, n_kv_heads=2, vocab=320)
LLAMA = dict(arch="llama", qkv_bias=False, hidden=256, intermediate=512, n_layers=2, n_heads=4, n_kv_heads=2,
             vocab=320)
TEXT = "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)  # Hello, world! 123 über\n"


@pytest.mark.parametrize("kw, linear_type", [(QWEN, "F32"), (LLAMA, "F32"), (QWEN, "Q8_0"), (LLAMA, "Q4_K")],
                         ids=["qwen2-f32", "llama-f32", "qwen2-q8_0", "llama-q4_k"])
def test_gguf_to_f16_file_logits(tmp_path, kw, linear_type):
    """GGUF → --quant none: the file holds what the GGUF means (the source, or its gguf dequantization) rounded to
    f16, the llama q/k permutation undone (a wrong row order changes the logits by far more than LOGIT_ATOL)."""
    src = make_checkpoint(tmp_path / "src", dtype="f32", **kw)
    g = tmp_path / "model.gguf"
    meaning = write_gguf(src, g, linear_type=linear_type, embed_type="F32", arch=kw.get("arch", "qwen2"))
    out = convert_checkpoint(g, tmp_path / "m.nanoqwen", quant="none")
    f16 = {n: w.astype(np.float16).astype(np.float32) for n, w in meaning.items()}
    if linear_type == "F32":
        assert all(np.array_equal(meaning[n], w) for n, w in load_source_f32(src).items())
    with open_file(out) as f:
        for n, w in f16.items():
            np.testing.assert_array_equal(f.float32(n), w, err_msg=n)
    assert_logits_match_transformers(src, out, f16, seed=3, n_tokens=20)


def test_tokenizer_and_metadata_round_trip(tmp_path):
    src = make_checkpoint(tmp_path / "src", **QWEN)
    blob = tmp_path / "sha256-0123abcd"                       # an Ollama blob: no extension, GGUF magic
    write_gguf(src, blob, linear_type="Q8_0")
    out = tmp_path / "m.nanoqwen"
    r = CliRunner().invoke(convert_main, [str(blob), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "import: gguf source: 0 int4 tensors repacked losslessly, 14 requantized" in r.output
    assert "hint:" not in r.output        # mse measured worse than rtn on GGUF sources: no hint to use it
    from tokenizers import Tokenizer
    hf_tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    with open_file(out) as f:
        ours = Tokenizer.from_str(f.blob_text(BlobKind.TOKENIZER_JSON))
        assert f.blob_text(BlobKind.CHAT_TEMPLATE) == CHATML_TEMPLATE
        cfg = json.loads((src / "config.json").read_text())
        assert (f.config.bos_token_id, f.config.eos_token_id) == (cfg["bos_token_id"], cfg["eos_token_id"])
        assert f.config.vocab_rows == 320 and f.config.rope_theta == 1e6 and not f.config.tied_embeddings
        assert f.blob_json(BlobKind.PROVENANCE)["import"]["tokenizer"] == "rebuilt"
    chat = "<|im_start|>user\n" + TEXT + "<|im_end|>\n<|im_start|>assistant\n"
    for text in (TEXT, chat, "  spaces\t\ttabs\n\n\nnewlines", "x" * 50):
        want = hf_tok.encode(text).ids
        assert ours.encode(text).ids == want, text
        assert ours.decode(want, skip_special_tokens=False) == hf_tok.decode(want, skip_special_tokens=False)
    assert len(hf_tok.encode(chat).ids) > 10
    from nanoqwen_quant.verify import main as verify_main
    r = CliRunner().invoke(verify_main, [str(out), "--source", str(blob)])
    assert r.exit_code == 0 and r.output.strip().endswith("OK"), r.output


@pytest.mark.parametrize("qtype", ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K"])
def test_quant_types_dequantized_and_requantized(tmp_path, qtype):
    """Each type reads back as the gguf package's dequantization (row order and shapes right); int4 conversion
    verifies against it with the usual int4 bounds."""
    src = make_checkpoint(tmp_path / "src", **QWEN)
    g = tmp_path / "m.gguf"
    meaning = write_gguf(src, g, linear_type=qtype)
    ck = load_checkpoint(g)
    name = "model.layers.1.mlp.down_proj.weight"
    assert ck.imported[name].encoding == f"gguf {qtype}"
    np.testing.assert_array_equal(ck.read_f32(name), meaning[name])
    out = convert_checkpoint(g, tmp_path / "m.nanoqwen")
    with open_file(out) as f:
        assert f.tensors[name].dtype == DType.INT4G
    rep = verify_file(out, g)
    assert rep["ok"], [t for t in rep["tensors"] if not t["ok"]]


def test_refusals(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 10)
    r = CliRunner().invoke(convert_main, [str(bad), "-o", str(tmp_path / "o.nanoqwen"), "-q"])
    assert r.exit_code == 2 and "not a readable GGUF file" in r.output and "Traceback" not in r.output, r.output
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    r = CliRunner().invoke(convert_main, [str(other), "-o", str(tmp_path / "o.nanoqwen"), "-q"])
    assert r.exit_code == 2 and "not a GGUF file" in r.output, r.output
    assert not (tmp_path / "o.nanoqwen").exists()


QWEN2_TOKENIZER_DIR = Path(__file__).resolve().parent.parent / "bench" / "assets" / "qwen2-tokenizer"


@pytest.mark.slow
def test_real_qwen2_vocab_gguf_tokenizer_matches_transformers(tmp_path):
    """Qwen2's real vocab.json + merges.txt as llama.cpp stores them (tokens by id, 'a b' merges, specials as
    CONTROL, [PAD] UNUSED rows up to the embedding size) → our rebuilt tokenizer.json tokenizes like transformers'
    slow Qwen2Tokenizer (its own Python BPE: an independent implementation)."""
    transformers = pytest.importorskip("transformers")
    if not (QWEN2_TOKENIZER_DIR / "vocab.json").exists():
        pytest.skip("no Qwen2 tokenizer files in this checkout")
    from tokenizers import Tokenizer
    from nanoqwen_quant.sources.gguf_file import tokenizer_json_from_gguf
    vocab = json.loads((QWEN2_TOKENIZER_DIR / "vocab.json").read_text(encoding="utf-8"))
    merges = [ln for ln in (QWEN2_TOKENIZER_DIR / "merges.txt").read_text(encoding="utf-8").splitlines()
              if ln and not ln.startswith("#version")]
    specials = {"<|endoftext|>": len(vocab), "<|im_start|>": len(vocab) + 1, "<|im_end|>": len(vocab) + 2}
    rows = len(vocab) + len(specials) + 5
    inv = {i: t for t, i in vocab.items()}
    inv_sp = {i: t for t, i in specials.items()}
    tokens = [inv.get(i) or inv_sp.get(i) or f"[PAD{i}]" for i in range(rows)]
    types = [1 if i in inv else 3 if i in inv_sp else 5 for i in range(rows)]
    g = tmp_path / "tok.gguf"
    w = gguf.GGUFWriter(str(g), "qwen2")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    text, why = tokenizer_json_from_gguf(gguf.GGUFReader(g))
    assert text is not None, why
    ours = Tokenizer.from_str(text)
    slow = transformers.Qwen2Tokenizer(vocab=str(QWEN2_TOKENIZER_DIR / "vocab.json"),
                                       merges=str(QWEN2_TOKENIZER_DIR / "merges.txt"))
    for t in [TEXT, "Hello, world! It's 2026; naïve café — 東京 🚀\t\ttabs   spaces\r\n",
              "x=[i**2 for i in range(10)]  # squares\n\n\n", "1234567 + 89 = 1234656"]:
        want = slow.encode(t, add_special_tokens=False)
        assert ours.encode(t, add_special_tokens=False).ids == want, t
        assert ours.decode(want) == t
    assert ours.encode("a<|im_start|>b").ids == ours.encode("a").ids + [specials["<|im_start|>"]] + \
        ours.encode("b").ids
    assert ours.get_vocab_size(with_added_tokens=True) == len(vocab) + len(specials)


def test_engine_on_a_gguf_converted_file(tmp_path):
    """The Engine uses what was rebuilt: text prompts tokenize like the HF tokenizer, the chat template renders
    (ChatML from tokenizer.chat_template), stop ids come from the GGUF's eos, and the logits of the text prompt
    equal those of its ids."""
    from nanoqwen_rt.engine import Engine
    from tokenizers import Tokenizer
    src = make_checkpoint(tmp_path / "src", **QWEN)
    g = tmp_path / "m.gguf"
    write_gguf(src, g, linear_type="Q8_0")
    out = convert_checkpoint(g, tmp_path / "m.nanoqwen")
    hf_tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    cfg = json.loads((src / "config.json").read_text())
    with Engine(out, device="cpu") as eng:
        ids = eng.encode(TEXT)
        assert ids.tolist() == hf_tok.encode(TEXT).ids
        assert cfg["eos_token_id"] in eng.stop_token_ids
        text = eng.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
        assert text == "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n" \
                       "<|im_start|>assistant\n"
        np.testing.assert_array_equal(eng.logits(ids.tolist()), eng.logits(list(hf_tok.encode(TEXT).ids)))
        chunks = list(eng.chat([{"role": "user", "content": "def f():"}], max_new_tokens=4))
        assert 1 <= sum(len(c.token_ids) for c in chunks) <= 4
        assert chunks[-1].finish_reason in ("stop", "length")


# -- SentencePiece ("llama") vocabularies: Llama 2, TinyLlama, llama2.c --------------------------------------------
SPM_TEXTS = [TEXT, "  leading spaces", "a  b   c", "tabs\t\tand\n\nnewlines  ", "x", " ", "", "日本語 テキスト",
             "class Point:\n    def __init__(self, x, y):\n        self.x = x\n", "über 🙂 emoji!!"]


def _spm_model(vocab_size: int) -> bytes:
    """A SentencePiece BPE model trained here (Python text; byte fallback; one user-defined piece)."""
    import io
    sentencepiece = pytest.importorskip("sentencepiece")
    from synth import _TRAIN_TEXT
    buf = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(_TRAIN_TEXT * 20), model_writer=buf, vocab_size=vocab_size, model_type="bpe",
        byte_fallback=True, character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2, user_defined_symbols=["<|x|>"],
        normalization_rule_name="identity", remove_extra_whitespaces=False, minloglevel=2)
    return buf.getvalue()


def test_sentencepiece_vocabulary_tokenizes_like_sentencepiece(tmp_path):
    """A "llama" GGUF vocabulary (pieces, scores, types as llama.cpp's converter writes them) → the rebuilt
    tokenizer.json gives SentencePiece's own ids and text back, the Engine puts the BOS first (llama.cpp's default
    for these vocabularies), and a user-defined piece stays whole. One rule follows llama.cpp, not SentencePiece:
    text after a special piece gets its own "▁" prefix."""
    import sentencepiece
    from tokenizers import Tokenizer
    from nanoqwen_rt.engine import Engine
    model = _spm_model(420)
    sp = sentencepiece.SentencePieceProcessor(model_proto=model)
    src = make_checkpoint(tmp_path / "src", **dict(LLAMA, vocab=sp.get_piece_size()), tokenizer=False)
    g = tmp_path / "m.gguf"
    write_gguf(src, g, arch="llama", spm_model=model)
    r = CliRunner().invoke(convert_main, [str(g), "-o", str(tmp_path / "m.nanoqwen"), "--quant", "none"])
    assert r.exit_code == 0 and "tokenizer not rebuilt" not in r.output, r.output
    with open_file(tmp_path / "m.nanoqwen") as f:
        ours = Tokenizer.from_str(f.blob_text(BlobKind.TOKENIZER_JSON))
        tcfg = f.blob_json(BlobKind.TOKENIZER_CONFIG)
        assert f.blob_json(BlobKind.PROVENANCE)["import"]["tokenizer"] == "rebuilt"
    assert (tcfg["bos_token"], tcfg["eos_token"], tcfg["unk_token"], tcfg["add_bos_token"]) == ("<s>", "</s>", "<unk>",
                                                                                                True)
    for text in SPM_TEXTS:
        want = sp.encode(text)
        assert ours.encode(text, add_special_tokens=False).ids == want, text
        assert ours.decode(want, skip_special_tokens=False) == sp.decode(want), text
    assert any(sp.id_to_piece(i).startswith("<0x") for i in sp.encode(SPM_TEXTS[-1]))    # byte fallback was used
    x = sp.piece_to_id("<|x|>")
    assert ours.encode("a<|x|>b", add_special_tokens=False).ids == sp.encode("a") + [x] + sp.encode("b")
    with Engine(tmp_path / "m.nanoqwen", device="cpu") as eng:
        assert eng.encode(TEXT).tolist() == [sp.bos_id()] + sp.encode(TEXT)
        chunks = list(eng.generate(TEXT, max_new_tokens=6, temperature=0.0))
        ids = [i for c in chunks for i in c.token_ids]
        assert len(ids) >= 1 and "".join(c.text for c in chunks) == ours.decode(ids)      # streamed = whole
        # logprobs' per-token bytes: ▁ is a space, <0xHH> its byte; together the text with its prefix space
        text = SPM_TEXTS[-1]
        assert b"".join(eng.tokenizer.token_bytes(i) for i in sp.encode(text)) == (" " + text).encode("utf-8")


def test_sentencepiece_vocabulary_without_scores_is_not_rebuilt():
    """A "llama" vocabulary whose scores are missing cannot give merges: no tokenizer, and the reason says why."""
    from nanoqwen_quant.sources.gguf_file import tokenizer_json_from_gguf

    class Fake:                     # the reader's metadata as tokenizer_json_from_gguf reads it, scores left out
        def get_field(self, key):
            vals = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>", "a", "b", "ab"],
                    "tokenizer.ggml.token_type": [2, 1, 1, 1]}
            if key not in vals:
                return None
            return type("F", (), {"contents": lambda self, v=vals[key]: v})()
    text, why = tokenizer_json_from_gguf(Fake())
    assert text is None and "scores" in why


@pytest.mark.parametrize("meta, want", [
    (lambda wr: wr.add_float32("llama.rope.scale_linear", 4.0), ("linear", 4.0)),   # llama.cpp's first convert.py
    (lambda wr: wr.add_rope_scaling_factor(4.0), ("linear", 4.0)),                  # no type key: linear
    (lambda wr: wr.add_rope_scaling_factor(1.0), ("none", 1.0)),
    (lambda wr: (wr.add_rope_scaling_type(gguf.RopeScalingType.NONE), wr.add_rope_scaling_factor(4.0)), None),
], ids=["scale_linear", "factor-without-type", "factor-1", "none-with-a-factor"])
def test_rope_scaling_read_as_llama_cpp_reads_it(tmp_path, meta, want):
    """llama.cpp runs a factor without a type key, or the older rope.scale_linear key, as linear scaling: so does
    the file (they converted as no scaling before, a wrong rotary angle at every position past 0); a type 'none'
    beside a factor, which llama.cpp would still scale by, is refused."""
    src = make_checkpoint(tmp_path / "src", **LLAMA)
    write_gguf(src, tmp_path / "m.gguf", arch="llama", meta=meta)
    r = CliRunner().invoke(convert_main, [str(tmp_path / "m.gguf"), "-o", str(tmp_path / "m.nanoqwen"), "-q",
                                          "--quant", "none"])
    if want is None:
        assert r.exit_code == 2 and "rope scaling type 'none'" in r.output and "Traceback" not in r.output, r.output
        return
    assert r.exit_code == 0, r.output
    with open_file(tmp_path / "m.nanoqwen") as f:
        assert (f.config.rope_scaling_type, f.config.rope_scaling_factor) == want
