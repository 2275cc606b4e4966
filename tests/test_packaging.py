"""Packaging facts that a fresh clone or a wheel relies on: the declared license file is there, the test
requirements live in one place, and the README's server example names the model id the demo file is served as."""
from __future__ import annotations

import re
from pathlib import Path

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


def test_wheel_ships_a_built_libnanoqwen(tmp_path):
    """A wheel made after scripts/build_native.sh carries nanoqwen_rt/lib/libnanoqwen.so (it was dropped). Built
    from a copy of the tracked files plus a stand-in library, so the checkout's own lib/ is never touched."""
    import shutil
    import subprocess
    import sys
    import zipfile
    src = tmp_path / "src"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                           text=True, check=True).stdout.split("\n")
    for rel in filter(None, files):
        if (REPO / rel).is_file() and not rel.startswith(("models/", "spec/", "tests/", "bench/", "csrc/")):
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, src / rel)
    (src / "nanoqwen_rt" / "lib").mkdir()
    (src / "nanoqwen_rt" / "lib" / "libnanoqwen.so").write_bytes(b"\x7fELF stand-in")
    out = tmp_path / "wheel"
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(out)], check=True, capture_output=True, timeout=600)
    (whl,) = out.glob("*.whl")
    names = zipfile.ZipFile(whl).namelist()
    assert "nanoqwen_rt/lib/libnanoqwen.so" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)


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


import pytest  # noqa: E402


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
