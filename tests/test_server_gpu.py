"""The CLI and the server on the CUDA engine (skipped without CUDA): same answers as the in-process
`Engine(device="cuda")` on the same file, through `nanoqwen run --device cuda` and `nanoqwen serve --device cuda`.
Raw HTTP (httpx) only, so the GPU machine needs no openai package; the CPU suite covers the protocol in depth.
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from test_server_model import HANG_GUARD_S, PROMPT, TOOL_MAX_TOKENS, TOOL_MSGS, TOOLS, stop_server

pytestmark = pytest.mark.gpu
httpx = pytest.importorskip("httpx")


@pytest.fixture(scope="module")
def reference(model_path):
    """Greedy text of 32 new tokens from the in-process CUDA engine."""
    from nanoqwen_rt import Engine
    with Engine(model_path, device="cuda") as eng:
        assert eng.device == "cuda"
        return "".join(c.text for c in eng.generate(PROMPT, max_new_tokens=32, temperature=0.0,
                                                     stop_token_ids=[]))


@pytest.fixture(scope="module")
def tool_reference(model_path):
    """The forced tool call (tool_choice "required", greedy) from the in-process CUDA engine: (name, arguments)."""
    from nanoqwen_rt import Engine
    from nanoqwen_rt.tools import parse_tool_calls
    with Engine(model_path, device="cuda") as eng:
        text = "".join(c.text for c in eng.chat(TOOL_MSGS, TOOLS, "required", max_new_tokens=TOOL_MAX_TOKENS,
                                                temperature=0.0))
    (call,) = parse_tool_calls(text).tool_calls
    return call["function"]["name"], call["function"]["arguments"]


def test_cli_run_on_cuda(model_path, reference):
    p = subprocess.run([sys.executable, "-m", "nanoqwen_rt.cli", "run", model_path, "-p", PROMPT, "-n", "32",
                        "--device", "cuda"], capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert p.returncode == 0, p.stderr
    stats = p.stderr.strip().splitlines()[-1]
    assert "device=cuda" in stats and "tokens/s" in stats
    # the file's eos may end the CLI's answer earlier than the reference (which ignores eos): a prefix of it
    assert reference.startswith(p.stdout[:-1]) and p.stdout.endswith("\n")


def test_server_on_cuda(model_path, reference, tool_reference, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path / "server.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "nanoqwen_rt.cli", "serve", model_path, "--port", str(port),
                             "--device", "cuda", "--model-name", "m", "--log-level", "warning"],
                            stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + HANG_GUARD_S
        while True:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()
            try:
                health = httpx.get(base + "/health", timeout=5)
                if health.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "server did not become healthy"
            time.sleep(0.2)
        assert health.json()["device"] == "cuda"
        body = {"model": "m", "prompt": PROMPT, "max_tokens": 32, "temperature": 0, "ignore_eos": True}
        r = httpx.post(base + "/v1/completions", json=body, timeout=HANG_GUARD_S)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == reference
        assert r.json()["usage"]["completion_tokens"] == 32
        text = []
        with httpx.stream("POST", base + "/v1/completions", json={**body, "stream": True},
                          timeout=HANG_GUARD_S) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    text.append(json.loads(line[6:])["choices"][0]["text"])
        assert "".join(text) == reference
        metrics = httpx.get(base + "/metrics", timeout=30).text
        assert "nanoqwen_time_per_output_token_seconds_count" in metrics
        # a forced tool call (the grammar's mask applied on the device) equals the in-process CUDA engine's
        body = {"model": "m", "messages": TOOL_MSGS, "tools": TOOLS, "tool_choice": "required",
                "max_tokens": TOOL_MAX_TOKENS, "temperature": 0}
        r = httpx.post(base + "/v1/chat/completions", json=body, timeout=HANG_GUARD_S)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice
        (call,) = choice["message"]["tool_calls"]
        assert (call["function"]["name"], call["function"]["arguments"]) == tool_reference
    finally:
        stop_server(proc, log)
