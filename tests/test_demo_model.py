"""The embedded model without a path: nanoqwen_rt.demo_model_path() and `nanoqwen ... --demo` convert models/tiny-py
(the wheel's copy, else the checkout's) to INT4 into the user's cache once, then reuse it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nanoqwen_rt import demo

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def cache_home(tmp_path_factory):
    """One cache for the module: the first test converts, the others reuse (a conversion takes 8 s or more on 2 cores)."""
    home = tmp_path_factory.mktemp("xdg-cache")
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(home)
    yield home
    if old is None:
        os.environ.pop("XDG_CACHE_HOME")
    else:
        os.environ["XDG_CACHE_HOME"] = old


def test_converts_once_into_the_cache_then_reuses_it(cache_home):
    from nanoqwen_format import open_file
    heard: list[str] = []
    path = demo.demo_model_path(log=heard.append)
    assert path.is_relative_to(cache_home / "nanoqwen") and path.name == "tiny-py.int4.nanoqwen"
    assert len(heard) == 1 and str(path) in heard[0]
    cfg = json.loads((REPO / "models" / "tiny-py" / "config.json").read_text())
    with open_file(path, verify_checksums=True) as f:
        assert f.config.hidden_size == cfg["hidden_size"] and f.config.n_layers == cfg["num_hidden_layers"]
        assert any(t.dtype.name == "INT4G" for t in f.tensors.values())
    mtime = path.stat().st_mtime_ns
    heard.clear()
    assert demo.demo_model_path(log=heard.append) == path
    assert heard == [] and path.stat().st_mtime_ns == mtime     # reused, not converted again
    assert not [p for p in path.parent.iterdir() if p != path]   # no temp file left beside it


def test_the_checkout_source_is_used_when_no_packaged_copy_exists(monkeypatch, tmp_path):
    monkeypatch.setattr(demo, "_PACKAGED", tmp_path / "not-installed")
    assert demo.demo_source_dir() == REPO / "models" / "tiny-py"
    monkeypatch.setattr(demo, "_CHECKOUT", tmp_path / "no-checkout")
    with pytest.raises(demo.DemoModelUnavailable, match="not installed"):
        demo.demo_source_dir()


def test_a_changed_source_gets_its_own_cache_entry(monkeypatch, tmp_path):
    """The cache key covers the source's bytes: a wheel whose model differs must not reuse the other's file."""
    import shutil
    copy = tmp_path / "tiny-py"
    shutil.copytree(REPO / "models" / "tiny-py", copy)
    key = demo._source_key(copy)
    assert key == demo._source_key(REPO / "models" / "tiny-py")
    cfg = json.loads((copy / "generation_config.json").read_text())
    cfg["max_new_tokens"] = cfg.get("max_new_tokens", 0) + 1
    (copy / "generation_config.json").write_text(json.dumps(cfg))
    assert demo._source_key(copy) != key


def test_an_unwritable_cache_is_one_named_error(monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    with pytest.raises(demo.DemoModelUnavailable, match="cannot write the embedded model") as e:
        demo.demo_model_path()
    assert "\n" not in str(e.value)


def _cli(*args, env_extra=None, timeout=300):
    env = dict(os.environ, PYTHONPATH=str(REPO), **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "nanoqwen_rt.cli", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, stdin=subprocess.DEVNULL)


def test_cli_runs_the_embedded_model_with_demo(cache_home):
    r = _cli("run", "--demo", "-p", "def fibonacci(n):", "-n", "12", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()                                   # generated text on stdout
    assert "tiny-py.int4.nanoqwen" in r.stderr and "device=cpu" in r.stderr
    r = _cli("info", "--demo", "--json", "--no-verify")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["config"]["hidden_size"] == 256


@pytest.mark.parametrize("args, says", [
    (("run", "-p", "x"), "missing FILE"),
    (("run", "--demo", "model.nanoqwen", "-p", "x"), "not both"),
    (("serve", "--demo", "model.nanoqwen"), "not both"),
])
def test_cli_file_or_demo_errors_are_one_line(args, says):
    r = _cli(*args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], r.stderr
