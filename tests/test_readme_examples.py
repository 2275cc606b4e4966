"""The README's OpenAI-client examples, run as written against the demo's file: `nanoqwen serve` (CPU) on the test
model (tests/test_server_model.py: the embedded tiny-py model in INT4, the file scripts/demo.sh makes) under the
model id the README uses, with only the examples' base URL pointed at the test server's port.

Every Python block of the README that opens `OpenAI(base_url="http://127.0.0.1:8000/v1", ...)` is run; each must
finish without an exception and print something. The tool-call example is also checked against its meaning: one
call whose arguments validate against the tool's schema (jsonschema), equal to what `Engine.chat` answers on the
same file in this process (the oracle; no expected text is hard-coded).
"""
from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest

from test_server_model import running_server

from nanoqwen_rt.demo import DEMO_FILE_NAME
from nanoqwen_rt.serve.adapter import default_model_name
from nanoqwen_rt.tools import parse_tool_calls

jsonschema = pytest.importorskip("jsonschema")

README = Path(__file__).resolve().parent.parent / "README.md"
README_BASE_URL = "http://127.0.0.1:8000/v1"
MODEL = default_model_name(DEMO_FILE_NAME)          # "tiny-py.int4", the id the README's examples name


def _client_blocks() -> list[str]:
    blocks = re.findall(r"^```python\n(.*?)^```", README.read_text(encoding="utf-8"), flags=re.M | re.S)
    return [b for b in blocks if f'OpenAI(base_url="{README_BASE_URL}"' in b]


BLOCKS = _client_blocks()
TOOL_BLOCKS = [b for b in BLOCKS if "tool_choice" in b]


def _block_id(block: str) -> str:
    m = re.search(r"client\.(\w+)\.(?:completions\.)?create", block)
    return f"{BLOCKS.index(block)}-{'tools' if 'tool_choice' in block else m.group(1) if m else 'block'}"


@pytest.fixture(scope="module")
def server(model_path, tmp_path_factory):
    log_path = tmp_path_factory.mktemp("readme-server") / "server.log"
    with running_server(model_path, log_path, "--model-name", MODEL, "--log-level", "warning") as (base, _proc):
        yield base


def _run(block: str, base: str) -> tuple[dict, str]:
    """Execute one README block with its base URL pointed at `base`: (its globals, what it printed)."""
    assert block.count(README_BASE_URL) == 1
    code = block.replace(README_BASE_URL, base + "/v1")
    out = io.StringIO()
    namespace: dict = {"__name__": "readme_example"}
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), namespace)        # noqa: S102 (the project's own README)
    return namespace, out.getvalue()


def test_readme_has_the_examples():
    assert len(BLOCKS) >= 3, "README: expected the server, coding-assistant and tool-call client examples"
    assert len(TOOL_BLOCKS) == 1, "README: expected one tool-call client example"
    for b in BLOCKS:
        assert re.findall(r'model="([^"]+)"', b) and set(re.findall(r'model="([^"]+)"', b)) == {MODEL}


@pytest.mark.parametrize("block", BLOCKS, ids=_block_id)
def test_readme_client_example_runs(server, block):
    _, printed = _run(block, server)
    assert printed.strip(), "the example printed nothing"


def test_readme_tool_call_example_means_what_it_says(server, engine):
    ns, printed = _run(TOOL_BLOCKS[0], server)
    tools, messages, r = ns["tools"], ns["messages"], ns["r"]
    schema = tools[0]["function"]["parameters"]
    assert r.choices[0].finish_reason == "tool_calls"
    (call,) = r.choices[0].message.tool_calls
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, schema)
    # the oracle: the same request through Engine.chat on the same file (greedy), parsed the same way
    ref = "".join(c.text for c in engine.chat(messages, tools, {"type": "function", "function":
                                                                {"name": "get_weather"}},
                                              max_new_tokens=100, temperature=0.0))
    (want,) = parse_tool_calls(ref).tool_calls
    assert (call.function.name, args) == (want["function"]["name"], json.loads(want["function"]["arguments"]))
    # the streamed "required" call printed one line per call: name and arguments
    ref_req = "".join(c.text for c in engine.chat(messages, tools, "required", max_new_tokens=100, temperature=0.0))
    (want_req,) = parse_tool_calls(ref_req).tool_calls
    lines = printed.strip().splitlines()
    assert lines[-1] == f"{want_req['function']['name']} {want_req['function']['arguments']}"
    jsonschema.validate(json.loads(want_req["function"]["arguments"]), schema)
