"""bench/convert_7b.py builds tokenizer.json from Qwen2's vocab.json + merges.txt: it must tokenize exactly like
transformers' Qwen2Tokenizer built from the same two files (transformers assembles the Qwen2 pipeline —
normalizer, split regex, byte-level BPE — with its own code: an independent construction)."""
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
transformers = pytest.importorskip("transformers")


def _bench_module():
    spec = importlib.util.spec_from_file_location("convert_7b", ROOT / "bench" / "convert_7b.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_tokenizer_json_matches_slow_qwen2_tokenizer():
    bench = _bench_module()
    try:
        tok_dir = bench.find_tokenizer_dir()
    except SystemExit:
        pytest.skip("no Qwen2 tokenizer files in this checkout")
    from tokenizers import Tokenizer
    fast = Tokenizer.from_str(bench.build_tokenizer_json(tok_dir))
    slow = transformers.Qwen2Tokenizer(vocab=str(tok_dir / "vocab.json"), merges=str(tok_dir / "merges.txt"))
    texts = [
        "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n-1) + fibonacci(n-2)\n",
        "Hello, world! It's 2026; naïve café — 東京 🚀\t\ttabs   spaces\r\n",
        "x=[i**2 for i in range(10)]  # squares\n\n\n",
    ]
    for t in texts:
        want = slow.encode(t, add_special_tokens=False)
        got = fast.encode(t, add_special_tokens=False).ids
        assert got == want, t
        assert fast.decode(got) == t
    added = tok_dir / "added_tokens.json"
    if added.exists():
        import json
        for content, idx in json.loads(added.read_text()).items():
            assert fast.token_to_id(content) == idx
            assert fast.encode(f"a{content}b").ids == fast.encode("a").ids + [idx] + fast.encode("b").ids
