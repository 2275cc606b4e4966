"""Every Qwen2.5 size's shapes end to end on the GPU against the CPU oracle (issue 15: "the GPU equals the CPU oracle
on greedy tokens for every size"): a random file of each size's widths (hidden, intermediate, heads, KV heads,
head_dim, vocab; bench/make_7b_file.py --shape, INT4 g128, untied f16 lm_head) with two layers, so the 32B shape's
file is ~3.6 GB instead of ~20. Prefill logits, then greedy steps in which both backends take the GPU's token: each
step's logits and argmax must agree (a near tie on the CPU side ends the comparison, as in test_gpu_e2e)."""
from __future__ import annotations

import numpy as np
import pytest

from nanoqwen_format.shapes import QWEN25_SHAPES
from synth import make_7b_file_module, rel_rows  # noqa: E402  (tests/synth.py)

pytestmark = pytest.mark.gpu

LAYERS = 2          # every projection and both norms of a layer, twice; the widths are the size's own
PROMPT = 48         # prompt tokens: three KV pages
STEPS = 16          # greedy steps compared
# as test_gpu_e2e's TOL: f16 activations into every GEMV (2^-12 relative) and f16 partial sums give ~1e-3 on the
# logits after a few layers; a wrong kernel gives O(1)
TOL = 1e-2


@pytest.mark.parametrize("size", list(QWEN25_SHAPES))
def test_size_shaped_greedy_matches_cpu(tmp_path, size):
    from nanoqwen_rt.backends.cpu import CPUBackend
    from nanoqwen_rt.backends.cuda import CudaBackend, available
    if not available():
        pytest.skip("no CUDA device / libnanoqwen not built")
    mk = make_7b_file_module()
    path = str(tmp_path / f"{size}.nanoqwen")
    mk.make_file(path, mk.shape_config(size, LAYERS), quant="int4", group_size=128, seed=17, progress=False)
    ctx = PROMPT + STEPS + 1
    gpu, cpu = CudaBackend(path, max_context=ctx), CPUBackend(path, max_context=ctx, kv_dtype="f16")
    with gpu, cpu:
        ids = np.random.default_rng().integers(0, gpu.config.vocab_rows, size=PROMPT, dtype=np.int32)
        g, c = gpu.prefill(ids), cpu.prefill(ids)
        assert np.isfinite(g).all()
        assert rel_rows(g, c).max() < TOL, f"{size}: prefill logits"
        for step in range(STEPS):
            top2 = np.sort(c)[-2:]
            if top2[1] - top2[0] < 1e-3 * max(1.0, abs(float(top2[1]))):
                break                                   # a near tie f16 rounding may flip: stop comparing
            t = int(np.argmax(g))
            assert t == int(np.argmax(c)), f"{size}: step {step}: gpu {t}, cpu {int(np.argmax(c))}"
            g, c = gpu.decode(t), cpu.decode(t)
            assert rel_rows(g, c).max() < TOL, f"{size}: step {step} logits"
