"""The model file the CLI and server tests run on, built once per test session, plus a check of that file.

Source, first available:
  1. `NANOQWEN_TEST_MODEL` = a path to an existing .nanoqwen file (to run these tests against another model);
  2. the embedded default model `models/tiny-py/` (HF format), converted to INT4 with `convert_checkpoint`;
  3. a tiny random checkpoint from `tests/synth.py`, converted the same way (before models/tiny-py exists).
The server/CLI tests then compare the server against `Engine.generate` on this same file.
"""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TINY_PY = REPO / "models" / "tiny-py"
#: the quick-start prompt, used by the CLI and server tests
PROMPT = "def fibonacci(n):"
#: upper bound on one wait in those tests (server start incl. numba cache load, one subprocess, one long
#: generation): a hang guard that fails a hung test instead of blocking CI, never a speed requirement
HANG_GUARD_S = 180.0

#: the tool-call tests' tools (test_server, test_server_gpu): one with bounded arguments, one with none
#: (tool_choice "required" may pick either)
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string", "maxLength": 20},
                                          "unit": {"enum": ["celsius", "fahrenheit"]}},
                                          "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "now", "description": "The time",
                                      "parameters": {"type": "object", "properties": {},
                                                     "additionalProperties": False}}},
]
TOOL_MSGS = [{"role": "user", "content": "What is the weather in Paris?"}]
#: max_tokens of those tests: the longest forced call of these tools is ~60 tokens in the demo's vocabulary
TOOL_MAX_TOKENS = 100

_lock = threading.Lock()
_built: dict[str, str] = {}


def stop_server(proc: subprocess.Popen, log) -> None:
    """End a server subprocess started by a test: SIGTERM, then SIGKILL if it has not exited within 15 s; close
    its log file. proc.returncode is set afterwards (the caller may assert a clean shutdown)."""
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(model_path: str, log_path: Path, *args: str):
    """`nanoqwen serve MODEL --host 127.0.0.1 --port FREE --device cpu ARGS...` with its output in `log_path`;
    yields (base URL, process) once /health answers 200; always stopped (stop_server) on exit."""
    import httpx
    port = free_port()
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "nanoqwen_rt.cli", "serve", model_path, "--host", "127.0.0.1", "--port", str(port),
         "--device", "cpu", *args],
        stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + HANG_GUARD_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}:\n{Path(log_path).read_text()}")
            try:
                if httpx.get(base + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not healthy after {HANG_GUARD_S} s:\n{Path(log_path).read_text()}")
            time.sleep(0.2)
        yield base, proc
    finally:
        stop_server(proc, log)


def build_model_file(tmp_dir: Path) -> str:
    """Path of the test model (.nanoqwen), converted into `tmp_dir` on first use; cached for the session."""
    with _lock:
        if "path" in _built:
            return _built["path"]
        env = os.environ.get("NANOQWEN_TEST_MODEL")
        if env:
            _built["path"] = env
            return env
        from nanoqwen_quant.convert import convert_checkpoint
        tmp_dir = Path(tmp_dir)
        src = TINY_PY if (TINY_PY / "config.json").is_file() else _synth_checkpoint(tmp_dir / "synth-src")
        out = tmp_dir / "test-model.int4.nanoqwen"
        convert_checkpoint(src, out, quant="int4")
        _built["path"] = str(out)
        return str(out)


def _synth_checkpoint(path: Path) -> Path:
    from synth import make_checkpoint
    # head_dim 64, K = 128 / 256: every linear takes INT4 group 128; context 1024 like tiny-py.
    return make_checkpoint(path, hidden=128, intermediate=256, n_layers=2, n_heads=2, n_kv_heads=1, vocab=320,
                           tied=True, max_positions=1024, seed=7)


def build_no_fim_model_file(tmp_dir: Path) -> str:
    """A file whose tokenizer has no fill-in-the-middle tokens (tests/synth.py's 320-token BPE): where FIM must be
    refused with a named error. Built into `tmp_dir` on first use; cached for the session."""
    with _lock:
        if "no_fim" not in _built:
            from nanoqwen_quant.convert import convert_checkpoint
            out = Path(tmp_dir) / "no-fim.int4.nanoqwen"
            convert_checkpoint(_synth_checkpoint(Path(tmp_dir) / "no-fim-src"), out, quant="int4")
            _built["no_fim"] = str(out)
        return _built["no_fim"]


def test_model_file_is_usable_for_cli_and_server(tmp_path_factory):
    """The file the CLI/server tests use opens as an Engine with a tokenizer and a chat template."""
    from nanoqwen_rt import Engine
    path = build_model_file(tmp_path_factory.mktemp("model"))
    with Engine(path, device="cpu") as eng:
        assert eng.tokenizer is not None and eng.tokenizer.chat_template is not None
        assert eng.tokenizer.stop_token_ids, "the chat tests rely on the file's eos ids"
        ids = eng.tokenizer.encode("def fibonacci(n):")
        assert len(ids) > 1 and eng.tokenizer.decode(ids) == "def fibonacci(n):"
