"""Unit tests of the server's HTTP layer (validation, error bodies, queue, metrics exposition) against a small
FAKE engine, in process (starlette TestClient). The real engine + real server process + openai client are in
tests/test_server.py; this file only pins behaviour that does not depend on the model.
"""
from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
from starlette.testclient import TestClient

from nanoqwen_rt.serve.app import create_app
from nanoqwen_rt.serve.metrics import TTFT_BUCKETS, ServerMetrics
from nanoqwen_rt.serve.schemas import ApiError, check_context, parse_chat, parse_completion

MODEL = "fake-model"
CONTEXT = 64


@dataclass
class _Chunk:
    text: str
    token_ids: list
    finish_reason: str | None = None


class _FakeTokenizer:
    """One token per whitespace-separated word (enough to count and to template)."""
    chat_template = "fake"
    max_token_chars = 32          # the server's prompt length cut: CONTEXT * 32 characters

    def encode(self, text, add_bos=False):
        return [len(w) for w in text.split()]

    def apply_chat_template(self, messages, add_generation_prompt=True):
        return " ".join(f"<{m['role']}> {m['content']}" for m in messages) + (" <assistant>" if add_generation_prompt
                                                                               else "")


class _FakeHandle:
    """Engine.submit's handle over a fake generator: poll() computes one chunk itself (the fake has no batch for
    step() to advance)."""

    def __init__(self, it):
        self._it = it
        self.done = False

    def poll(self):
        if self.done:
            return []
        try:
            return [next(self._it)]
        except StopIteration:
            self.done = True
            return []

    def close(self):
        self.done = True
        getattr(self._it, "close", lambda: None)()


class FakeEngine:
    """Yields words 'w0 w1 ...'; `gate` (when set) makes every token wait for a permit, so tests can hold a
    generation open without sleeping. The batched API (submit / step / batch_stats) over the same generator."""
    device = "fake"
    max_context = CONTEXT
    max_batch = 4
    config = SimpleNamespace(vocab_rows=100)

    def submit(self, prompt, **kw):
        return _FakeHandle(self.generate(prompt, **kw))

    def step(self):
        return 0

    def batch_stats(self):
        return None

    def __init__(self):
        self.tokenizer = _FakeTokenizer()
        self.gate: threading.Semaphore | None = None
        self.started = threading.Event()
        self.calls: list[dict] = []

    def render_chat(self, messages, tools=None, tool_choice=None):
        """Engine.render_chat's shape over the fake template (the rules for tools: tests/test_api_features.py)."""
        kw = {"tools": tools} if tools and tool_choice != "none" else {}
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, **kw)

    def tool_choice_grammar(self, tools, tool_choice):
        return None

    def generate(self, prompt, max_new_tokens, temperature, top_k, top_p, seed, stop, stop_token_ids):
        self.calls.append(dict(prompt=prompt, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                               top_p=top_p, seed=seed, stop=stop, stop_token_ids=stop_token_ids))

        def gen():
            self.started.set()
            for i in range(max_new_tokens):
                if self.gate is not None:
                    self.gate.acquire()
                word = f" w{i}"
                if stop and any(s in word for s in stop):
                    yield _Chunk("", [i], "stop")
                    return
                yield _Chunk(word, [i], "length" if i + 1 == max_new_tokens else None)
        return gen()


@pytest.fixture
def fake():
    return FakeEngine()


@pytest.fixture
def client(fake):
    app = create_app(fake, model_name=MODEL, queue_size=2)
    with TestClient(app) as c:
        yield c


def _err(resp, status, code=None, param=None):
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    if code is not None:
        assert body["error"]["code"] == code
    if param is not None:
        assert body["error"]["param"] == param
    return body["error"]


# ------------------------------------------------------------------ happy paths


def test_completion_body_and_usage(client, fake):
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "a bb ccc", "max_tokens": 3,
                                             "temperature": 0})
    assert r.status_code == 200, r.text
    b = r.json()
    assert b["object"] == "text_completion" and b["model"] == MODEL
    assert b["choices"][0]["text"] == " w0 w1 w2"
    assert b["choices"][0]["finish_reason"] == "length"
    assert b["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
    assert fake.calls[-1]["max_new_tokens"] == 3 and fake.calls[-1]["temperature"] == 0.0


def test_chat_renders_template_and_streams(client, fake):
    with client.stream("POST", "/v1/chat/completions",
                       json={"model": MODEL, "messages": [{"role": "user", "content": "hi there"}],
                             "max_tokens": 2, "stream": True, "stream_options": {"include_usage": True}}) as r:
        assert r.status_code == 200
        data = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == " w0 w1"
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 2
    rendered = fake.tokenizer.apply_chat_template([{"role": "user", "content": "hi there"}])
    # the engine gets the rendered template as ids, encoded once by the server (usage counts the same ids)
    assert fake.calls[-1]["prompt"] == fake.tokenizer.encode(rendered, add_bos=True)
    assert chunks[-1]["usage"]["prompt_tokens"] == len(fake.tokenizer.encode(rendered))


def test_chat_default_max_tokens_fills_context(client, fake):
    r = client.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 200
    n_prompt = r.json()["usage"]["prompt_tokens"]
    assert fake.calls[-1]["max_new_tokens"] == CONTEXT - n_prompt


def test_token_id_prompts(client, fake):
    for prompt in ([5, 7, 99], [[5, 7, 99]]):
        r = client.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 2})
        assert r.status_code == 200, r.text
        assert fake.calls[-1]["prompt"] == [5, 7, 99]
        assert r.json()["usage"]["prompt_tokens"] == 3


def test_stop_and_ignore_eos_are_passed(client, fake):
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "p", "max_tokens": 8, "stop": ["w3"],
                                             "ignore_eos": True})
    assert r.json()["choices"][0]["text"] == " w0 w1 w2"
    assert r.json()["choices"][0]["finish_reason"] == "stop"
    assert fake.calls[-1]["stop"] == ["w3"] and fake.calls[-1]["stop_token_ids"] == []


def test_models_health_metrics(client):
    assert client.get("/v1/models").json()["data"][0]["id"] == MODEL
    assert client.get(f"/v1/models/{MODEL}").json()["id"] == MODEL
    _err(client.get("/v1/models/other"), 404, "model_not_found")
    h = client.get("/health").json()
    assert h["status"] == "ok" and h["device"] == "fake"
    client.post("/v1/completions", json={"model": MODEL, "prompt": "p", "max_tokens": 2})
    m = client.get("/metrics")
    assert m.headers["content-type"].startswith("text/plain")
    assert 'nanoqwen_requests_total{endpoint="/v1/completions",status="200"} 1' in m.text
    assert "nanoqwen_completion_tokens_total 2" in m.text
    assert "nanoqwen_time_to_first_token_seconds_count 1" in m.text
    assert "nanoqwen_time_per_output_token_seconds_count 1" in m.text


# ------------------------------------------------------------------ 4xx


@pytest.mark.parametrize("payload,status,code,param", [
    ({"model": "nope", "prompt": "p"}, 404, "model_not_found", "model"),
    ({"prompt": "p"}, 400, "missing_required_parameter", "model"),
    ({"model": MODEL}, 400, "missing_required_parameter", "prompt"),
    ({"model": MODEL, "prompt": 5}, 400, "invalid_type", "prompt"),
    ({"model": MODEL, "prompt": "p", "temperature": -0.5}, 400, "invalid_value", "temperature"),
    ({"model": MODEL, "prompt": "p", "temperature": "hot"}, 400, "invalid_type", "temperature"),
    ({"model": MODEL, "prompt": "p", "top_p": 0}, 400, "invalid_value", "top_p"),
    ({"model": MODEL, "prompt": "p", "top_p": 1.5}, 400, "invalid_value", "top_p"),
    ({"model": MODEL, "prompt": "p", "max_tokens": 0}, 400, "invalid_value", "max_tokens"),
    ({"model": MODEL, "prompt": "p", "max_tokens": 2.5}, 400, "invalid_type", "max_tokens"),
    ({"model": MODEL, "prompt": "p", "max_tokens": True}, 400, "invalid_type", "max_tokens"),
    ({"model": MODEL, "prompt": "p", "seed": -1}, 400, "invalid_value", "seed"),
    ({"model": MODEL, "prompt": "p", "stop": ["a", "b", "c", "d", "e"]}, 400, "invalid_value", "stop"),
    ({"model": MODEL, "prompt": "p", "stop": [""]}, 400, "invalid_value", "stop"),
    ({"model": MODEL, "prompt": "p", "stop": 3}, 400, "invalid_type", "stop"),
    ({"model": MODEL, "prompt": "p", "n": 9}, 400, "invalid_value", "n"),
    ({"model": MODEL, "prompt": "p", "n": 0}, 400, "invalid_value", "n"),
    ({"model": MODEL, "prompt": "p", "logprobs": 21}, 400, "invalid_value", "logprobs"),
    ({"model": MODEL, "prompt": "p", "logprobs": True}, 400, "invalid_type", "logprobs"),
    ({"model": MODEL, "prompt": "p", "suffix": 3}, 400, "invalid_type", "suffix"),
    ({"model": MODEL, "prompt": [1, 2], "suffix": "x"}, 400, "invalid_value", "suffix"),
    ({"model": MODEL, "prompt": "p", "suffix": "x", "echo": True}, 400, "unsupported_value", "echo"),
    ({"model": MODEL, "prompt": "p", "logit_bias": {"100": 1}}, 400, "invalid_value", "logit_bias"),
    # str.isdigit() digits that are not ASCII: '²' made int() raise (a 500), '١' read as token 1
    ({"model": MODEL, "prompt": "p", "logit_bias": {"\u00b2": 1}}, 400, "invalid_value", "logit_bias"),
    ({"model": MODEL, "prompt": "p", "logit_bias": {"\u0661": 1}}, 400, "invalid_value", "logit_bias"),
    ({"model": MODEL, "prompt": "p", "logit_bias": {"1" * 5000: 1}}, 400, "invalid_value", "logit_bias"),
    ({"model": MODEL, "prompt": "p", "temperature": 1e-308}, 400, "invalid_value", "temperature"),
    ({"model": MODEL, "prompt": "p", "logit_bias": {"1": 101}}, 400, "invalid_value", "logit_bias"),
    ({"model": MODEL, "prompt": "p", "logit_bias": [1]}, 400, "invalid_type", "logit_bias"),
    ({"model": MODEL, "prompt": "p", "presence_penalty": 2.5}, 400, "invalid_value", "presence_penalty"),
    ({"model": MODEL, "prompt": "p", "frequency_penalty": "x"}, 400, "invalid_type", "frequency_penalty"),
    ({"model": MODEL, "prompt": "p", "tools": [{"type": "function"}]}, 400, "unsupported_parameter", "tools"),
    ({"model": MODEL, "prompt": "p", "response_format": {"type": "json_object"}}, 400, "unsupported_parameter",
     "response_format"),
    ({"model": MODEL, "prompt": "p", "stream": "yes"}, 400, "invalid_type", "stream"),
    ({"model": MODEL, "prompt": "p", "stream_options": {"include_usage": True}}, 400, "invalid_value",
     "stream_options"),
    ({"model": MODEL, "prompt": "p " * CONTEXT}, 400, "context_length_exceeded", "prompt"),
    ({"model": MODEL, "prompt": "p " * 10, "max_tokens": CONTEXT - 9}, 400, "context_length_exceeded",
     "max_tokens"),
    ({"model": MODEL, "prompt": "   "}, 400, "invalid_value", "prompt"),
    ({"model": MODEL, "prompt": []}, 400, "invalid_value", "prompt"),
    ({"model": MODEL, "prompt": [1, 100]}, 400, "invalid_value", "prompt"),
    ({"model": MODEL, "prompt": [1, -1]}, 400, "invalid_value", "prompt"),
    ({"model": MODEL, "prompt": [1, "a"]}, 400, "invalid_type", "prompt"),
    ({"model": MODEL, "prompt": [[1], [2]]}, 400, "invalid_type", "prompt"),
    ({"model": MODEL, "prompt": ["a", "b"]}, 400, "invalid_type", "prompt"),
    ({"model": MODEL, "prompt": [1.5]}, 400, "invalid_type", "prompt"),
])
def test_completion_4xx(client, fake, payload, status, code, param):
    _err(client.post("/v1/completions", json=payload), status, code, param)
    assert fake.calls == []                  # nothing reached the engine


@pytest.mark.parametrize("payload,code,param", [
    ({"model": MODEL}, "missing_required_parameter", "messages"),
    ({"model": MODEL, "messages": []}, "invalid_type", "messages"),
    ({"model": MODEL, "messages": ["hi"]}, "invalid_type", "messages[0]"),
    ({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, "invalid_value", "messages[0].role"),
    ({"model": MODEL, "messages": [{"role": "user", "content": 3}]}, "invalid_type", "messages[0].content"),
    ({"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "unsupported_value",
     "messages[0].content"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x " * CONTEXT}]}, "context_length_exceeded",
     "messages"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 2}, "unsupported_value", "n"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "suffix": "y"}, "unsupported_parameter",
     "suffix"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "invalid_value",
     "top_logprobs"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "tools": {"f": 1}}, "invalid_type", "tools"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
     "invalid_type", "tools"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "always"}, "invalid_value",
     "tool_choice"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": {"type": "function", "function": {"name": "g"}}}, "invalid_value", "tool_choice"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}},
     "invalid_value", "response_format"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_schema", "json_schema": {"schema": 3}}}, "invalid_type", "response_format"),
    ({"model": MODEL, "messages": [{"role": "assistant", "content": None,
                                    "tool_calls": [{"type": "function", "function": {"name": "f",
                                                                                     "arguments": "{bad"}}]}]},
     "invalid_value", "messages[0].tool_calls"),
])
def test_chat_4xx(client, fake, payload, code, param):
    _err(client.post("/v1/chat/completions", json=payload), 400, code, param)
    assert fake.calls == []


def test_malformed_json_and_wrong_body_type(client):
    _err(client.post("/v1/completions", content=b'{"model": ', headers={"content-type": "application/json"}),
         400, "invalid_json")
    _err(client.post("/v1/chat/completions", content=b"\xff\xfe", headers={"content-type": "application/json"}),
         400, "invalid_json")
    _err(client.post("/v1/completions", json=[1, 2]), 400, "invalid_json")


def test_unknown_route_and_method(client):
    _err(client.get("/v1/nothing"), 404)
    _err(client.get("/v1/completions"), 405)


def test_api_key(fake):
    app = create_app(fake, model_name=MODEL, api_key="s3cret")
    with TestClient(app) as c:
        _err(c.get("/v1/models"), 401, "invalid_api_key")
        _err(c.get("/v1/models", headers={"Authorization": "Bearer wrong"}), 401, "invalid_api_key")
        assert c.get("/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert c.get("/health").status_code == 200          # liveness stays open for probes


# ------------------------------------------------------------------ queue


def test_queue_full_gets_429_and_all_others_complete(fake):
    """max_batch=4 (the fake's), queue_size=2: one running (held by the gate inside the worker's round), 3 more that
    the batch's free slots take at the next step boundary, and 2 in the FIFO; the 7th is refused with 429 +
    Retry-After (the README: only requests beyond --max-batch wait in the FIFO)."""
    fake.gate = threading.Semaphore(0)
    app = create_app(fake, model_name=MODEL, queue_size=2)
    results: dict[int, object] = {}
    accepted = fake.max_batch + 2
    with TestClient(app) as c:
        def post(i):
            # prompt i is one word of i + 1 letters: the fake tokenizer encodes it to the id list [i + 1]
            results[i] = c.post("/v1/completions", json={"model": MODEL, "prompt": "p" * (i + 1), "max_tokens": 2})

        threads = [threading.Thread(target=post, args=(0,))]
        threads[0].start()
        try:
            assert fake.started.wait(30)                    # request 0 is generating (blocked on the gate)
            srv = app.state.server
            for i in range(1, accepted):                    # one at a time, so the arrival order is known
                threads.append(threading.Thread(target=post, args=(i,)))
                threads[-1].start()
                for _ in range(3000):                       # wait (bounded) until it is queued
                    if srv.worker.depth == i or i in results:
                        break
                    threading.Event().wait(0.01)
                assert i not in results, f"request {i} was answered {results[i].status_code} instead of queued"
                assert srv.worker.depth == i
            r = c.post("/v1/completions", json={"model": MODEL, "prompt": "late", "max_tokens": 2})
            _err(r, 429, "queue_full")
            assert r.headers["retry-after"].isdigit()
        finally:                                            # pass or fail, let every held generation finish
            for _ in range(accepted * 2):
                fake.gate.release()
            for t in threads:
                t.join(60)
        assert all(results[i].status_code == 200 for i in range(accepted))
        # FIFO: the engine saw the prompts in arrival order
        assert [call["prompt"] for call in fake.calls] == [[i + 1] for i in range(accepted)]
        assert "nanoqwen_queue_rejected_total 1" in c.get("/metrics").text


def test_request_larger_than_the_kv_pool_is_a_400_before_queueing(fake):
    """A request needing more KV pages than the engine's whole pool could never run: 400 at once, nothing queued."""
    fake.batch_stats = lambda: SimpleNamespace(kv_pages=2)          # 32 tokens of KV in all
    with TestClient(create_app(fake, model_name=MODEL, queue_size=2)) as c:
        ok = c.post("/v1/completions", json={"model": MODEL, "prompt": "a b c", "max_tokens": 30})
        assert ok.status_code == 200                                # 3 + 30 - 1 = 32 positions: 2 pages
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": "a b c", "max_tokens": 31, "stream": True})
        _err(r, 400, "invalid_value", "max_tokens")
    assert len(fake.calls) == 1


# ------------------------------------------------------------------ pure parts


def test_check_context_boundaries():
    assert check_context(10, 54, 64, "prompt") == 54           # exactly fills the context
    assert check_context(10, None, 64, "messages") == 54
    with pytest.raises(ApiError):
        check_context(10, 55, 64, "prompt")
    with pytest.raises(ApiError):
        check_context(64, None, 64, "prompt")


def test_parse_defaults_follow_openai():
    c = parse_completion({"model": "m", "prompt": ["only one"]}, "m")
    assert c.prompt == "only one" and c.params.max_tokens == 16 and c.params.temperature == 1.0
    ch = parse_chat({"model": "m", "messages": [{"role": "developer", "content": [{"type": "text", "text": "a"},
                                                                                  {"type": "text", "text": "b"}]}]},
                    "m")
    assert ch.messages == [{"role": "system", "content": "ab"}] and ch.params.max_tokens is None


def test_histogram_exposition_matches_numpy_reference():
    """The TTFT histogram's cumulative bucket counts and sum, against numpy on fresh random latencies."""
    rng = np.random.default_rng()
    values = rng.exponential(0.5, size=500)
    m = ServerMetrics()
    for v in values:
        m.ttft.observe(float(v))
    text = m.render()[0].decode()
    name = "nanoqwen_time_to_first_token_seconds"
    got = {float(g.group(1).replace("+Inf", "inf")): float(g.group(2))
           for g in re.finditer(name + r'_bucket\{le="([^"]+)"\} (\S+)', text)}
    assert sorted(got) == sorted(TTFT_BUCKETS + (float("inf"),))
    for b in TTFT_BUCKETS:
        assert got[b] == int(np.sum(values <= b))
    assert got[float("inf")] == values.size
    s = float(re.search(name + r"_sum (\S+)", text).group(1))
    # the sum is accumulated in float64 in a different order than numpy's pairwise sum: 1e-9 relative
    assert s == pytest.approx(float(values.sum()), rel=1e-9)


def test_metrics_text_is_well_formed_and_per_app():
    m = ServerMetrics()
    m.count_request('/x"y', 200)
    m.ttft.observe(0.3)
    body, content_type = m.render()
    assert content_type.startswith("text/plain")
    lines = body.decode().splitlines()
    names = set()
    for line in lines:
        if line.startswith("# TYPE"):
            _, _, name, kind = line.split()
            assert kind in ("counter", "gauge", "histogram")
            names.add(name)
        elif not line.startswith("#"):
            assert re.fullmatch(r'[a-z_]+(\{.*\})? \S+', line), line
    assert {"nanoqwen_requests_total", "nanoqwen_queue_depth", "nanoqwen_time_to_first_token_seconds"} <= names
    assert 'endpoint="/x\\"y"' in "\n".join(lines)
    other = ServerMetrics()        # its own registry: nothing shared with m, no duplicate-name error
    assert "nanoqwen_requests_total{" not in other.render()[0].decode()


def test_body_size_limit(client, monkeypatch):
    import nanoqwen_rt.serve.app as server_mod
    monkeypatch.setattr(server_mod, "MAX_BODY_BYTES", 1000)
    big = json.dumps({"model": MODEL, "prompt": "x" * 2000}).encode()
    _err(client.post("/v1/completions", content=big, headers={"content-type": "application/json"}), 413,
         "request_too_large")

    def chunks():                                   # no Content-Length: the limit applies while reading
        for i in range(0, len(big), 100):
            yield big[i:i + 100]
    _err(client.post("/v1/completions", content=chunks(), headers={"content-type": "application/json"}), 413,
         "request_too_large")
    assert client.post("/v1/completions", json={"model": MODEL, "prompt": "ok", "max_tokens": 1}).status_code == 200


# ------------------------------------------------------------------ hostile bodies


def test_prompt_longer_than_any_fitting_prompt_is_refused_before_tokenizing(client, fake):
    calls = []
    real = fake.tokenizer.encode
    fake.tokenizer.encode = lambda text, add_bos=False: calls.append(len(text)) or real(text)
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "x" * (CONTEXT * 32 + 1)})
    _err(r, 400, code="context_length_exceeded", param="prompt")
    assert calls == []                       # refused by length: the tokenizer never saw it
    r = client.post("/v1/chat/completions", json={"model": MODEL, "messages": [
        {"role": "user", "content": "y" * (CONTEXT * 32)}]})
    _err(r, 400, code="context_length_exceeded", param="messages")


def test_deeply_nested_json_is_a_400(client):
    body = b"[" * 100_000 + b"]" * 100_000
    r = client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    _err(r, 400, code="invalid_json")


def test_retry_after_follows_the_queue():
    """Retry-After = (waiting + running) × mean recent run time, rounded up, bounded: not a fixed 1 s."""
    from nanoqwen_rt.serve.queue import RETRY_AFTER_MAX_S, RETRY_AFTER_MIN_S, GenerationWorker, Job
    w = GenerationWorker(8, ServerMetrics())
    assert w.retry_after_s() == RETRY_AFTER_MIN_S                  # nothing ran yet, nothing waits
    w._recent_s.extend([2.0, 4.0])                                 # mean 3 s per job
    for i in range(5):
        w.submit(Job(lambda: iter(()), lambda ev: None, 1))
    assert w.retry_after_s() == 15                                 # 5 ahead × 3 s
    w._recent_s.extend([100.0] * 16)
    assert w.retry_after_s() == RETRY_AFTER_MAX_S


def test_shutdown_ends_a_live_stream_with_an_error_event_and_done(fake):
    """SIGINT/SIGTERM under uvicorn sets sse-starlette's AppStatus.should_exit; a stream that is still generating
    then closes with an OpenAI error event and [DONE] instead of being cut."""
    from sse_starlette.sse import AppStatus
    fake.gate = threading.Semaphore(1)                      # one token, then the generation blocks
    app = create_app(fake, model_name=MODEL, queue_size=2)
    try:
        with TestClient(app) as c, c.stream("POST", "/v1/completions", json={
                "model": MODEL, "prompt": "p", "max_tokens": 50, "stream": True}) as r:
            lines = r.iter_lines()
            data = []
            for line in lines:
                if line.startswith("data: "):
                    data.append(line[len("data: "):])
                    break                                   # the first token arrived: the stream is live
            AppStatus.should_exit = True
            data += [line[len("data: "):] for line in lines if line.startswith("data: ")]
            fake.gate.release()
    finally:
        AppStatus.should_exit = False
        for _ in range(60):
            fake.gate.release()
    assert json.loads(data[0])["choices"][0]["text"] == " w0"
    assert data[-1] == "[DONE]"
    assert json.loads(data[-2])["error"]["code"] == "server_shutdown"


# ------------------------------------------------------------------ tool calls (parsing; the model side is in
# tests/test_api_features.py)


class _ToolTokenizer(_FakeTokenizer):
    def apply_chat_template(self, messages, add_generation_prompt=True, tools=None):
        return super().apply_chat_template(messages, add_generation_prompt) + (f" <tools {len(tools)}>" if tools else "")


class _ScriptedEngine(FakeEngine):
    """Answers with a fixed text, one character per token."""

    def __init__(self, text):
        super().__init__()
        self.tokenizer = _ToolTokenizer()
        self.text = text

    def generate(self, prompt, max_new_tokens, temperature, top_k, top_p, seed, stop, stop_token_ids):
        self.calls.append(dict(prompt=prompt))
        chars = self.text
        return iter([_Chunk(ch, [i], "stop" if i + 1 == len(chars) else None) for i, ch in enumerate(chars)])


TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}]


@pytest.mark.parametrize("text,calls,content,n_errors", [
    ('<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>', ["get_time"], None, 0),
    ('Sure.\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>', ["get_time"], "Sure.", 0),
    ('<tool_call>\n{"name": "get_time", "arguments": {}\n</tool_call>', [], None, 1),     # malformed JSON
    ("no call at all", [], "no call at all", 0),
])
def test_tool_calls_parsed_never_500(text, calls, content, n_errors):
    fake = _ScriptedEngine(text)
    with TestClient(create_app(fake, model_name=MODEL, queue_size=2)) as c:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "time?"}], "tools": TOOLS}
        r = c.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        ch = r.json()["choices"][0]
        assert [t["function"]["name"] for t in ch["message"].get("tool_calls", [])] == calls
        assert ch["finish_reason"] == ("tool_calls" if calls else "stop")
        assert ch["message"]["content"] == (content if content is not None else (None if calls else text))
        assert len(ch.get("tool_call_errors", [])) == n_errors
        assert fake.calls[-1]["prompt"] is not None
        # streamed: the same calls (as tool_calls deltas) and the same content
        r = c.post("/v1/chat/completions", json={**body, "stream": True})
        chunks = [json.loads(ln[6:]) for ln in r.text.splitlines() if ln.startswith("data: {")]
        deltas = [d for ch in chunks for d in ch["choices"][0]["delta"].get("tool_calls", [])]
        assert [d["function"]["name"] for d in deltas] == calls
        assert [d["index"] for d in deltas] == list(range(len(calls)))
        streamed = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks)
        assert streamed.strip() == (content if content is not None else ("" if calls else text))
        assert chunks[-1]["choices"][0]["finish_reason"] == ("tool_calls" if calls else "stop")
        assert len(chunks[-1]["choices"][0].get("tool_call_errors", [])) == n_errors


# ------------------------------------------------------------------ other web pages, clients that never read


def test_loopback_server_answers_only_its_host_names(fake):
    """allowed_hosts (what serve passes on a loopback address): another Host is a 403, so a page whose DNS name
    was rebound to 127.0.0.1 cannot use the server; the loopback names with any port are served."""
    from nanoqwen_rt.serve.app import LOOPBACK_HOSTS
    with TestClient(create_app(fake, model_name=MODEL, allowed_hosts=LOOPBACK_HOSTS)) as c:
        for host in ("127.0.0.1:8000", "localhost:8000", "[::1]:8000", "LOCALHOST"):
            assert c.get("/v1/models", headers={"host": host}).status_code == 200, host
        for host in ("attacker.example:8000", "attacker.example", "127.0.0.1.attacker.example"):
            _err(c.get("/v1/models", headers={"host": host}), 403, "forbidden")
            _err(c.get("/", headers={"host": host}), 403, "forbidden")
    assert fake.calls == []


def test_post_from_another_sites_page_is_refused(client, fake):
    """A POST whose Origin is not the server's own (a page on another site submitting a form-like request) is a
    403 before anything runs; the server's own page, and clients that send no Origin, are served; a GET from
    another origin is not refused (the browser keeps its answer from that page: no CORS headers)."""
    body = {"model": MODEL, "prompt": "p", "max_tokens": 2}
    for origin in ("http://attacker.example", "null", "http://testserver.attacker.example"):
        _err(client.post("/v1/completions", json=body, headers={"origin": origin}), 403, "forbidden")
    assert fake.calls == []
    assert client.post("/v1/completions", json=body, headers={"origin": "http://testserver"}).status_code == 200
    assert client.post("/v1/completions", json=body).status_code == 200
    assert client.get("/v1/models", headers={"origin": "http://attacker.example"}).status_code == 200


def test_stream_to_a_client_that_never_reads_is_dropped(fake):
    """A streaming client that takes no bytes for body_timeout_s (--read-timeout) is dropped and its generation
    withdrawn; without the send timeout the response waited on it forever, holding its answer in memory."""
    import asyncio
    app = create_app(fake, model_name=MODEL, body_timeout_s=0.5)
    body = json.dumps({"model": MODEL, "prompt": "p", "max_tokens": 40, "stream": True}).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"", "root_path": "",
             "headers": [(b"host", b"testserver"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 5000), "server": ("testserver", 80)}

    async def call():
        sent = asyncio.Event()
        requests = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive():
            if requests:
                return requests.pop()
            await asyncio.Event().wait()            # the client never hangs up

        async def send(message):
            if message["type"] == "http.response.body" and message.get("body"):
                sent.set()
                await asyncio.Event().wait()        # the client never reads: this send never completes

        task = asyncio.ensure_future(app(scope, receive, send))
        done, _ = await asyncio.wait({task}, timeout=30)
        if not done:
            task.cancel()
            return "hung"
        task.exception()                            # the send timeout surfaces as the app's exception: fine
        assert sent.is_set()
        return "ended"

    with TestClient(app) as c:
        outcome = c.portal.call(call)
        srv = app.state.server
        for _ in range(3000):                       # bounded wait for the worker to retire the withdrawn job
            if not srv.worker.running:
                break
            threading.Event().wait(0.01)
        assert outcome != "hung"
        assert not srv.worker.running
