"""Packaging facts that a fresh clone or a wheel relies on: the declared license file is there, the test
requirements live in one place, and the README's server example names the model id the demo file is served as."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_license_file_is_apache_2_and_declared():
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text                    # the whole text, not a stub
    py = (REPO / "pyproject.toml").read_text()
    assert 'license = "Apache-2.0"' in py and 'license-files = ["LICENSE"]' in py
    assert "classifiers = [" in py


def test_torch_requirement_lives_only_in_pyproject():
    env = (REPO / "scripts" / "_env.sh").read_text()
    assert not re.search(r"torch\s*[=<>~!]=?\s*\d", env), "scripts/_env.sh pins torch itself"
    assert re.search(r'"torch[<>=!~][^"]*"', (REPO / "pyproject.toml").read_text())


def test_readme_server_example_uses_the_demo_file_model_id():
    from nanoqwen_rt.serve.adapter import default_model_name
    demo = (REPO / "scripts" / "demo.sh").read_text()
    demo_file = re.search(r'-o "\$out/([^"]+)"', demo).group(1)
    readme = (REPO / "README.md").read_text()
    server = readme[readme.index("### Server"):]
    server = server[:server.index("\n## ")]
    assert f"nanoqwen serve .out/{demo_file}" in server
    ids = re.findall(r'model="([^"]+)"', server)
    assert ids == [default_model_name(demo_file)]


DEMO_MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                    "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def _build_wheel(tmp_path, path_env: str) -> list[str]:
    """`pip wheel` (no build isolation: scikit-build-core comes from the test extra) of a copy of the files git
    tracks, plus a stale stand-in nanoqwen_rt/lib/libnanoqwen.so that git ignores, so the checkout is never touched;
    PATH is `path_env`. Returns the wheel's file names."""
    import shutil
    import subprocess
    import sys
    import zipfile
    src = tmp_path / "src"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                           text=True, check=True).stdout.split("\n")
    for rel in filter(None, files):
        if (REPO / rel).is_file() and not rel.startswith(("spec/", "tests/", "bench/", "docs/")):
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, src / rel)
    (src / "nanoqwen_rt" / "lib").mkdir()
    (src / "nanoqwen_rt" / "lib" / "libnanoqwen.so").write_bytes(b"\x7fELF stale stand-in")
    out = tmp_path / "wheel"
    env = {k: v for k, v in os.environ.items() if k not in ("CUDACXX", "CUDAARCHS", "CMAKE_ARGS")}
    env["PATH"] = path_env
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(out)], env=env, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-4000:]
    (whl,) = out.glob("*.whl")
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        if "nanoqwen_rt/lib/libnanoqwen.so" in names:
            (tmp_path / "libnanoqwen.so").write_bytes(z.read("nanoqwen_rt/lib/libnanoqwen.so"))
    return names


def _assert_package_files(names: list[str]) -> None:
    for f in DEMO_MODEL_FILES:
        assert f"nanoqwen_rt/demo_model/tiny-py/{f}" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    for f in ("nanoqwen_rt/serve/static/index.html", "nanoqwen_quant/data/eval_heldout.txt",
              "nanoqwen_rt/backends/cuda/abi.py", "nanoqwen_bench/measure.py", "nanoqwen_format/__init__.py"):
        assert f in names


def _path_without_nvcc() -> str:
    import shutil
    keep = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and not os.path.exists(os.path.join(d, "nvcc"))]
    path = os.pathsep.join(keep)
    assert shutil.which("nvcc", path=path) is None
    return path


needs_cmake = pytest.mark.skipif(__import__("shutil").which("cmake") is None,
                                 reason="cmake not on PATH (an isolated pip build would fetch it; this test does not)")


@needs_cmake
def test_wheel_without_nvcc_is_the_cpu_package_with_the_embedded_model(tmp_path):
    names = _build_wheel(tmp_path, _path_without_nvcc())
    _assert_package_files(names)
    # no CUDA compiler: no library, and the stale one the checkout's scripts/build_native.sh left stays out
    assert not [n for n in names if n.endswith(".so")], names


@needs_cmake
@pytest.mark.slow
@pytest.mark.skipif(__import__("shutil").which("nvcc") is None, reason="nvcc not on PATH: the wheel is CPU-only here")
def test_wheel_with_nvcc_builds_libnanoqwen_into_it(tmp_path):
    import subprocess
    names = _build_wheel(tmp_path, os.environ["PATH"])
    _assert_package_files(names)
    assert "nanoqwen_rt/lib/libnanoqwen.so" in names
    lib = tmp_path / "libnanoqwen.so"
    assert lib.stat().st_size > 100_000                       # built by CMakeLists.txt, not the stale stand-in
    nm = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True)
    assert " nq_abi_version" in nm.stdout and " nq_test_" not in nm.stdout


# --- the quick-start scripts build the CUDA library only where it can run (tests and CI: wherever nvcc is) ---------

NO_GPU_ANSWERS = {   # what nvidia-smi -L prints on a machine whose driver is installed but that has no usable GPU
    "no device": ("No devices were found", 6),
    "no driver": ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", 9),
}


def _fake_toolchain(tmp_path, smi: tuple[str, int] | None):
    """A folder to put first on PATH: an nvcc that works, a cmake that records that it was called (and fails, so
    nothing is installed into the checkout), and an nvidia-smi answering `smi` (none when smi is None); plus a
    stand-in virtual environment already marked as installed, so _env.sh goes straight to its build decision."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    marker = tmp_path / "cmake-called"
    tools = {"nvcc": "exit 0", "cmake": f'echo "$@" >> "{marker}"; exit 3'}
    if smi is not None:
        text, rc = smi
        tools["nvidia-smi"] = f"echo '{text}'; exit {rc}"
    for name, body in tools.items():
        (bin_ / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_ / name).chmod(0o755)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\nexit 0\n")
    (venv / "bin" / "python").chmod(0o755)
    (venv / "bin" / "activate").write_text("")
    for mode in ("demo", "test"):
        (venv / f".nanoqwen-installed-{mode}").touch()
    env = {"PATH": f"{bin_}:/usr/bin:/bin", "HOME": str(tmp_path), "NANOQWEN_VENV": str(venv),
           "NANOQWEN_BUILD_DIR": str(tmp_path / "build")}
    return env, marker


def _source_env(mode: str, env: dict):
    import subprocess
    return subprocess.run(["bash", "-c", f'source scripts/_env.sh {mode}; echo "sourced ok"'], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)



@pytest.mark.parametrize("answer", sorted(NO_GPU_ANSWERS))
def test_demo_does_not_build_the_library_with_nvcc_but_no_gpu(tmp_path, answer):
    env, marker = _fake_toolchain(tmp_path, NO_GPU_ANSWERS[answer])
    r = _source_env("demo", env)
    assert r.returncode == 0 and "sourced ok" in r.stdout, r.stderr
    assert not marker.exists(), "the demo ran cmake on a machine with no GPU"
    assert "no NVIDIA GPU here" in r.stderr


def test_demo_builds_the_library_when_a_gpu_is_listed(tmp_path):
    env, marker = _fake_toolchain(tmp_path, ("GPU 0: NVIDIA H200 (UUID: GPU-00000000-0000-0000-0000-000000000000)", 0))
    r = _source_env("demo", env)
    assert marker.exists(), r.stderr                 # the build started (the stand-in cmake then fails it)
    assert r.returncode != 0 and "sourced ok" not in r.stdout


@pytest.mark.parametrize("answer", sorted(NO_GPU_ANSWERS))
def test_tests_still_compile_the_library_without_a_gpu(tmp_path, answer):
    env, marker = _fake_toolchain(tmp_path, NO_GPU_ANSWERS[answer])
    r = _source_env("test", env)
    assert marker.exists(), r.stderr                 # scripts/test.sh (and so CI) keeps its compile check
    assert r.returncode != 0


def test_without_nvidia_smi_a_device_node_decides(tmp_path):
    import glob
    import shutil
    if shutil.which("nvidia-smi", path="/usr/bin:/bin"):
        pytest.skip("nvidia-smi is installed in /usr/bin here, so it cannot be taken off PATH")
    env, marker = _fake_toolchain(tmp_path, None)
    r = _source_env("demo", env)
    assert marker.exists() == bool(glob.glob("/dev/nvidia[0-9]*")), r.stderr


def test_build_native_refuses_an_unknown_argument(tmp_path):
    import subprocess
    env, marker = _fake_toolchain(tmp_path, None)
    r = subprocess.run(["bash", "scripts/build_native.sh", "--gpu"], cwd=REPO, env=env, capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--if-gpu" in r.stderr
    assert not marker.exists()
