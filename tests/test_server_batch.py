"""Continuous batching in the real server (`nanoqwen serve --max-batch 64 --kv-pages N`, CPU, the test model),
driven by the official `openai` client: 64 concurrent streams, some of which disconnect mid-stream, with a KV pool
too small for all of them at once (the rest wait for pages). Every stream that runs to its end must equal
Engine.generate on the same file; afterwards every KV page is back (/metrics), and the server answers normally.
Waits are bounded by HANG_GUARD_S; no test asserts speed."""
from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

from test_server_model import HANG_GUARD_S, running_server

MODEL = "batch-model"
STREAMS = 64
MAX_TOKENS = 24
# Every DISCONNECT_EVERY-th stream asks for LONG_TOKENS (eos ignored) and hangs up after DISCONNECT_AFTER chunks,
# so it is surely still generating when its client goes away.
DISCONNECT_EVERY = 8
DISCONNECT_AFTER = 3
LONG_TOKENS = 400
# KV pages: a finishing stream needs 2 pages (8 + 24 tokens), a disconnecting one 26; 90 pages hold about a third of
# the 64 streams at once, so admission waits for pages while the batch runs.
KV_PAGES = 90


def _metrics(base) -> dict[str, float]:
    out = {}
    for line in httpx.get(base + "/metrics", timeout=30).text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


@pytest.fixture(scope="module")
def server(model_path, tmp_path_factory):
    log_path = tmp_path_factory.mktemp("server_batch") / "server.log"
    with running_server(model_path, log_path, "--max-batch", str(STREAMS), "--kv-pages", str(KV_PAGES),
                        "--queue-size", str(STREAMS), "--model-name", MODEL, "--log-level", "warning") as (base, p):
        yield base
    assert p.returncode in (0, -15), log_path.read_text()


def _prompt(i: int) -> str:
    return f"def function_{i}(x):"


def test_64_concurrent_streams_with_disconnects(server, engine):
    client = openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=HANG_GUARD_S)
    m0 = _metrics(server)
    results: list = [None] * STREAMS
    peak_waiting = [0.0]

    def run(i):
        try:
            if i % DISCONNECT_EVERY == 0:
                stream = client.completions.create(model=MODEL, prompt=_prompt(i), max_tokens=LONG_TOKENS,
                                                   temperature=0, stream=True, extra_body={"ignore_eos": True})
                for k, _ in enumerate(stream):
                    if k + 1 == DISCONNECT_AFTER:
                        break
                stream.close()                       # the client goes away mid-stream
                results[i] = "disconnected"
            else:
                stream = client.completions.create(model=MODEL, prompt=_prompt(i), max_tokens=MAX_TOKENS,
                                                   temperature=0, stream=True)
                text, finish = "", None
                for ch in stream:
                    text += ch.choices[0].text
                    finish = ch.choices[0].finish_reason or finish
                results[i] = (text, finish)
        except Exception as e:                       # reported below with the stream's index
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(STREAMS)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads) and time.monotonic() - t0 < HANG_GUARD_S:
        peak_waiting[0] = max(peak_waiting[0], _metrics(server)["nanoqwen_sequences_waiting"])
        time.sleep(0.2)
    for t in threads:
        t.join(HANG_GUARD_S)
    assert not any(t.is_alive() for t in threads)
    errors = {i: r for i, r in enumerate(results) if isinstance(r, Exception)}
    assert not errors, errors
    for i, r in enumerate(results):
        if r == "disconnected":
            continue
        ref = list(engine.generate(_prompt(i), max_new_tokens=MAX_TOKENS, temperature=0.0))
        assert r == ("".join(c.text for c in ref), ref[-1].finish_reason), f"stream {i}"
    n_disconnects = sum(r == "disconnected" for r in results)

    def settled():
        m = _metrics(server)
        return m["nanoqwen_sequences_running"] == 0 and m["nanoqwen_kv_pages_used"] == 0 \
            and m["nanoqwen_requests_running"] == 0
    deadline = time.monotonic() + HANG_GUARD_S
    while not settled():
        assert time.monotonic() < deadline, f"pages not returned: {_metrics(server)}"
        time.sleep(0.1)
    m = _metrics(server)
    assert m["nanoqwen_kv_pages_free"] + m["nanoqwen_kv_pages_cached"] == KV_PAGES          # nothing leaked
    assert m["nanoqwen_generations_cancelled_total"] - m0.get("nanoqwen_generations_cancelled_total", 0) \
        == n_disconnects
    assert m["nanoqwen_batch_size_count"] > 0 and m["nanoqwen_batch_size_sum"] / m["nanoqwen_batch_size_count"] > 1
    assert peak_waiting[0] > 0                       # the pool was too small for all: some waited for pages
    assert m["nanoqwen_prefix_cache_hit_tokens_total"] >= 0 and m["nanoqwen_tokens_per_second"] > 0
    # the server goes on serving
    r = client.completions.create(model=MODEL, prompt=_prompt(1), max_tokens=MAX_TOKENS, temperature=0)
    assert r.choices[0].text == results[1][0]


def test_shared_prompt_hits_the_prefix_cache_and_n_choices_share_it(server, engine):
    client = openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=HANG_GUARD_S)
    prompt = "def shared_helper(values):\n    total = 0\n    for v in values:\n        total += v\n" * 4
    ref = "".join(c.text for c in engine.generate(prompt, max_new_tokens=8, temperature=0.0))
    hits0 = _metrics(server)["nanoqwen_prefix_cache_hit_tokens_total"]
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0, n=3)
    assert [c.text for c in r.choices] == [ref] * 3
    hits1 = _metrics(server)["nanoqwen_prefix_cache_hit_tokens_total"]
    n_prompt = r.usage.prompt_tokens
    assert hits1 - hits0 >= 2 * 16 * ((n_prompt - 1) // 16)      # choices 2 and 3 reused the prompt's full pages
