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
