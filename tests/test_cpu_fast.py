"""The CPU backend's fast numerics (numerics="fast", what Engine serves with) against the float32 oracle: each kernel
within the bound its rounding allows, on fresh random inputs; the embedded model's logits close to the oracle's
(KL, top-1) on held-out text; the Engine's choice of numerics."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from synth import pack_int4_layout1  # noqa: E402  (tests/synth.py)

from nanoqwen_rt.backends.cpu.fast_kernels import (HI, LO, Q8_MAX, Q16_MAX, TOKEN_PAD, _gemv_i8_parallel,
                                                   _gemv_i8_serial, _gemv_int4_q16_parallel, _gemv_int4_q16_serial,
                                                   gemm_int4_q16_multi, gemv_i8, gemv_int4_q16_multi, lm_head_group,
                                                   quantize_rows_i8, quantize_x16, quantize_x16_int4,
                                                   quantize_x16_tokens)
from nanoqwen_rt.backends.cpu.kernels import PERM, matmul_int4_reference, zeros_or_symmetric

REPO = Path(__file__).resolve().parents[1]

# The kernels' outputs are float32 sums of per-group products (one f32 multiply-add per group, int32 exact
# inside a group): their own rounding is ~G * eps32 relative to sum |w x|; 1e-5 of it (and 1e-6 absolute, for
# rows whose sum cancels) leaves a margin of >10x over G <= 64 groups. The rounding of the activations (and of the
# lm_head weights) is bounded separately, per test, from the steps.
FLOAT32_SLACK_REL, FLOAT32_SLACK_ABS = 1e-5, 1e-6
# Codes are rint(x * (1/step)) in float32: the product's relative error (<= 2 eps32 = 2^-22) is up to
# 2^-22 * 32767 = 0.008 of a step at the largest int16 codes, so a value within 0.008 steps of a rounding boundary may
# round the other way: |x - code * step| <= (0.5 + CODE_ROUNDING_SLACK) * step, with ~25 % margin.
CODE_ROUNDING_SLACK = 1e-2


def _fresh_rng():
    seed = np.random.SeedSequence().entropy
    return np.random.default_rng(seed), seed




def _x(rng, K):
    """Activations with the spread of real ones: mostly unit scale, a few outliers 30x larger."""
    x = rng.standard_normal(K).astype(np.float32)
    x[rng.integers(0, K, size=max(1, K // 64))] *= 30
    return x


def test_byte_order_constants_match_layout_1():
    """LO / HI (the k of byte m's low / high nibble) follow from PERM: byte b of word j holds nibbles 2b, 2b+1."""
    assert list(LO) == [PERM[2 * b] for b in range(4)] and list(HI) == [PERM[2 * b + 1] for b in range(4)]


@pytest.mark.parametrize("K,g", [(256, 32), (512, 64), (896, 128), (1024, 256)])
def test_quantize_x16_int4_round_trip(K, g):
    rng, seed = _fresh_rng()
    x = _x(rng, K)
    xlo, xhi = np.full(K // 2, 77, np.int16), np.full(K // 2, 77, np.int16)
    xsum, xstep = np.full(K // g, 7, np.int32), np.full(K // g, np.nan, np.float32)
    quantize_x16_int4(x, g, xlo, xhi, xsum, xstep)
    m = np.arange(K // 2)
    q = np.empty(K, np.int64)
    q[8 * (m // 4) + LO[m % 4]] = xlo
    q[8 * (m // 4) + HI[m % 4]] = xhi
    step = np.repeat(xstep.astype(np.float64), g)
    absmax = np.abs(x.reshape(-1, g)).max(axis=1)
    np.testing.assert_allclose(xstep, absmax / Q16_MAX, rtol=1e-6, err_msg=f"seed {seed}")
    assert np.abs(q).max() <= Q16_MAX
    # round to nearest: within half a step (plus the f32 rounding of x * (1/step))
    assert (np.abs(x - q * step) <= step * (0.5 + CODE_ROUNDING_SLACK)).all(), f"seed {seed}"
    assert np.array_equal(xsum, q.reshape(-1, g).sum(axis=1)), f"seed {seed}"


def _int4_bound(w: np.ndarray, x: np.ndarray, xstep: np.ndarray, g: int) -> np.ndarray:
    """Largest |fast - exact| per row: each activation moves by <= half a step (+ the code rounding slack), each
    weight is exact, plus the f32 slack of the sums."""
    aw = np.abs(w)
    act = (aw.reshape(w.shape[0], -1, g).sum(axis=2) * (xstep.astype(np.float64) * (0.5 + CODE_ROUNDING_SLACK))
           ).sum(axis=1)
    return act + FLOAT32_SLACK_REL * (aw @ np.abs(x).astype(np.float64)) + FLOAT32_SLACK_ABS


INT4_IMPLS = ("serial", "parallel", "wrapper")
#: int4g layouts: 1 (zero point 8, zeros=None) and 2 (a zero point per group: the odd-numbered weights of a call get
#: random ones, so a call mixes the layouts as a file may)
LAYOUTS = (1, 2)


def _zero_points(rng, layout, Ns, K, g):
    """Per weight: None (layout 1) or uint8 (N, K/g) random zero points, read-only as the file's mmap'd ones."""
    if layout == 1:
        return [None] * len(Ns)
    out = []
    for i, N in enumerate(Ns):
        z = None
        if i % 2 == 0:
            z = rng.integers(0, 16, size=(N, K // g), dtype=np.uint8)
            z.setflags(write=False)
        out.append(z)
    return out


def _dense(u, s, z, g):
    """The float64 weights of codes u, f16 scales s, zero points z (None: 8)."""
    zf = 8 if z is None else np.repeat(z.astype(np.float64), g, axis=1)
    return np.repeat(s.astype(np.float64), g, axis=1) * (u.astype(np.float64) - zf)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("impl", INT4_IMPLS)
@pytest.mark.parametrize("Ns,K,g", [((48,), 256, 32), ((130, 17), 512, 64), ((896, 128, 128), 896, 128),
                                     ((70,), 1024, 256), ((4864, 4864), 896, 128)])
def test_gemv_int4_q16_within_rounding_bound(impl, Ns, K, g, layout):
    rng, seed = _fresh_rng()
    us = [rng.integers(0, 16, size=(N, K), dtype=np.uint8) for N in Ns]
    scales = [(rng.random((N, K // g)) * 0.02 + 0.001).astype(np.float16) for N in Ns]
    zs = _zero_points(rng, layout, Ns, K, g)
    qws = [pack_int4_layout1(u) for u in us]
    x = _x(rng, K)
    outs = [np.full(N, np.nan, np.float32) for N in Ns]
    qbs = tuple(q.view(np.uint8) for q in qws)
    sbs = tuple(s.view(np.uint16) for s in scales)
    if impl == "wrapper":
        gemv_int4_q16_multi(x, qbs, sbs, g, outs, None if layout == 1 else zs)
    else:
        xlo, xhi = np.empty(K // 2, np.int16), np.empty(K // 2, np.int16)
        xsum, xstep = np.empty(K // g, np.int32), np.empty(K // g, np.float32)
        quantize_x16_int4(x, g, xlo, xhi, xsum, xstep)
        fn = _gemv_int4_q16_serial if impl == "serial" else _gemv_int4_q16_parallel
        fn(xlo, xhi, xsum, xstep, qbs, sbs, tuple(zeros_or_symmetric(z, q, g) for q, z in zip(qbs, zs)), g,
           tuple(outs))
    xstep = np.abs(x.reshape(-1, g)).max(axis=1) / Q16_MAX
    for u, qw, s, z, out in zip(us, qws, scales, zs, outs):
        exact = matmul_int4_reference(x[None], qw, s, g, z)[0]
        w = _dense(u, s, z, g)
        err = np.abs(out - exact)
        bound = _int4_bound(w, x, xstep, g)
        assert np.isfinite(out).all() and (err <= bound).all(), \
            f"seed {seed}: worst err/bound {(err / bound).max():.3f}"
        # the rounding is there (not a float32 path in disguise) and far inside the bound
        assert err.max() > 0 and np.median(err / bound) < 0.5, f"seed {seed}"


# -- the prompt's integer GEMM ------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("Ns,K,g,T", [((48,), 256, 32, 1), ((130, 17), 512, 64, 5), ((896, 128, 128), 896, 128, 33),
                                       ((70, 9), 1024, 256, 47), ((300,), 4864, 128, 2), ((64, 200), 384, 32, 64)])
def test_gemm_int4_q16_within_rounding_bound_and_equal_to_the_gemv(Ns, K, g, T, layout):
    """Every token of a prompt within the same rounding bound as the GEMV, against a float64 reference; and, since
    the GEMM rounds each token as the GEMV does and sums its groups in the GEMV's float order, bitwise equal to the
    GEMV run on that token alone (a prompt token and a decode token at one position get the same products)."""
    rng, seed = _fresh_rng()
    us = [rng.integers(0, 16, size=(N, K), dtype=np.uint8) for N in Ns]
    scales = [(rng.random((N, K // g)) * 0.02 + 0.001).astype(np.float16) for N in Ns]
    qws = [pack_int4_layout1(u) for u in us]
    zs = _zero_points(rng, layout, Ns, K, g)
    zarg = None if layout == 1 else zs
    x = np.stack([_x(rng, K) for _ in range(T)])
    x[T // 2] *= 1e-3                                            # tokens of very different scales in one call
    qbs = [q.view(np.uint8) for q in qws]
    sbs = [s.view(np.uint16) for s in scales]
    outs = [np.full((T, N), np.nan, np.float32) for N in Ns]      # poisoned: every element must be written
    gemm_int4_q16_multi(x, qbs, sbs, g, outs, zarg)
    for u, qw, s, z, out in zip(us, qws, scales, zs, outs):
        exact = matmul_int4_reference(x, qw, s, g, z)
        w = _dense(u, s, z, g)
        for t in range(T):
            xstep = np.abs(x[t].reshape(-1, g)).max(axis=1) / Q16_MAX
            err = np.abs(out[t] - exact[t])
            bound = _int4_bound(w, x[t], xstep, g)
            assert np.isfinite(out[t]).all() and (err <= bound).all(), \
                f"seed {seed}, token {t}: worst err/bound {(err / bound).max():.3f}"
    for t in range(T):
        one = [np.full(N, np.nan, np.float32) for N in Ns]
        gemv_int4_q16_multi(np.ascontiguousarray(x[t]), qbs, sbs, g, one, zarg)
        for out, o in zip(outs, one):
            assert np.array_equal(out[t], o), f"seed {seed}, token {t}"


def test_quantize_x16_tokens_layout():
    """Token t's codes sit at xq[t // TOKEN_PAD, m, t % TOKEN_PAD] = (xlo[m], xhi[m]) as quantize_x16_int4 makes
    them; the padding tokens stay zero (the caller's zeros), so they add nothing."""
    rng, seed = _fresh_rng()
    T, K, g = 37, 512, 64
    Tp = -(-T // TOKEN_PAD) * TOKEN_PAD
    x = np.stack([_x(rng, K) for _ in range(T)])
    xq = np.zeros((Tp // TOKEN_PAD, K // 2, TOKEN_PAD, 2), np.int16)
    xsum, xstep = np.zeros((K // g, Tp), np.int32), np.zeros((K // g, Tp), np.float32)
    quantize_x16_tokens(x, g, xq, xsum, xstep)
    for t in range(T):
        xlo, xhi = np.empty(K // 2, np.int16), np.empty(K // 2, np.int16)
        s, st = np.empty(K // g, np.int32), np.empty(K // g, np.float32)
        quantize_x16_int4(x[t], g, xlo, xhi, s, st)
        blk = xq[t // TOKEN_PAD, :, t % TOKEN_PAD]
        assert np.array_equal(blk[:, 0], xlo) and np.array_equal(blk[:, 1], xhi), f"seed {seed}, token {t}"
        assert np.array_equal(xsum[:, t], s) and np.array_equal(xstep[:, t], st), f"seed {seed}, token {t}"
    for t in range(T, Tp):
        assert not xq[t // TOKEN_PAD, :, t % TOKEN_PAD].any()
    assert not xsum[:, T:].any() and not xstep[:, T:].any()


def test_gemm_non_finite_token_poisons_its_outputs_only():
    rng, seed = _fresh_rng()
    T, K, g, N = 9, 256, 64, 40
    qw = pack_int4_layout1(rng.integers(0, 16, size=(N, K), dtype=np.uint8))
    sc = (rng.random((N, K // g)) * 0.02 + 0.001).astype(np.float16).view(np.uint16)
    for bad in (np.nan, np.inf, -np.inf):
        x = np.stack([_x(rng, K) for _ in range(T)])
        x[4, 70] = bad                                              # token 4, group 1
        out = np.zeros((T, N), np.float32)
        gemm_int4_q16_multi(x, (qw.view(np.uint8),), (sc,), g, (out,))
        assert np.isnan(out[4]).all(), f"seed {seed}"
        assert np.isfinite(np.delete(out, 4, axis=0)).all(), f"seed {seed}"


@pytest.mark.parametrize("impl", ("serial", "parallel", "wrapper"))
@pytest.mark.parametrize("kind", ("f16", "bf16", "f32"))
@pytest.mark.parametrize("N,K", [(50, 256), (300, 96), (4000, 896)])
def test_int8_lm_head_within_rounding_bound(impl, kind, N, K):
    rng, seed = _fresh_rng()
    g = lm_head_group(K)
    wf = (rng.standard_normal((N, K)) * 0.05).astype(np.float32)
    wf[rng.integers(0, N, 5), rng.integers(0, K, 5)] *= 20                   # outlier weights
    if kind == "f16":
        src, code = wf.astype(np.float16).view(np.uint16), 0
        w = wf.astype(np.float16).astype(np.float64)
    elif kind == "bf16":
        src, code = (wf.view(np.uint32) >> 16).astype(np.uint16), 1
        w = (src.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    else:
        src, code, w = wf, 2, wf.astype(np.float64)
    q, steps = quantize_rows_i8(src, code, g)
    wstep = np.repeat(steps.astype(np.float64), g, axis=1)
    assert np.abs(q.astype(np.int64)).max() <= Q8_MAX
    assert (np.abs(w - q * wstep) <= wstep * (0.5 + CODE_ROUNDING_SLACK)).all(), f"seed {seed}"
    x = _x(rng, K)
    out = np.full(N, np.nan, np.float32)
    if impl == "wrapper":
        gemv_i8(x, q, steps, g, out)
    else:
        xq, xstep = np.empty(K, np.int16), np.empty(K // g, np.float32)
        quantize_x16(x, g, xq, xstep)
        (_gemv_i8_serial if impl == "serial" else _gemv_i8_parallel)(q, steps, g, xq, xstep, out)
    xs = np.repeat(np.abs(x.reshape(-1, g)).max(axis=1).astype(np.float64) / Q16_MAX, g)
    exact = w @ x.astype(np.float64)
    ax = np.abs(x).astype(np.float64)
    half = 0.5 + CODE_ROUNDING_SLACK
    bound = (np.abs(w) @ (xs * half) + (wstep * half) @ ax + (wstep @ xs) * half * half
             + FLOAT32_SLACK_REL * (np.abs(w) @ ax) + FLOAT32_SLACK_ABS)
    err = np.abs(out - exact)
    assert (err <= bound).all(), f"seed {seed}: worst err/bound {(err / bound).max():.3f}"


def test_non_finite_input_poisons_the_outputs():
    rng, seed = _fresh_rng()
    K, g = 256, 64
    qw = pack_int4_layout1(rng.integers(0, 16, size=(40, K), dtype=np.uint8))
    sc = (rng.random((40, K // g)) * 0.02 + 0.001).astype(np.float16).view(np.uint16)
    for bad in (np.nan, np.inf):
        x = _x(rng, K)
        x[70] = bad                                             # group 1
        out = np.zeros(40, np.float32)
        gemv_int4_q16_multi(x, (qw.view(np.uint8),), (sc,), g, (out,))
        assert np.isnan(out).all(), f"seed {seed}"
        q, st = quantize_rows_i8(rng.standard_normal((30, K)).astype(np.float32), 2, g)
        o8 = np.zeros(30, np.float32)
        gemv_i8(x, q, st, g, o8)
        assert np.isnan(o8).all(), f"seed {seed}"
    # a non-finite lm_head weight poisons its own row's logit, and only that one
    w = rng.standard_normal((30, K)).astype(np.float32)
    w[4, 9] = np.nan
    q, st = quantize_rows_i8(w, 2, g)
    o8 = np.zeros(30, np.float32)
    gemv_i8(_x(rng, K), q, st, g, o8)
    assert np.isnan(o8[4]) and np.isfinite(np.delete(o8, 4)).all(), f"seed {seed}"


def test_lm_head_group_choice():
    assert lm_head_group(896) == 128 and lm_head_group(96) == 32 and lm_head_group(64) == 64
    assert lm_head_group(100) is None


# -- the whole model: the embedded model (models/tiny-py, converted to INT4 as the demo does) -----------------
# Measured on 511 positions of nanoqwen_quant/data/eval_heldout.txt (bench/NOTES.md): mean KL(oracle || fast)
# 8e-5 nats, top-1 agreement 98.8 %, perplexity equal to 4 digits. Most of it is the int8 lm_head (steps of
# absmax/127 per 128 weights); the int16 activations alone move the logits ~100x less. The limits leave ~10x on KL
# and allow 3 % of the argmax to flip between near-tied logits.
FAST_KL_MEAN_MAX = 1e-3
FAST_TOP1_MIN = 0.97
# the fast numerics must not cost perplexity: within 0.5 % of the oracle's on the same text
FAST_PPL_REL_MAX = 5e-3
EVAL_TOKENS = 512
# The fast numerics' prompt logits against its own token-by-token logits: measured mean KL 9e-9 vs 8e-5 against the
# oracle (the attention's summation order moves an activation by ~1e-7 relative, which changes only a code that sat
# on a rounding boundary); at most 1/100 of the distance to the oracle leaves a 100x margin.
FAST_PROMPT_DECODE_KL_RATIO = 1e-2


@pytest.fixture(scope="module")
def tiny_int4(tmp_path_factory):
    from nanoqwen_quant.convert import convert_checkpoint
    return convert_checkpoint(REPO / "models" / "tiny-py", tmp_path_factory.mktemp("fast") / "tiny.int4.nanoqwen")


@pytest.fixture(scope="module")
def tiny_awq(tmp_path_factory):
    """The embedded model packed as an AWQ checkpoint (tests/quant_sources.py) and converted: every linear in int4
    layout 2, with the source's zero points."""
    from nanoqwen_format import LAYOUT_INT4_ROWMAJOR_K8_ASYM, DType, open_file
    from nanoqwen_quant.convert import convert_checkpoint
    from quant_sources import make_quantized
    d = tmp_path_factory.mktemp("fast-awq")
    make_quantized(REPO / "models" / "tiny-py", d / "awq", "awq")
    out = convert_checkpoint(d / "awq", d / "tiny.awq.nanoqwen")
    with open_file(out) as f:
        assert {t.layout_id for t in f.tensors.values() if t.dtype == DType.INT4G} == {LAYOUT_INT4_ROWMAJOR_K8_ASYM}
    return out


def _log_softmax(a):
    a = a.astype(np.float64)
    a = a - a.max(axis=-1, keepdims=True)
    return a - np.log(np.exp(a).sum(axis=-1, keepdims=True))


def _decode_logits(be, ids):
    """Logits after every position, computed token by token (prefill of 1, then decode): the fast path's products."""
    be.reset()
    out = [be.prefill(ids[:1])]
    out += [be.decode(int(t)) for t in ids[1:]]
    return np.array(out)


@pytest.mark.parametrize("layout", ["layout1", "awq-layout2"])
def test_embedded_model_fast_vs_oracle(request, layout):
    """The same limits for layout 1 (the demo's conversion) and layout 2 (an AWQ packing of the same model, converted
    exactly): the zero points enter the fast paths' integer sums, not their rounding."""
    from nanoqwen_rt import Engine
    from nanoqwen_rt.backends.cpu import CPUBackend
    path = request.getfixturevalue("tiny_int4" if layout == "layout1" else "tiny_awq")
    text = (REPO / "nanoqwen_quant" / "data" / "eval_heldout.txt").read_text()
    with Engine(path, device="cpu") as eng:
        ids = np.array(eng.tokenizer.encode(text)[:EVAL_TOKENS], dtype=np.int32)
    with CPUBackend(path, numerics="oracle") as o, CPUBackend(path, numerics="fast") as f:
        assert "fast numerics" in f.describe() and "lm_head int8" in f.describe()
        lo, lf = o.logits_all(ids), _decode_logits(f, ids)
        # the fast backend's many-token path (a prompt: the integer GEMM, the same rounding as its decode)
        lfa = f.logits_all(ids)
    po, pf = _log_softmax(lo[:-1]), _log_softmax(lf[:-1])
    kl = (np.exp(po) * (po - pf)).sum(axis=-1)
    top1 = (lo.argmax(-1) == lf.argmax(-1)).mean()
    nll_o = -po[np.arange(len(ids) - 1), ids[1:]].mean()
    nll_f = -pf[np.arange(len(ids) - 1), ids[1:]].mean()
    assert kl.mean() <= FAST_KL_MEAN_MAX and top1 >= FAST_TOP1_MIN, (kl.mean(), top1)
    assert abs(np.exp(nll_f - nll_o) - 1) <= FAST_PPL_REL_MAX, (nll_o, nll_f)
    assert kl.mean() > 0                                             # the fast path really ran
    pfa = _log_softmax(lfa[:-1])
    kla = (np.exp(po) * (po - pfa)).sum(axis=-1)
    top1a = (lo.argmax(-1) == lfa.argmax(-1)).mean()
    assert kla.mean() <= FAST_KL_MEAN_MAX and top1a >= FAST_TOP1_MIN, (kla.mean(), top1a)
    assert kla.mean() > 0                                            # the prompt's integer path really ran
    # prompt and decode of the fast numerics: the same products per token (bitwise, tests above); only the
    # attention's float32 summation order differs, so they agree far more closely than either with the oracle
    kl_pd = (np.exp(pf) * (pf - pfa)).sum(axis=-1)
    assert kl_pd.mean() <= FAST_PROMPT_DECODE_KL_RATIO * kla.mean(), (kl_pd.mean(), kla.mean())


def test_engine_serves_fast_and_takes_oracle_on_request(tiny_int4):
    from nanoqwen_rt import Engine
    from nanoqwen_rt.engine import InvalidArgument
    with Engine(tiny_int4, device="cpu") as eng:
        assert eng.backend.numerics == "fast"
        fast_text = "".join(c.text for c in eng.generate("def fibonacci(n):", max_new_tokens=24))
    with Engine(tiny_int4, device="cpu", cpu_numerics="oracle") as eng:
        assert eng.backend.numerics == "oracle"
        oracle_text = "".join(c.text for c in eng.generate("def fibonacci(n):", max_new_tokens=24))
    assert fast_text.strip() and oracle_text.strip()
    with pytest.raises(InvalidArgument, match="cpu_numerics"):
        Engine(tiny_int4, device="cpu", cpu_numerics="int8")


def test_backend_rejects_unknown_numerics(tiny_int4):
    from nanoqwen_rt.backends.cpu import CPUBackend
    with pytest.raises(ValueError, match="numerics"):
        CPUBackend(tiny_int4, numerics="quick")
    with CPUBackend(tiny_int4) as be:
        assert be.numerics == "oracle"                            # direct users (tests, verify) get the oracle
