"""The real server: `python -m nanoqwen_rt.cli serve` in a subprocess on a free 127.0.0.1 port, CPU backend, the
test model (tests/test_server_model.py), driven by the official `openai` client; the 4xx cases with raw HTTP.

Expected texts are never hard-coded: every answer is compared with `Engine.generate` / `Engine.chat` on the same
file in this process (same CPU backend, same sampler, so greedy and seeded outputs must match exactly).
Waits are bounded by HANG_GUARD_S (a hung server fails the test instead of blocking CI); no test asserts speed.
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

from test_server_model import (HANG_GUARD_S, PROMPT, TOOL_MAX_TOKENS, TOOL_MSGS, TOOLS, free_port as _free_port,
                               running_server, stop_server)

MODEL = "test-model"
KEY = "test-key-123"
QUEUE_SIZE = 2


@pytest.fixture(scope="module")
def server(model_path, tmp_path_factory):
    """Base URL of a running server; the process is always terminated by the finalizer."""
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    # --max-batch 1: one request generates at a time, so the queue and 429 tests below control what waits;
    # continuous batching has its own server in tests/test_server_batch.py
    with running_server(model_path, log_path, "--queue-size", str(QUEUE_SIZE), "--max-batch", "1", "--api-key", KEY,
                        "--model-name", MODEL, "--log-level", "warning") as (base, proc):
        yield base
    assert proc.returncode in (0, -15), log_path.read_text()       # clean shutdown on SIGTERM


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key=KEY, max_retries=0, timeout=HANG_GUARD_S)


def _ref(engine, prompt=None, messages=None, **kw):
    """(text, completion tokens, finish_reason) from the in-process Engine: the oracle for the server."""
    it = engine.chat(messages, **kw) if messages is not None else engine.generate(prompt, **kw)
    chunks = list(it)
    return "".join(c.text for c in chunks), sum(len(c.token_ids) for c in chunks), chunks[-1].finish_reason


def _metric(server, name) -> float:
    text = httpx.get(server + "/metrics", timeout=30).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


# ------------------------------------------------------------------ openai client: happy paths


def test_models_and_health(client, server, engine):
    assert [m.id for m in client.models.list().data] == [MODEL]
    h = httpx.get(server + "/health", timeout=30).json()
    assert h["status"] == "ok" and h["device"] == "cpu" and h["queue_size"] == QUEUE_SIZE


def test_greedy_completion_equals_engine(client, engine):
    text, n_tok, finish = _ref(engine, PROMPT, max_new_tokens=24, temperature=0.0)
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0)
    assert r.choices[0].text == text
    assert r.choices[0].finish_reason == finish
    assert r.usage.prompt_tokens == len(engine.tokenizer.encode(PROMPT))
    assert r.usage.completion_tokens == n_tok
    assert r.usage.total_tokens == r.usage.prompt_tokens + n_tok


def test_fim_completion_equals_engine(client, engine):
    """`suffix` on /v1/completions (the README's fill-in-the-middle example against the demo's file) equals
    Engine.fim on the same file, text and finish reason. (A file without FIM tokens: test_api_features.)"""
    pre, suf = "class Point:\n    def __init__(self, x, y):\n        ", "\n        self.y = y\n"
    chunks = list(engine.fim(pre, suf, max_new_tokens=24, stop=["\n"]))
    r = client.completions.create(model=MODEL, prompt=pre, suffix=suf, stop="\n", max_tokens=24, temperature=0)
    assert r.choices[0].text == "".join(c.text for c in chunks)
    assert r.choices[0].finish_reason == chunks[-1].finish_reason
    assert r.usage.completion_tokens == engine.stats.completion_tokens


def test_token_id_prompt_equals_engine(client, engine):
    ids = engine.tokenizer.encode(PROMPT)
    text, n_tok, _ = _ref(engine, ids, max_new_tokens=12, temperature=0.0)
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=12, temperature=0)
    assert r.choices[0].text == text
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == n_tok


def test_streaming_completion_equals_engine(client, engine):
    text, n_tok, finish = _ref(engine, PROMPT, max_new_tokens=24, temperature=0.0)
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == finish
    assert chunks[-1].usage.completion_tokens == n_tok
    assert chunks[-1].usage.prompt_tokens == len(engine.tokenizer.encode(PROMPT))


def test_chat_greedy_equals_engine_chat(client, engine):
    msgs = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "sort a list"}]
    text, n_tok, finish = _ref(engine, messages=msgs, max_new_tokens=20, temperature=0.0)
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=20, temperature=0)
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == text
    assert r.choices[0].finish_reason == finish
    rendered = engine.tokenizer.apply_chat_template(msgs, add_generation_prompt=True)
    assert r.usage.prompt_tokens == len(engine.tokenizer.encode(rendered))
    assert r.usage.completion_tokens == n_tok

    chunks = list(client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=20, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == finish
    assert chunks[-1].usage.completion_tokens == n_tok


def test_stop_sequences(client, engine):
    full, _, _ = _ref(engine, PROMPT, max_new_tokens=32, temperature=0.0, stop_token_ids=[])
    assert len(full) >= 8, f"the reference text is too short to cut: {full!r}"
    stop = full[len(full) // 2: len(full) // 2 + 2]
    expected = full[:full.find(stop)]
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=32, temperature=0, stop=[stop],
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].text == expected
    assert r.choices[0].finish_reason == "stop"
    streamed = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=32, temperature=0, stop=stop,
                                              stream=True, extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in streamed) == expected
    assert streamed[-1].choices[0].finish_reason == "stop"


def test_max_tokens_and_usage(client, engine):
    for n in (1, 5):
        r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=n, temperature=0,
                                      extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == n
        assert r.choices[0].finish_reason == "length"
        assert r.choices[0].text == _ref(engine, PROMPT, max_new_tokens=n, temperature=0.0, stop_token_ids=[])[0]


def test_seeded_sampling_equals_engine(client, engine):
    kw = dict(temperature=0.9, top_p=0.8)
    text, _, _ = _ref(engine, PROMPT, max_new_tokens=16, seed=1234, stop_token_ids=[], **kw)
    answers = [client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, seed=1234,
                                         extra_body={"ignore_eos": True, "top_k": 0}, **kw).choices[0].text
               for _ in range(2)]
    assert answers == [text, text]


# ------------------------------------------------------------------ tool calls on the demo's file

def _ref_tool_call(engine, choice, **kw) -> tuple[dict, str]:
    """The oracle: Engine.chat on the same file, parsed; (its one call, the raw answer)."""
    from nanoqwen_rt.tools import parse_tool_calls
    text = "".join(c.text for c in engine.chat(TOOL_MSGS, TOOLS, choice, max_new_tokens=TOOL_MAX_TOKENS, **kw))
    parsed = parse_tool_calls(text)
    assert len(parsed.tool_calls) == 1 and not parsed.errors and parsed.content == "", text   # the grammar's form
    return parsed.tool_calls[0], text


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}},
                                    {"type": "function", "function": {"name": "now"}}], ids=["required", "named",
                                                                                             "named-no-args"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_forced_tool_call_equals_engine(client, engine, choice, temperature):
    """A forced tool_choice on the demo's file (a tokenizer without <tool_call> tokens and a template without a
    tools section): one call, its arguments valid against the tool's schema, equal to Engine.chat's, streamed and
    not."""
    jsonschema = pytest.importorskip("jsonschema")
    kw = dict(temperature=temperature, seed=5)
    want, _ = _ref_tool_call(engine, choice, **kw)
    r = client.chat.completions.create(model=MODEL, messages=TOOL_MSGS, tools=TOOLS, tool_choice=choice,
                                       max_tokens=TOOL_MAX_TOKENS, **kw)
    assert r.choices[0].finish_reason == "tool_calls"
    assert r.choices[0].message.content is None
    (call,) = r.choices[0].message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    if isinstance(choice, dict):
        assert call.function.name == choice["function"]["name"]
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
    assert (call.function.name, call.function.arguments) == (want["function"]["name"],
                                                             want["function"]["arguments"])
    # the tools are not in the prompt (the template has no tools section): the grammar carried them
    rendered = engine.tokenizer.apply_chat_template(TOOL_MSGS, add_generation_prompt=True)
    if not engine.tokenizer.renders_tools:
        assert r.usage.prompt_tokens == len(engine.tokenizer.encode(rendered))

    chunks = list(client.chat.completions.create(model=MODEL, messages=TOOL_MSGS, tools=TOOLS, tool_choice=choice,
                                                 max_tokens=TOOL_MAX_TOKENS, stream=True, **kw))
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert [(d.index, d.function.name, d.function.arguments) for d in deltas] == \
        [(0, call.function.name, call.function.arguments)]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ""
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_cut_tool_call_is_reported_not_a_crash(client, engine):
    """A forced call that max_tokens cuts is malformed JSON: a 200 whose content is the text as generated,
    finish_reason "length" and the reason in tool_call_errors, streamed and not; the server goes on serving."""
    choice = "required"
    _, full = _ref_tool_call(engine, choice, temperature=0.0)
    cut = "".join(c.text for c in engine.chat(TOOL_MSGS, TOOLS, choice, max_new_tokens=12, temperature=0.0))
    assert full.startswith(cut) and len(cut) < len(full)
    r = client.chat.completions.with_raw_response.create(model=MODEL, messages=TOOL_MSGS, tools=TOOLS,
                                                         tool_choice=choice, max_tokens=12, temperature=0)
    body = json.loads(r.text)["choices"][0]
    assert r.status_code == 200 and body["finish_reason"] == "length"
    assert body["message"]["content"] == cut and "tool_calls" not in body["message"]
    assert len(body["tool_call_errors"]) == 1 and "not valid JSON" in body["tool_call_errors"][0]
    chunks = list(client.chat.completions.create(model=MODEL, messages=TOOL_MSGS, tools=TOOLS, tool_choice=choice,
                                                 max_tokens=12, temperature=0, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == cut
    last = chunks[-1].choices[0]
    assert last.finish_reason == "length" and len(last.model_extra["tool_call_errors"]) == 1
    assert not any(c.choices[0].delta.tool_calls for c in chunks if c.choices)
    r = client.chat.completions.create(model=MODEL, messages=TOOL_MSGS, max_tokens=4, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length")


def test_forced_tool_call_with_a_schema_the_grammar_refuses_is_400(server):
    bad = [{"type": "function", "function": {"name": "f", "parameters": {"type": "no-such-type"}}}]
    r = _post(server, "/v1/chat/completions", {"model": MODEL, "messages": TOOL_MSGS, "tools": bad,
                                               "tool_choice": "required"})
    _assert_error(r, 400, "invalid_value")
    assert r.json()["error"]["param"] == "tool_choice" and "no-such-type" in r.json()["error"]["message"]
    assert "\n" not in r.json()["error"]["message"]


def test_auto_tools_on_a_template_without_tools_section(server, client, engine):
    """tool_choice "auto" (also the default with tools) needs the template to show the model the tools; the demo's
    template cannot, so it is a 400 naming why. "none" is a plain chat."""
    if engine.tokenizer.renders_tools:
        pytest.skip("this test model's chat template has a tools section (NANOQWEN_TEST_MODEL)")
    for extra in ({}, {"tool_choice": "auto"}):
        r = _post(server, "/v1/chat/completions", {"model": MODEL, "messages": TOOL_MSGS, "tools": TOOLS, **extra})
        _assert_error(r, 400, "tools_unsupported")
        assert r.json()["error"]["param"] == "tool_choice" and "tools section" in r.json()["error"]["message"]
    text, n_tok, finish = _ref(engine, messages=TOOL_MSGS, max_new_tokens=8, temperature=0.0)
    r = client.chat.completions.create(model=MODEL, messages=TOOL_MSGS, tools=TOOLS, tool_choice="none",
                                       max_tokens=8, temperature=0)
    assert (r.choices[0].message.content, r.choices[0].finish_reason) == (text, finish)
    assert r.choices[0].message.tool_calls is None


# ------------------------------------------------------------------ raw HTTP: 4xx


def _post(server, path, body=None, *, raw=None, key=KEY):
    headers = {"content-type": "application/json"}
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    content = raw if raw is not None else json.dumps(body).encode()
    return httpx.post(server + path, content=content, headers=headers, timeout=HANG_GUARD_S)


def _assert_error(r, status, code):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["code"] == code, err


def test_4xx_cases(server, engine):
    ctx = engine.max_context
    cases = [
        ("/v1/completions", None, b"{not json", 400, "invalid_json"),
        ("/v1/chat/completions", None, b'{"model": "test-model", "messages": [', 400, "invalid_json"),
        ("/v1/completions", {"model": "gpt-4", "prompt": "x"}, None, 404, "model_not_found"),
        ("/v1/chat/completions", {"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]}, None, 404,
         "model_not_found"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "temperature": -1}, None, 400, "invalid_value"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "top_p": 2}, None, 400, "invalid_value"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 0}, None, 400, "invalid_value"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": "ten"}, None, 400, "invalid_type"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "n": 30}, None, 400, "invalid_value"),
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 2}, None, 400,
         "unsupported_value"),
        ("/v1/chat/completions", {"model": MODEL, "messages": "hi"}, None, 400, "invalid_type"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": ctx}, None, 400,
         "context_length_exceeded"),
        ("/v1/completions", {"model": MODEL, "prompt": "x " * (2 * ctx)}, None, 400, "context_length_exceeded"),
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "y " * (2 * ctx)}]},
         None, 400, "context_length_exceeded"),
    ]
    for path, body, raw, status, code in cases:
        _assert_error(_post(server, path, body, raw=raw), status, code)
    _assert_error(_post(server, "/v1/completions", {"model": MODEL, "prompt": "x"}, key=None), 401,
                  "invalid_api_key")
    _assert_error(_post(server, "/v1/completions", {"model": MODEL, "prompt": "x"}, key="wrong"), 401,
                  "invalid_api_key")
    assert httpx.get(server + "/health", timeout=30).status_code == 200          # still up
    assert _metric(server, "nanoqwen_requests_running") == 0                     # nothing reached the engine


def test_openai_client_raises_typed_errors(client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x")
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="x", temperature=5)
    assert e.value.body["code"] == "invalid_value"
    bad = openai.OpenAI(base_url=client.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


# ------------------------------------------------------------------ queue, disconnect


def _start_blocker(server, engine):
    """A streaming request that generates until the context is full (eos ignored): it occupies the engine for
    the whole test unless cancelled. Returns (client, response, line iterator, token budget) after its first
    token arrived. The caller keeps the iterator alive: a garbage-collected httpx line iterator closes the stream,
    which the server rightly treats as a disconnect."""
    n_prompt = len(engine.tokenizer.encode(PROMPT))
    budget = engine.max_context - n_prompt
    http = httpx.Client(timeout=HANG_GUARD_S)
    req = http.build_request("POST", server + "/v1/completions", headers={"authorization": f"Bearer {KEY}"},
                             json={"model": MODEL, "prompt": PROMPT, "max_tokens": budget, "temperature": 0,
                                   "stream": True, "ignore_eos": True})
    resp = http.send(req, stream=True)
    assert resp.status_code == 200
    lines = resp.iter_lines()
    for line in lines:
        if line.startswith("data: ") and json.loads(line[6:])["choices"][0]["text"]:
            break
    return http, resp, lines, budget


def _wait_for(cond, what):
    deadline = time.monotonic() + HANG_GUARD_S
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what() if callable(what) else what}")
        time.sleep(0.05)


def test_disconnect_mid_stream_frees_engine(server, client, engine):
    cancelled0 = _metric(server, "nanoqwen_generations_cancelled_total")
    tokens0 = _metric(server, "nanoqwen_completion_tokens_total")
    http, resp, lines, budget = _start_blocker(server, engine)
    resp.close()                              # the client goes away mid-stream
    http.close()
    _wait_for(lambda: _metric(server, "nanoqwen_generations_cancelled_total") == cancelled0 + 1,
              "the server to cancel the abandoned generation")
    _wait_for(lambda: _metric(server, "nanoqwen_requests_running") == 0, "the engine to be free")
    # it stopped early: far fewer tokens than the request's budget were generated
    assert _metric(server, "nanoqwen_completion_tokens_total") - tokens0 < budget
    # and the next request is served normally
    text, _, _ = _ref(engine, PROMPT, max_new_tokens=8, temperature=0.0)
    assert client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0).choices[0].text == text


def test_disconnect_non_streaming_cancels_generation(server, client, engine):
    """A non-streaming client that hangs up while its answer generates: the generation stops early too."""
    cancelled0 = _metric(server, "nanoqwen_generations_cancelled_total")
    tokens0 = _metric(server, "nanoqwen_completion_tokens_total")
    budget = engine.max_context - len(engine.tokenizer.encode(PROMPT))
    body = json.dumps({"model": MODEL, "prompt": PROMPT, "max_tokens": budget, "temperature": 0,
                       "ignore_eos": True}).encode()
    host, port = server.rsplit("/", 1)[1].split(":")
    sock = socket.create_connection((host, int(port)), timeout=HANG_GUARD_S)
    sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n".encode()
                 + f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    _wait_for(lambda: _metric(server, "nanoqwen_requests_running") == 1, "the generation to start")
    sock.close()
    _wait_for(lambda: _metric(server, "nanoqwen_generations_cancelled_total") == cancelled0 + 1,
              "the server to cancel the abandoned generation")
    _wait_for(lambda: _metric(server, "nanoqwen_requests_running") == 0, "the engine to be free")
    assert _metric(server, "nanoqwen_completion_tokens_total") - tokens0 < budget
    assert 'nanoqwen_requests_total{endpoint="/v1/completions",status="499"}' in \
        httpx.get(server + "/metrics", timeout=30).text


def test_burst_larger_than_queue(server, client, engine):
    """While one request generates, 2 + QUEUE_SIZE more arrive: QUEUE_SIZE wait and complete, the rest get 429."""
    burst = QUEUE_SIZE + 3
    expected, _, _ = _ref(engine, PROMPT, max_new_tokens=6, temperature=0.0)
    http, resp, lines, _ = _start_blocker(server, engine)
    results: list = [None] * burst

    def call(i):
        try:
            results[i] = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0)
        except openai.RateLimitError as e:
            results[i] = e

    threads = [threading.Thread(target=call, args=(i,)) for i in range(burst)]
    for t in threads:
        t.start()
    rejected = lambda: sum(isinstance(r, openai.RateLimitError) for r in results)     # noqa: E731
    depth = lambda: httpx.get(server + "/health", timeout=30).json()["queue_depth"]    # noqa: E731
    _wait_for(lambda: rejected() + depth() == burst,
              lambda: f"every burst request to be queued or refused: {results}, queue depth {depth()}")
    resp.close()                               # release the engine: the queued requests run now
    http.close()
    for t in threads:
        t.join(HANG_GUARD_S)
    assert not any(t.is_alive() for t in threads)
    ok = [r for r in results if not isinstance(r, openai.RateLimitError)]
    assert len(ok) == QUEUE_SIZE and rejected() == burst - QUEUE_SIZE
    assert all(r.choices[0].text == expected for r in ok)
    err = next(r for r in results if isinstance(r, openai.RateLimitError))
    assert err.status_code == 429 and err.response.headers["retry-after"].isdigit()
    assert err.body["code"] == "queue_full"
    # the server stays up and serves the next request
    assert client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0).choices[0].text \
        == expected


# A near-limit prompt used to hold the event loop 11-15 s while it was tokenized; refused by its length it takes
# a JSON parse. Generous for a loaded 2-core CI machine, far below the old stall.
NEAR_LIMIT_REFUSAL_S = 5.0


def test_near_limit_prompt_is_a_fast_400_and_health_answers_meanwhile(server):
    from nanoqwen_rt.serve.app import MAX_BODY_BYTES
    prompt = "def f(x):\n    return x\n" * ((MAX_BODY_BYTES - 4096) // 26)     # 26 bytes each as JSON
    result = {}

    def post():
        t0 = time.monotonic()
        r = httpx.post(server + "/v1/completions", headers={"Authorization": f"Bearer {KEY}"},
                       json={"model": MODEL, "prompt": prompt, "max_tokens": 1}, timeout=HANG_GUARD_S)
        result["status"], result["s"], result["body"] = r.status_code, time.monotonic() - t0, r.json()

    t = threading.Thread(target=post)
    t.start()
    health = []
    while t.is_alive():
        t0 = time.monotonic()
        health.append((httpx.get(server + "/health", timeout=HANG_GUARD_S).status_code, time.monotonic() - t0))
        time.sleep(0.05)
    t.join()
    assert result["status"] == 400 and result["body"]["error"]["code"] == "context_length_exceeded"
    assert result["s"] < NEAR_LIMIT_REFUSAL_S, result
    assert health and all(code == 200 and s < NEAR_LIMIT_REFUSAL_S for code, s in health), health


def test_slow_clients_time_out_and_open_bind_warns(model_path, tmp_path):
    """--read-timeout bounds a request's headers and then its body; listening on 0.0.0.0 without --api-key warns
    (one line). The connections below would otherwise stay open for ever."""
    port = _free_port()
    log_path = tmp_path / "server.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "nanoqwen_rt.cli", "serve", model_path, "--host", "0.0.0.0", "--port", str(port),
         "--device", "cpu", "--read-timeout", "1", "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + HANG_GUARD_S
        while True:
            assert proc.poll() is None, log_path.read_text()
            try:
                if httpx.get(base + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.2)
        warnings = [l for l in log_path.read_text().splitlines() if "without --api-key" in l]
        assert len(warnings) == 1 and "0.0.0.0" in warnings[0]

        def closed_within(sock, seconds):
            sock.settimeout(seconds)
            got = b""
            try:
                while True:
                    piece = sock.recv(4096)
                    if not piece:
                        return True, got
                    got += piece
            except socket.timeout:
                return False, got

        with socket.create_connection(("127.0.0.1", port)) as s:        # headers never finish
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            closed, _ = closed_within(s, 20)
            assert closed
        with socket.create_connection(("127.0.0.1", port)) as s:        # body never finishes
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100\r\n\r\n{\"model\":")
            closed, got = closed_within(s, 20)
            assert got.startswith(b"HTTP/1.1 408"), got[:200]
            assert b"request_timeout" in got
    finally:
        stop_server(proc, log)
