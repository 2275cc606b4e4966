"""nanoqwen-verify --eval on the embedded model (models/tiny-py): perplexity, KL and top-1 of a converted file
against its source, the thresholds' exit codes, and the KL / perplexity arithmetic against a plain formula."""
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from nanoqwen_quant.convert import convert_checkpoint
from nanoqwen_quant.evaluate import (DEFAULT_TEXT, EVAL_MAX_MEAN_KL, compare_logits, summarize, token_windows)
from test_verify import _run   # nanoqwen-verify through click's runner: (exit code, output), never a traceback

TINY = Path(__file__).resolve().parents[1] / "models" / "tiny-py"
EVAL_TOKENS = "1024"          # two windows of 512: ~1.5 s per model on the 2-core CI machine


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("eval")
    return {"int4": convert_checkpoint(TINY, d / "int4.nanoqwen"),
            "f16": convert_checkpoint(TINY, d / "f16.nanoqwen", quant="none"), "dir": d}


def test_int4_file_passes_with_plausible_numbers(files):
    code, out = _run(files["int4"], "--source", TINY, "--eval", "--eval-tokens", EVAL_TOKENS, "--json")
    assert code == 0, out
    r = json.loads(out)
    e = r["eval"]
    assert r["ok"] and e["ok"] and e["failed"] == []
    assert e["tokens"] == 1024 and e["windows"] == 2 and e["text"] == str(DEFAULT_TEXT)
    # int4 costs something, but little: KL > 0, perplexity within the +5 % threshold, most argmaxes kept
    assert 0 < e["mean_kl"] <= e["p99_kl"] <= e["max_kl"] and e["mean_kl"] < EVAL_MAX_MEAN_KL
    assert abs(e["ppl_gap"]) < 0.05 and 0.85 <= e["top1_agreement"] < 1.0
    assert 10 < e["ppl_source"] < 300            # a trained model on held-out Python (uniform would be 4096)


def test_f16_file_is_identical_to_its_source(files):
    """--quant none of an f16 checkpoint is exact, so the file and the reference compute the same logits."""
    code, out = _run(files["f16"], "--source", TINY, "--eval", "--eval-tokens", "300", "--json")
    assert code == 0, out
    e = json.loads(out)["eval"]
    assert e["mean_kl"] == 0.0 and e["max_kl"] == 0.0 and e["top1_agreement"] == 1.0
    assert e["ppl"] == e["ppl_source"] and e["tokens"] == 300


def test_nanoqwen_file_as_source_and_text_option(files):
    text = files["dir"] / "text.py"
    text.write_text("def add(a, b):\n    return a + b\n\n" * 40)
    code, out = _run(files["int4"], "--source", files["f16"], "--eval", text)
    assert code == 0, out
    assert "perplexity: source" in out and str(text) in out and out.rstrip().endswith("OK")


def test_damaged_weights_fail_the_thresholds(files, tmp_path):
    """A file made from other weights (the MLPs of every layer scaled by 1.5) passes the structure checks of
    its own conversion but fails --eval against the real model: exit 1, and the failed thresholds named."""
    src = tmp_path / "damaged"
    shutil.copytree(TINY, src)
    t = load_file(src / "model.safetensors")
    for k in t:
        if ".mlp." in k:
            t[k] = (t[k].astype(np.float32) * 1.5).astype(np.float16)
    save_file(t, src / "model.safetensors", metadata={"format": "pt"})
    bad = convert_checkpoint(src, tmp_path / "bad.nanoqwen")
    code, out = _run(bad, "--source", files["f16"], "--eval", "--eval-tokens", "512", "--json")
    assert code == 1, out
    e = json.loads(out)["eval"]
    assert not e["ok"] and "max_mean_kl_nats" in e["failed"] and e["mean_kl"] > EVAL_MAX_MEAN_KL


def test_usage_errors_exit_2(files, tmp_path):
    code, out = _run(files["int4"], "--eval")
    assert code == 2 and "--eval needs --source" in out
    code, out = _run(files["int4"], "--source", TINY, "--eval", tmp_path / "missing.txt")
    assert code == 2 and "missing.txt" in out
    one = tmp_path / "one.txt"
    one.write_text("a")
    code, out = _run(files["int4"], "--source", TINY, "--eval", one)
    assert code == 2 and "at least 2" in out


def test_kl_and_perplexity_against_plain_formulas():
    rng = np.random.default_rng(3)
    ref = rng.standard_normal((7, 11)) * 3
    other = ref + rng.standard_normal((7, 11)) * 0.5
    targets = rng.integers(0, 11, 7)
    r = summarize([compare_logits(ref, other, targets)])
    p = np.exp(ref) / np.exp(ref).sum(1, keepdims=True)
    q = np.exp(other) / np.exp(other).sum(1, keepdims=True)
    kl = [sum(p[t, v] * math.log(p[t, v] / q[t, v]) for v in range(11)) for t in range(7)]
    assert r["mean_kl"] == pytest.approx(np.mean(kl), rel=1e-12)
    assert r["max_kl"] == pytest.approx(max(kl), rel=1e-12)
    assert r["ppl_source"] == pytest.approx(math.exp(-np.mean(np.log(p[np.arange(7), targets]))), rel=1e-12)
    assert r["ppl"] == pytest.approx(math.exp(-np.mean(np.log(q[np.arange(7), targets]))), rel=1e-12)
    assert r["top1_agreement"] == np.mean(p.argmax(1) == q.argmax(1))


def test_token_windows_score_each_token_once():
    ids = np.arange(23)
    w = token_windows(ids, 5, 100)
    assert [len(x) for x in w] == [6, 6, 6, 6, 3]
    assert np.concatenate([x[1:] for x in w]).tolist() == list(range(1, 23))
    assert sum(len(x) - 1 for x in token_windows(ids, 5, 12)) == 12
