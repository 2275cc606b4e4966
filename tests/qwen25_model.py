"""A tiny random Qwen2.5-shaped model file whose tokenizer is Qwen2.5's real one (151,643 BPE tokens + the 22 added
tokens 151643..151664: FIM, repo, file and tool markers) and whose chat template is Qwen2.5's, tools section
included. The FIM, tool-call and structured-output tests run on it: the embedded tiny-py model has none of those
tokens.

The tokenizer files come from the `shared/qwen2-tokenizer` folder beside the checkout (for a git worktree, beside
the folder that holds it), else from the copy in bench/assets/qwen2-tokenizer (vocab, merges, the 22 added tokens
and the chat template, Apache-2.0), so the GPU machine, which gets the checkout alone, runs these tests too. The weights are random (hidden 128, two layers,
151,936 embedding rows as in Qwen2.5-0.5B..3B, tied embeddings), so outputs are meaningless but deterministic;
every test compares the server with the in-process Engine, never with hard-coded text.
"""
from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from synth import make_checkpoint, qwen2_bpe_tokenizer

REPO = Path(__file__).resolve().parent.parent
#: where the tokenizer files are looked for, in order: shared/ beside the checkout, beside the folder holding it
#: (a git worktree), the copy in bench/assets
TOKENIZER_DIRS = [REPO.parent / "shared" / "qwen2-tokenizer", REPO.parent.parent / "shared" / "qwen2-tokenizer",
                  REPO / "bench" / "assets" / "qwen2-tokenizer"]
#: Qwen2.5's tokenizer_config.json, less the fields set from the files (added tokens, chat template)
TOKENIZER_CONFIG = {"add_prefix_space": False, "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
                    "bos_token": None, "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>",
                    "errors": "replace", "model_max_length": 32768, "pad_token": "<|endoftext|>",
                    "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer", "unk_token": None}
#: Qwen2.5-Instruct's generation_config.json
GENERATION_CONFIG = {"bos_token_id": 151643, "do_sample": True, "eos_token_id": [151645, 151643],
                     "pad_token_id": 151643, "repetition_penalty": 1.1, "temperature": 0.7, "top_k": 20, "top_p": 0.8}
#: embedding rows of Qwen2.5-0.5B..3B (the vocabulary padded past its 151,665 tokens)
VOCAB_ROWS = 151936

_lock = threading.Lock()
_built: dict[str, str] = {}


def find_tokenizer_dir() -> Path:
    """The shared Qwen2.5 tokenizer folder, or pytest.skip naming where it was looked for."""
    for d in TOKENIZER_DIRS:
        if all((d / f).is_file() for f in ("vocab.json", "merges.txt", "qwen2.5-added-tokens.json",
                                           "qwen2.5-chat-template.jinja")):
            return d
    pytest.skip(f"no Qwen2.5 tokenizer files in {', '.join(str(d) for d in TOKENIZER_DIRS)}")


def build_tokenizer_json(tok_dir: Path) -> str:
    """Qwen2.5's tokenizer.json from vocab.json + merges.txt + the 22 added tokens (special flag as listed)."""
    from tokenizers import AddedToken
    tok = qwen2_bpe_tokenizer(tok_dir)
    added = json.loads((tok_dir / "qwen2.5-added-tokens.json").read_text())["added_tokens"]
    for t in sorted(added, key=lambda t: t["id"]):
        tok.add_tokens([AddedToken(t["content"], special=t["special"], normalized=False)])
        if tok.token_to_id(t["content"]) != t["id"]:
            raise RuntimeError(f"added token {t['content']!r}: expected id {t['id']}")
    return tok.to_str()


def make_qwen25_checkpoint(path: Path) -> Path:
    """A tiny random checkpoint at `path` with Qwen2.5's tokenizer, tokenizer_config, chat template and
    generation_config."""
    tok_dir = find_tokenizer_dir()
    path = Path(path)
    make_checkpoint(path, hidden=128, intermediate=256, n_layers=2, n_heads=2, n_kv_heads=1, vocab=VOCAB_ROWS,
                    tied=True, max_positions=2048, seed=11, tokenizer=False)
    (path / "tokenizer.json").write_text(build_tokenizer_json(tok_dir))
    added = json.loads((tok_dir / "qwen2.5-added-tokens.json").read_text())["added_tokens"]
    cfg = dict(TOKENIZER_CONFIG)
    cfg["added_tokens_decoder"] = {str(t["id"]): {"content": t["content"], "lstrip": False, "normalized": False,
                                                  "rstrip": False, "single_word": False, "special": t["special"]}
                                   for t in added}
    cfg["chat_template"] = (tok_dir / "qwen2.5-chat-template.jinja").read_text()
    (path / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    (path / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2))
    c = json.loads((path / "config.json").read_text())
    c["bos_token_id"], c["eos_token_id"] = 151643, 151645
    (path / "config.json").write_text(json.dumps(c, indent=2))
    return path


def build_qwen25_model_file(tmp_dir: Path) -> str:
    """Path of the converted (INT4) file, built into `tmp_dir` on first use and cached for the session."""
    with _lock:
        if "path" not in _built:
            from nanoqwen_quant.convert import convert_checkpoint
            src = make_qwen25_checkpoint(Path(tmp_dir) / "qwen25-src")
            out = Path(tmp_dir) / "qwen25-tiny.nanoqwen"
            convert_checkpoint(src, out, quant="int4")
            _built["path"] = str(out)
        return _built["path"]
