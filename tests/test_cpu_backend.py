"""CPUBackend details: every stored dtype (f32/f16/bf16/int4 mixed in one file) vs transformers, chunked prefill,
context limits, f16 KV cache, buffer ownership, generate_ids semantics."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from test_cpu_vs_hf import LOGIT_ATOL, VOCAB, _hf_model, _reference_model  # noqa: E402

from nanoqwen_format import DType, NanoqwenWriter, TensorSpec, open_file  # noqa: E402
from nanoqwen_quant.convert import convert_checkpoint  # noqa: E402
from nanoqwen_rt.backends import ContextFull  # noqa: E402
from nanoqwen_rt.backends.cpu import CPUBackend  # noqa: E402
from nanoqwen_rt.sampling import SamplingParams  # noqa: E402

CTX = 40


def _bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 → bf16 bits, round to nearest even (finite inputs)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """(hf dir, int4 file, mixed-dtype file): linear weights cycle int4 → f32 → bf16 → f16, embedding f32,
    lm_head bf16."""
    d = tmp_path_factory.mktemp("cpub")
    m = _hf_model("qwen2", 128, 256, 2, 2, 1, 64, False, 1e6, None, seed=11)
    m.save_pretrained(d / "hf")
    q = convert_checkpoint(d / "hf", d / "q.nanoqwen", quant="int4", group_size=64)
    mixed = d / "mixed.nanoqwen"
    kinds = [DType.INT4G, DType.F32, DType.BF16, DType.F16]
    with open_file(q) as f:
        specs, plan, i = [], [], 0
        for name, t in f.tensors.items():
            if t.dtype == DType.INT4G:
                dt = kinds[i % 4]
                i += 1
            elif name == "model.embed_tokens.weight":
                dt = DType.F32
            elif name == "lm_head.weight":
                dt = DType.BF16
            else:
                dt = t.dtype
            specs.append(TensorSpec(name, dt, t.shape, t.group_size if dt == DType.INT4G else 0))
            plan.append((name, dt))
        assert {dt for _, dt in plan} >= set(kinds)
        with NanoqwenWriter(mixed, f.config, specs, []) as w:
            for name, dt in plan:
                if dt == DType.INT4G:
                    w.write_int4(name, *f.int4(name))
                elif dt == DType.F32:
                    w.write_tensor(name, f.float32(name))
                elif dt == DType.BF16:
                    w.write_tensor(name, _bf16_bits(f.float32(name)))
                else:
                    w.write_tensor(name, f.float32(name).astype(np.float16))
    return d / "hf", q, mixed


def test_mixed_dtypes_match_transformers(files):
    hf_dir, _, mixed = files
    ref = _reference_model(hf_dir, mixed)        # transformers with the file's own (widened) weights
    rng = np.random.default_rng(0)
    seq = rng.integers(0, VOCAB, size=20).astype(np.int32)
    with torch.no_grad():
        full = ref(torch.from_numpy(seq[None].astype(np.int64))).logits[0].numpy()
    with CPUBackend(mixed, max_context=CTX) as be:
        np.testing.assert_allclose(be.logits_all(seq), full, rtol=0, atol=LOGIT_ATOL)
        be.reset()
        steps = [be.prefill(seq[:10])] + [be.decode(int(t)) for t in seq[10:]]
        np.testing.assert_allclose(np.stack(steps), full[9:], rtol=0, atol=LOGIT_ATOL)
        assert "F32" in be.describe() and "BF16" in be.describe() and "INT4G" in be.describe()


def test_chunked_prefill_equals_one_prefill(files):
    _, q, _ = files
    seq = np.random.default_rng(1).integers(0, VOCAB, size=17).astype(np.int32)
    with CPUBackend(q, max_context=CTX) as be:
        whole = be.logits_all(seq)
        be.reset()
        be.prefill(seq[:5])
        be.prefill(seq[5:11])
        last = be.prefill(seq[11:])
        assert be.position == 17
        np.testing.assert_allclose(last, whole[-1], rtol=0, atol=LOGIT_ATOL)


def test_context_limit_leaves_state_unchanged(files):
    _, q, _ = files
    seq = np.random.default_rng(2).integers(0, VOCAB, size=CTX - 1).astype(np.int32)
    with CPUBackend(q, max_context=CTX) as be:
        be.prefill(seq)
        with pytest.raises(ContextFull):
            be.prefill(seq[:2])
        assert be.position == CTX - 1
        be.decode(3)
        assert be.position == CTX
        with pytest.raises(ContextFull):
            be.decode(3)
        with pytest.raises(ValueError):
            CPUBackend(q, max_context=be.config.max_positions + 1)


def test_f16_kv_cache_close_to_f32(files):
    _, q, _ = files
    seq = np.random.default_rng(3).integers(0, VOCAB, size=24).astype(np.int32)
    with CPUBackend(q, max_context=CTX) as a, CPUBackend(q, max_context=CTX, kv_dtype="f16") as b:
        la, lb = a.logits_all(seq), b.logits_all(seq)
    # k/v rounded to f16 (rel. error ≤ 2^-11 = 4.9e-4) perturb the attention output by about that fraction;
    # through 2 layers on logits of magnitude ~5 that is ≲ 5e-3. 2e-2 leaves margin; a wrong cache would be O(1).
    assert np.isfinite(lb).all()
    np.testing.assert_allclose(lb, la, rtol=0, atol=2e-2)
    assert np.abs(lb - la).max() > 0        # it really is a different (rounded) cache


def test_returned_logits_are_owned_by_the_caller(files):
    _, q, _ = files
    with CPUBackend(q, max_context=CTX) as be:
        a = be.prefill(np.array([1, 2, 3], dtype=np.int32))
        keep = a.copy()
        b = be.decode(4)
        assert a is not b and not np.shares_memory(a, b)
        assert np.array_equal(a, keep)


def test_generate_ids_semantics(files):
    _, q, _ = files
    prompt = np.array([5, 6, 7, 8], dtype=np.int32)
    with CPUBackend(q, max_context=CTX) as be:
        greedy = list(be.generate_ids(prompt, SamplingParams(), 10, ()))
        assert len(greedy) == 10
        stop = greedy[4]
        first = greedy.index(stop)
        assert list(be.generate_ids(prompt, SamplingParams(), 10, [stop])) == greedy[:first + 1]
        full = list(be.generate_ids(prompt, SamplingParams(), 1000, ()))
        assert len(full) == CTX - len(prompt)           # prompt + generated never exceed max_context
        assert full[:10] == greedy
        with pytest.raises(ContextFull):                # raised at call time, before iteration
            be.generate_ids(np.arange(CTX, dtype=np.int32) % VOCAB, SamplingParams(), 1, ())
        with pytest.raises(ValueError):
            be.generate_ids(np.array([VOCAB + 1000], dtype=np.int32), SamplingParams(), 1, ())


def test_kv_cache_grows_on_demand_and_results_are_unchanged(files, monkeypatch):
    """The cache starts small (the first token does not page-fault a context-sized cache) and grows by copying;
    the logits across two growths are bit-identical to the same calls on a cache allocated whole up front."""
    import nanoqwen_rt.backends.cpu.backend as cpu_backend
    initial = 16
    monkeypatch.setattr(cpu_backend, "KV_INITIAL_POSITIONS", initial)
    _, q, _ = files
    rng = np.random.default_rng(3)
    ids = rng.integers(0, VOCAB, size=2 * initial + 8).astype(np.int32)
    n0 = initial - 3

    def run(be):
        steps = [be.prefill(ids[:n0])]                      # fits the first allocation
        for t in ids[n0:n0 + 6]:                            # decodes across the first growth
            steps.append(be.decode(int(t)))
        steps.append(be.prefill(ids[n0 + 6:]))              # a prefill across the second growth
        return np.stack(steps)

    with CPUBackend(q) as be:
        assert be.max_context > ids.shape[0] and be.kv_capacity == initial
        ours = run(be)
        assert initial * 2 < be.kv_capacity <= be.max_context
    with CPUBackend(q) as ref:
        ref._reserve(ref.max_context)                        # whole cache up front: no growth
        want = run(ref)
    assert np.isfinite(ours).all()
    np.testing.assert_array_equal(ours, want)
