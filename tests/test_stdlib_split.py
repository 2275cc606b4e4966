"""One train / held-out rule for the stdlib: the embedded model's training script, the --mode gptq calibration text
and the evaluation text all use nanoqwen_quant.stdlib_split."""
import hashlib
import importlib.util
import json
import platform
from pathlib import Path

import pytest

from nanoqwen_quant import calibrate, stdlib_split
from nanoqwen_quant.stdlib_split import is_heldout, list_stdlib_files, read_text, stdlib_root

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "models" / "tiny-py"


def _train_module():
    pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location("train_tiny_py_split", ROOT / "models" / "train_tiny_py.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_training_and_calibration_use_the_one_split():
    train = _train_module()
    for name in ("is_heldout", "list_stdlib_files", "read_text", "stdlib_root"):
        assert getattr(train, name) is getattr(stdlib_split, name), name
    assert calibrate.is_heldout is stdlib_split.is_heldout
    assert calibrate.list_stdlib_files is stdlib_split.list_stdlib_files


def test_rule_is_sha256_prefix_mod_10000():
    rels = [f"pkg{i}/m{i}.py" for i in range(400)]
    for rel in rels:            # written out independently of path_hash
        h = int.from_bytes(hashlib.sha256(rel.encode()).digest()[:8], "little")
        assert is_heldout(rel) == (h % 10000 < 500)
    share = sum(map(is_heldout, rels)) / len(rels)
    assert 0.01 < share < 0.12                    # about 5 %


def test_rule_reproduces_the_embedded_models_heldout_list():
    info = json.loads((TINY / "training_info.json").read_text())
    if platform.python_version() != info["python_version"]:
        pytest.skip(f"the list was made on Python {info['python_version']}; this is {platform.python_version()}")
    root = stdlib_root()
    held = [r for r in list_stdlib_files(root) if is_heldout(r) and (t := read_text(root, r)) and t.strip()]
    assert held == (TINY / "heldout_files.txt").read_text(encoding="utf-8").splitlines()


def test_calibration_text_is_training_side_only():
    root = stdlib_root()
    text = calibrate.default_calibration_text()
    held = [t for r in list_stdlib_files(root) if is_heldout(r) and (t := read_text(root, r)) and len(t) > 500]
    assert held and len(text) >= 400_000
    assert not any(t in text for t in held)        # whole held-out files never enter the calibration text
