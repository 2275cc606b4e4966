"""Tests of the benchmark tooling: bench/make_7b_file.py (random 7B-shaped files), nanoqwen_bench (bytes per
token, table) and, on a GPU, the bandwidth / peer measurements (values checked for sanity, never for speed)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from nanoqwen_format import (BlobKind, DType, ModelConfig, dequantize_int4_reference, expected_tensors,
                             int4_nbytes, open_file)
import nanoqwen_bench.measure as bench
from synth import make_7b_file_module  # noqa: E402  (tests/synth.py)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tiny_cfg(**kw) -> ModelConfig:
    # 7B hyper-parameters with small widths; vocab_rows must hold the real tokenizer's 151665 ids
    d = {**bench.QWEN25_CODER_7B, "n_layers": 2, "hidden_size": 256, "intermediate_size": 512, "n_heads": 2,
         "n_kv_heads": 1, "head_dim": 128, "vocab_rows": 151680}
    d.update(kw)
    return ModelConfig(**d)


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    p = str(tmp_path_factory.mktemp("bench") / "tiny.nanoqwen")
    make_7b_file_module().make_file(p, _tiny_cfg(), quant="int4", group_size=128, seed=7, threads=2, progress=False)
    return p


# -- bytes per token -------------------------------------------------------------------------------------
def _hand_count(cfg: ModelConfig, g: int, context: int) -> int:
    """Per-token bytes counted from the architecture, independently of the file: int4 linears, f16 rest."""
    h, i, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q, kv = cfg.n_heads * hd, cfg.n_kv_heads * hd
    layer = (int4_nbytes(q, h, g) + 2 * int4_nbytes(kv, h, g) + int4_nbytes(h, q, g) + 2 * int4_nbytes(i, h, g)
             + int4_nbytes(h, i, g))
    layer += 2 * (q + 2 * kv) + 2 * 2 * h          # f16 q/k/v biases, two RMSNorm weights
    total = cfg.n_layers * layer + 2 * h            # + final norm
    total += 2 * cfg.vocab_rows * h if cfg.tied_embeddings else 2 * cfg.vocab_rows * h + 2 * h  # lm_head (+ row)
    total += context * cfg.n_layers * 2 * kv * 2    # fp16 K and V of every cached position
    return total


@pytest.mark.parametrize("tied", [False, True])
def test_bytes_per_token_matches_hand_count(tied):
    cfg = _tiny_cfg(tied_embeddings=tied, vocab_rows=1000)
    nbytes = {}
    for name, shape in expected_tensors(cfg).items():
        if name.endswith("_proj.weight"):
            nbytes[name] = int4_nbytes(shape[0], shape[1], 128)
        else:
            nbytes[name] = 2 * int(np.prod(shape))
    got = bench.bytes_per_token(nbytes, cfg, 77)
    assert got["total"] == _hand_count(cfg, 128, 77)
    assert got["total"] == got["weights"] + got["embed_row"] + got["kv"]


def test_bytes_per_token_of_the_real_7b_shape():
    # Qwen2.5-7B int4 g128 + fp16 lm_head: 6.53e9 linear params at 0.5 B + 1/64 B, lm_head 1.09 GB
    cfg = ModelConfig(**bench.QWEN25_CODER_7B)
    nbytes = {n: (int4_nbytes(*s, 128) if n.endswith("_proj.weight") else 2 * int(np.prod(s)))
              for n, s in expected_tensors(cfg).items()}
    b = bench.bytes_per_token(nbytes, cfg, 0)
    assert b["total"] == _hand_count(cfg, 128, 0)
    assert 4.40e9 < b["total"] < 4.50e9    # 3.365 GB linears + 1.090 GB lm_head + ~1 MB small tensors


def test_mean_decode_context_is_the_brute_force_mean():
    for p, n in [(512, 128), (1, 1), (7, 3)]:
        brute = np.mean([p + t for t in range(1, n + 1)])   # token t attends to p + t positions
        assert bench.mean_decode_context(p, n) == pytest.approx(brute, abs=0)


def test_bytes_per_token_rejects_a_file_without_embeddings():
    with pytest.raises(bench.BenchError, match="embed_tokens"):
        bench.bytes_per_token({"lm_head.weight": 10}, _tiny_cfg(), 1)


def test_run_bench_missing_file_is_a_named_error(tmp_path):
    with pytest.raises(bench.BenchError, match="no such file"):
        bench.run_bench(tmp_path / "absent.nanoqwen", peers=False)


def test_format_table_shows_the_numbers():
    res = {"gpu": "G", "date_utc": "d", "commit": "c",
           "bandwidth": {"copy_GBps": 4321.0, "read_GBps": 4567.0, "read_sum_f32_GBps": 4500.0,
                         "read_amax_f16_GBps": 4467.0, "read_probe": "nq_bench_read_bandwidth (lib.so)"},
           "peers": {"torch_int4": {"median_ms": 2.671, "GBps": 1300.0, "bytes": 3.5e9, "n_gemv": 197},
                     "int4_check_rel_err": 3e-3}}
    t = bench.format_table(res)
    for s in ("4321 GB/s", "4567 GB/s", "probe: nq_bench_read_bandwidth (lib.so)", "2.671 ms", "197 GEMVs",
              "3.00e-03"):
        assert s in t


def test_read_ceiling_names_why_the_library_probe_is_not_used(monkeypatch, tmp_path):
    monkeypatch.setenv("NANOQWEN_TESTING_LIB", str(tmp_path / "absent.so"))
    assert bench.library_read_bandwidth(1 << 20, 1) == (None, f"testing library not found at {tmp_path / 'absent.so'}")
    junk = tmp_path / "junk.so"
    junk.write_bytes(b"not a shared object")
    monkeypatch.setenv("NANOQWEN_TESTING_LIB", str(junk))
    gbps, why = bench.library_read_bandwidth(1 << 20, 1)
    assert gbps is None and why.startswith(f"cannot load {junk}: ")


def test_read_ceiling_names_a_library_without_the_probe(monkeypatch):
    """A real shared object without nq_bench_read_bandwidth (the C library of this process)."""
    import ctypes.util
    libc = ctypes.util.find_library("c")
    path = next((p for p in ("/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib64/libc.so.6", "/lib64/libc.so.6")
                 if os.path.isfile(p)), None)
    if libc is None or path is None:
        pytest.skip("no libc.so.6 at a known path")
    monkeypatch.setenv("NANOQWEN_TESTING_LIB", path)
    assert bench.library_read_bandwidth(1 << 20, 1) == (None, f"{path} has no nq_bench_read_bandwidth")


# -- the random 7B-shaped file ----------------------------------------------------------------------------
def test_tiny_file_structure(tiny_file):
    cfg = _tiny_cfg()
    with open_file(tiny_file, verify_checksums=True) as f:
        assert f.config == cfg.canonical()
        assert list(f.tensors) == list(expected_tensors(cfg))
        for name, info in f.tensors.items():
            want = DType.INT4G if name.endswith("_proj.weight") else DType.F16
            assert info.dtype == want, name
            if want == DType.INT4G:
                assert info.group_size == 128
        assert f.blob_json(BlobKind.GENERATION_CONFIG)["eos_token_id"] == [151645, 151643]
        assert f.blob_json(BlobKind.PROVENANCE)["synthetic"] is True


def test_tiny_file_is_deterministic_across_thread_counts(tiny_file, tmp_path):
    p = str(tmp_path / "again.nanoqwen")
    make_7b_file_module().make_file(p, _tiny_cfg(), quant="int4", group_size=128, seed=7, threads=1, progress=False)
    with open_file(tiny_file) as a, open_file(p) as b:
        assert {n: t.crc32c for n, t in a.tensors.items()} == {n: t.crc32c for n, t in b.tensors.items()}
    p2 = str(tmp_path / "other_seed.nanoqwen")
    make_7b_file_module().make_file(p2, _tiny_cfg(), quant="int4", group_size=128, seed=8, threads=2, progress=False)
    with open_file(tiny_file) as a, open_file(p2) as b:
        assert a.tensors["lm_head.weight"].crc32c != b.tensors["lm_head.weight"].crc32c


def test_weight_statistics_keep_activations_unit_scale(tiny_file):
    rng = np.random.default_rng(0)
    with open_file(tiny_file) as f:
        cfg = f.config
        for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight",
                     "model.layers.1.mlp.gate_proj.weight"):
            q, s = f.int4(name)
            w = dequantize_int4_reference(np.asarray(q), np.asarray(s), 128)         # (N, K) f32
            x = rng.standard_normal((w.shape[1], 256))                                 # unit-variance inputs
            var = float((w @ x).var())
            # N*256 outputs: the sample variance is within a few % of its mean; the per-group scale jitter
            # and the finite row count add a few more. 0.8..1.25 catches any wrong base scale (x sqrt(2) or more).
            assert 0.8 < var < 1.25, (name, var)
            u = (np.asarray(q)[:, :, None] >> (4 * np.arange(8, dtype=np.uint32))) & 0xF   # every nibble
            counts = np.bincount(u.ravel(), minlength=16) / u.size
            want = np.bincount([8 + c for c in make_7b_file_module().INT4_CODE_SLOTS], minlength=16) / 16
            # >= 65536 codes: each frequency within ~0.002 (1 sigma) of its probability
            assert np.all(np.abs(counts - want) < 0.01), counts
            # no common mode: the rows' mean weight, seen through a normalised all-ones input, is 0 up to
            # sampling noise (sigma = 1/sqrt(K*N)); codes uniform on 0..15 (mean q = -0.5) put it at -0.5/sqrt(21.5) = -0.11
            ones = np.full(w.shape[1], w.shape[1] ** -0.5)
            common = float((w @ ones).mean())
            assert abs(common) < 5 / np.sqrt(w.shape[0] * w.shape[1]), (name, common)
        e = f.float32("model.embed_tokens.weight")
        assert abs(e.std() - 1.0) < 0.01 and abs(e.mean()) < 0.01
        lm = f.float32("lm_head.weight")
        assert abs(lm.std() * np.sqrt(cfg.hidden_size) - make_7b_file_module().LOGIT_STD) < 0.05
        nw = f.float32("model.norm.weight")
        assert abs(nw.mean() - 1.0) < 0.05 and np.all(nw > 0)


def test_bad_arguments_exit_with_one_line(tmp_path, capsys):
    mk = make_7b_file_module()
    assert mk.main([str(tmp_path / "x.nanoqwen"), "--layers", "0", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--layers" in err[0]
    assert not os.path.exists(tmp_path / "x.nanoqwen")


# -- tokenizer: the built tokenizer.json vs a slow, obvious byte-level BPE -------------------------------
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable char map (as in the original encoder.py)."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


class _SlowQwen2BPE:
    """Reference encoder: split on added tokens, NFC, Qwen2 regex, byte map, lowest-rank merge first."""

    def __init__(self, assets: str, added: list[str]):
        import regex
        self.vocab = json.load(open(os.path.join(assets, "vocab.json"), encoding="utf-8"))
        lines = open(os.path.join(assets, "merges.txt"), encoding="utf-8").read().split("\n")
        merges = [tuple(ln.split(" ")) for ln in lines[1:] if ln]
        self.ranks = {m: r for r, m in enumerate(merges)}
        self.pat = regex.compile(make_7b_file_module().QWEN2_SPLIT_REGEX)
        self.added = {t: 151643 + i for i, t in enumerate(added)}
        self.split = regex.compile("(" + "|".join(regex.escape(t) for t in sorted(added, key=len, reverse=True)) + ")")
        self.b2u = _bytes_to_unicode()

    def _bpe(self, word: str) -> list[str]:
        parts = list(word)
        while len(parts) > 1:
            best = min(zip(parts, parts[1:]), key=lambda pair: self.ranks.get(pair, float("inf")))
            if best not in self.ranks:
                break
            out, i = [], 0
            while i < len(parts):          # merge every occurrence of the best pair, left to right
                if i + 1 < len(parts) and (parts[i], parts[i + 1]) == best:
                    out.append(parts[i] + parts[i + 1])
                    i += 2
                else:
                    out.append(parts[i])
                    i += 1
            parts = out
        return parts

    def encode(self, text: str) -> list[int]:
        import unicodedata
        ids = []
        for piece in self.split.split(text):
            if not piece:
                continue
            if piece in self.added:
                ids.append(self.added[piece])
                continue
            for m in self.pat.findall(unicodedata.normalize("NFC", piece)):
                word = "".join(self.b2u[b] for b in m.encode("utf-8"))
                ids.extend(self.vocab[t] for t in self._bpe(word))
        return ids


SAMPLES = [
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "Héllo wörld — 你好，世界! 12345 I'm  spaced\t\ttabs\r\n\n  trailing   ",
    "<|im_start|>user\nwrite <tool_call> code<|im_end|>\n<|fim_prefix|>x = 1<|fim_suffix|>",
    "ﬁ café ＡＢＣ 😀 e\u0301 ÅNGSTRÖM 'S 'll don't",
]


def test_tokenizer_matches_the_slow_reference():
    from tokenizers import Tokenizer
    mk = make_7b_file_module()
    tok = Tokenizer.from_str(mk.build_qwen2_tokenizer_json())
    ref = _SlowQwen2BPE(mk.ASSETS, [t for t, _ in mk.QWEN25_ADDED_TOKENS])
    assert tok.get_vocab_size(with_added_tokens=True) == 151665
    for s in SAMPLES:
        ids = tok.encode(s, add_special_tokens=False).ids
        assert ids == ref.encode(s), s
        assert tok.decode(ids, skip_special_tokens=False) == __import__("unicodedata").normalize("NFC", s)


def test_chat_template_renders_chatml(tiny_file):
    from nanoqwen_rt.tokenizer import Tokenizer
    with open_file(tiny_file) as f:
        t = Tokenizer.from_file(f)
    got = t.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    want = ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert got == want
    assert 151645 in t.stop_token_ids


# -- GPU (sanity of the measurements; no speed thresholds) ----------------------------------------------
@pytest.mark.gpu
def test_gpu_bandwidth_and_peers_are_sane():
    bw = bench.measure_bandwidth(nbytes=1 << 30, reps=5)
    assert bw["copy_GBps"] > 0 and bw["read_GBps"] > 0
    # the probe is named; the testing library's stream, when used, reads at least what torch's reductions read
    # (they leave bandwidth unused); 0.9 allows run-to-run noise between the two measurements
    assert bw["read_probe"]
    if "read_library_GBps" in bw:
        assert bw["read_library_GBps"] > 0.9 * max(bw["read_sum_f32_GBps"], bw["read_amax_f16_GBps"])
    import nanoqwen_bench.peers as bench_peers
    assert bench_peers.check_int4_peer() < bench_peers.INT4_CHECK_RTOL
    assert bench_peers.check_fp16_peer() < bench_peers.FP16_CHECK_RTOL
    import types
    cfg = types.SimpleNamespace(**{**bench.QWEN25_CODER_7B, "n_layers": 1})
    res = bench_peers.run_peers(cfg, reps=3, prompt_tokens=64)
    for k in ("torch_int4", "torch_int4_f16_lm_head", "cublas_fp16"):
        assert res[k]["median_ms"] > 0 and res[k]["n_gemv"] == 8
    pre = res["cublas_bf16_prefill"]       # the prefill GEMMs of one layer: 7 of them, no lm_head
    assert pre["n_gemv"] == 7 and pre["prompt_tokens"] == 64 and pre["median_ms"] > 0 and pre["TFLOPs"] > 0
    assert "cuBLAS bf16 prefill GEMMs (64 tokens)" in bench.format_table({"peers": res})


def test_measure_engine_on_the_cpu_backend(tiny_file):
    """The decode/TTFT/load measurement end to end on the CPU backend (the CUDA one is measured on the GPU)."""
    r = bench.measure_engine(tiny_file, prompt_tokens=8, new_tokens=3, repeats=2, device="cpu")
    assert r["deterministic"] is True and len(r["ms_per_token_all"]) == 2
    assert r["ttft_ms"] > 0 and r["ms_per_token"] > 0 and r["load_s"] > 0
    assert r["mean_context"] == 8 + (3 + 1) / 2
    assert r["bytes_per_token"]["total"] == _hand_count(_tiny_cfg(), 128, 0) + \
        round(r["mean_context"] * _tiny_cfg().n_layers * 2 * 128 * 2)
    table = bench.format_table({"engine": r})
    assert "TTFT (8-token prompt)" in table and "decode (3 greedy tokens)" in table


def test_fp16_variant_has_unit_scale_linears(tmp_path):
    p = str(tmp_path / "f16.nanoqwen")
    cfg = _tiny_cfg(n_layers=1)
    make_7b_file_module().make_file(p, cfg, quant="none", seed=3, threads=2, progress=False)
    with open_file(p) as f:
        assert all(t.dtype == DType.F16 for t in f.tensors.values())
        w = f.float32("model.layers.0.mlp.up_proj.weight")                    # (N, K)
        # N(0, 1/K) weights, N*K = 131072 samples: K*var(w) is 1 within ~0.4% (1 sigma); the mean's sigma is
        # 1/16/sqrt(131072) = 1.7e-4
        assert abs(w.var() * w.shape[1] - 1.0) < 0.03 and abs(w.mean()) < 1e-3


def test_int4_asym_variant_holds_the_layout_1_weights(tiny_file, tmp_path):
    """--quant int4-asym: every linear weight in int4g layout 2 with zero points 7..9 (all three present, none
    outside), dequantising bit for bit to the layout-1 file of the same seed (the layout-2 timing runs the same
    model)."""
    from nanoqwen_format.constants import LAYOUT_INT4_ROWMAJOR_K8_ASYM
    p = str(tmp_path / "asym.nanoqwen")
    make_7b_file_module().make_file(p, _tiny_cfg(), quant="int4-asym", group_size=128, seed=7, threads=2, progress=False)
    with open_file(tiny_file) as a, open_file(p, verify_checksums=True) as b:
        assert list(a.tensors) == list(b.tensors)
        seen = set()
        for name, info in b.tensors.items():
            if not name.endswith("_proj.weight"):
                assert info.crc32c == a.tensors[name].crc32c, name
                continue
            assert info.layout_id == LAYOUT_INT4_ROWMAJOR_K8_ASYM and info.group_size == 128, name
            _, s, z = b.int4_asym(name)
            assert np.array_equal(s, a.int4(name)[1]), name
            seen |= set(np.unique(z).tolist())
            assert np.array_equal(b.float32(name).view(np.uint32), a.float32(name).view(np.uint32)), name
        assert seen == {7, 8, 9}


def test_concurrency_scaling_and_knee():
    """scaling_of: each step's decode tok/s gain against proportional scaling, and the knee at the first step
    below KNEE_SCALING (session 9's 7B figures: no knee up to 64 streams)."""
    from nanoqwen_bench.concurrency import KNEE_SCALING, scaling_of
    lv = lambda c, t: {"concurrency": c, "decode_tokens_per_s": t}  # noqa: E731
    s9 = scaling_of([lv(8, 2016.0), lv(1, 489.0), lv(64, 10334.0), lv(32, 6037.0)])
    assert [(st["from"], st["to"]) for st in s9["steps"]] == [(1, 8), (8, 32), (32, 64)]
    assert [round(st["scaling"], 3) for st in s9["steps"]] == [0.515, 0.749, 0.856]
    assert s9["knee"] is None
    # the aggregate stops growing from 32: that step scales 1/4, the knee
    flat = scaling_of([lv(1, 100.0), lv(8, 700.0), lv(32, 800.0), lv(64, 820.0)])
    assert flat["steps"][1]["scaling"] == pytest.approx(800 / 700 / 4) and flat["knee"] == 32
    assert flat["steps"][1]["scaling"] < KNEE_SCALING <= flat["steps"][0]["scaling"]
    # levels without a steady decode figure are left out; one point has no step
    assert scaling_of([lv(1, 100.0), {"concurrency": 8}]) == {"steps": [], "knee": None}


def test_concurrency_table_flags_levels_without_a_steady_window():
    """A level whose decode figure comes from fewer than MIN_STEADY_STEPS steps with every stream decoding is
    named under the table (session 10: 64 streams of 512-token prompts and 128 new tokens had 1-7 such steps); the
    steady column shows the count for every level."""
    from nanoqwen_bench.concurrency import MIN_STEADY_STEPS, format_concurrency_table

    def level(n, steady):
        return {"concurrency": n, "tokens_per_s": 1.0, "decode_tokens_per_s": 100.0 * n, "decode_step_ms": 5.0,
                "steady_steps": steady, "itl_p50_ms": 5.0, "itl_p90_ms": 6.0, "itl_p50_worst_ms": 7.0,
                "ttft_p50_ms": 10.0, "ttft_p90_ms": 20.0, "batch_min": 1, "batch_median": n, "batch_max": n,
                "consumer_ms_per_step": 0.1}
    res = {"concurrency": {"backend": "fake", "prompt_tokens": 512, "new_tokens": 128,
                           "levels": [level(8, 90), level(32, MIN_STEADY_STEPS), level(64, 1)]}}
    text = format_concurrency_table(res)
    assert "steady" in text.splitlines()[3]
    flagged = [ln for ln in text.splitlines() if ln.startswith("not a steady rate")]
    assert len(flagged) == 1 and "64 streams (1)" in flagged[0]
    assert "32 streams" not in flagged[0] and "8 streams" not in flagged[0]
