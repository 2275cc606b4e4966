"""The chat page (`GET /` of `nanoqwen serve`) in a real headless Chromium driven by Selenium, against a real
server process on the CPU backend and the test model (tests/test_server_model.py), started with --api-key.

One browser session walks the page as a user would: the key prompt, a wrong key (the 401 message), the right key
(model name and context size shown), a message whose answer streams in, Stop in the middle of an answer (the
server's cancelled-generations counter in /metrics goes up), a short greedy answer compared with Engine.chat, and
the code-block renderer (highlighting, copy button). Screenshots go to $NANOQWEN_ARTIFACTS, else
tests/artifacts/ (git-ignored).

Needs Debian's `chromium` + `chromium-driver` (the binaries on PATH, or NANOQWEN_CHROMIUM / NANOQWEN_CHROMEDRIVER)
and the `selenium` package; without them the test is skipped with the reason (CI installs them when it can).
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import httpx
import pytest

from test_server_model import HANG_GUARD_S, free_port as _free_port, running_server

MODEL = "page-model"
KEY = "page-key-456"
#: tokens asked for the answer that Stop interrupts: on the CPU test model (~100 tokens/s here) this is seconds
#: of generation, far longer than the test needs to see text and press Stop; the greedy answer to STOP_PROMPT
#: does not end early on that model (checked: the answer is still running when Stop is pressed).
LONG_ANSWER_TOKENS = 900
#: rounds of send-then-Stop before the test gives up on catching the server mid-answer (see the Stop step)
STOP_ROUNDS = 3
#: after the server's running gauge falls to 0, the time its worker has to count a cancellation (it decrements the
#: gauge, then counts; microseconds apart): a hang guard's margin, not a speed requirement
CANCEL_GRACE_S = 1.0
STOP_PROMPT = "Write a python function that sorts a list"
#: a short answer compared with Engine.chat token for token (greedy, same file, same backend)
SHORT_PROMPT = "def fibonacci(n):"
SHORT_ANSWER_TOKENS = 12
ARTIFACTS = Path(os.environ.get("NANOQWEN_ARTIFACTS") or Path(__file__).resolve().parent / "artifacts")


def _browser_binaries() -> tuple[str, str]:
    """(chromium, chromedriver) paths, or skip with the reason."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        pytest.skip("selenium is not installed (pip install selenium): the chat page test needs it")
    chromium = os.environ.get("NANOQWEN_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    driver = os.environ.get("NANOQWEN_CHROMEDRIVER") or shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.skip("no chromium / chromedriver on PATH (Debian: apt-get install chromium chromium-driver); "
                    "the chat page is not tested in a browser on this machine")
    return chromium, driver


@pytest.fixture(scope="module")
def server(model_path, tmp_path_factory):
    """Base URL of `nanoqwen serve --api-key KEY` on the test model (CPU); always terminated afterwards."""
    log_path = tmp_path_factory.mktemp("page-server") / "server.log"
    with running_server(model_path, log_path, "--api-key", KEY, "--model-name", MODEL,
                        "--log-level", "warning") as (base, _proc):
        yield base


@pytest.fixture(scope="module")
def browser():
    chromium, driver_path = _browser_binaries()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,900"):
        opts.add_argument(arg)
    drv = webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)
    drv.set_page_load_timeout(HANG_GUARD_S)
    yield drv
    drv.quit()


def _metric(base: str, name: str) -> float:
    for line in httpx.get(base + "/metrics", timeout=30).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def _cancelled(base: str) -> float:
    return _metric(base, "nanoqwen_generations_cancelled_total")


def _screenshot(drv, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    assert drv.save_screenshot(str(path)), f"could not save {path}"
    return path


def test_page_is_served_without_the_key(server):
    """The page and its files need no key (they hold no secret); the API behind them does."""
    r = httpx.get(server + "/", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert 'src="static/chat.js"' in r.text
    for name, kind in (("chat.js", "javascript"), ("chat.css", "text/css")):
        s = httpx.get(f"{server}/static/{name}", timeout=30)
        assert s.status_code == 200 and kind in s.headers["content-type"], (name, s.headers)
    assert httpx.get(server + "/static/nope.js", timeout=30).status_code == 404
    assert httpx.get(server + "/v1/models", timeout=30).status_code == 401


def test_chat_page_in_chromium(server, browser, engine):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    drv = browser
    wait = WebDriverWait(drv, HANG_GUARD_S, poll_frequency=0.05)
    el = lambda i: drv.find_element(By.ID, i)      # noqa: E731
    drv.get(server + "/")

    # No key yet: the page asks for one, and says why.
    wait.until(lambda d: el("key-form").is_displayed())
    wait.until(lambda d: "401" in el("banner").text)
    assert "needs an API key" in el("banner").text

    # 4. A wrong key: the 401 message, never a blank page.
    el("api-key").send_keys("wrong-key")
    el("key-submit").click()
    wait.until(lambda d: "refused this API key" in el("banner").text)
    assert "401" in el("banner").text and el("key-form").is_displayed()
    _screenshot(drv, "chat_page_401.png")

    # The right key: the model's name and context size appear, the key prompt goes away.
    el("api-key").clear()
    el("api-key").send_keys(KEY)
    el("key-submit").click()
    wait.until(lambda d: MODEL in el("model-info").text)
    assert f"context {engine.max_context} tokens" in el("model-info").text
    assert not el("key-form").is_displayed() and not el("banner").is_displayed()

    # 1.-2. Send a message; the answer streams in (its text is seen growing).
    for field, value in (("temperature", "0"), ("max-tokens", str(LONG_ANSWER_TOKENS))):
        el(field).clear()
        el(field).send_keys(value)
    answer = lambda: drv.find_elements(By.CSS_SELECTOR, ".msg.assistant")[-1].text    # noqa: E731
    # 3. Stop mid-answer: the page says so and the server counts a cancelled generation. The server may generate the
    # whole answer while the page is still rendering it (a loaded machine, a small model). Then either the page
    # finishes before Stop is pressed (no "(stopped)": the send button comes back without it), or Stop only ends the
    # page's read and the server has nothing left to cancel (its running gauge falls to 0 without a cancellation,
    # after the worker's dec-then-count order has had CANCEL_GRACE_S). Either way the round is repeated after /reset,
    # STOP_ROUNDS at most.
    for _ in range(STOP_ROUNDS):
        before = _cancelled(server)
        el("input").send_keys(STOP_PROMPT)
        el("send").click()
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".msg.assistant") and answer().strip())
        first = answer()
        wait.until(lambda d: len(answer()) > len(first))
        assert "TTFT" in el("stats").text and "tokens/s" in el("stats").text
        el("stop").click()                   # a no-op where the answer has just finished
        wait.until(lambda d: el("send").is_enabled())
        if "(stopped)" in answer():
            deadline = time.monotonic() + HANG_GUARD_S
            while _cancelled(server) < before + 1:
                assert time.monotonic() < deadline, "the server did not cancel the generation after Stop"
                if _metric(server, "nanoqwen_requests_running") == 0:
                    time.sleep(CANCEL_GRACE_S)
                    break
                time.sleep(0.1)
            if _cancelled(server) >= before + 1:
                break
        el("input").send_keys("/reset")      # the answer had finished first: once more, from an empty conversation
        el("send").click()
        wait.until(lambda d: not d.find_elements(By.CSS_SELECTOR, ".msg"))
    else:
        raise AssertionError(f"all {STOP_ROUNDS} answers finished before Stop reached the server")
    assert el("send").is_enabled() and not el("stop").is_enabled()
    _screenshot(drv, "chat_page_stopped.png")
    stopped_text = answer()
    assert 0 < len(stopped_text.replace("(stopped)", "").strip())

    # /reset forgets the conversation; a short greedy answer equals Engine.chat on the same file.
    el("input").send_keys("/reset")
    el("send").click()
    wait.until(lambda d: not d.find_elements(By.CSS_SELECTOR, ".msg"))
    el("max-tokens").clear()
    el("max-tokens").send_keys(str(SHORT_ANSWER_TOKENS))
    el("input").send_keys(SHORT_PROMPT)
    el("send").click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".msg.assistant") and el("send").is_enabled())
    chunks = list(engine.chat([{"role": "user", "content": SHORT_PROMPT}], max_new_tokens=SHORT_ANSWER_TOKENS,
                              temperature=0.0))
    ref = "".join(c.text for c in chunks)
    got = drv.execute_script("return state.history[state.history.length - 1].content")
    assert got == ref
    assert f"{sum(len(c.token_ids) for c in chunks)} tokens" in el("stats").text

    # Code blocks: highlighted Python and a copy button (the renderer the answers go through).
    drv.execute_script("addMessage('assistant', arguments[0])",
                       "Here:\n```python\ndef f(x):  # doubles\n    return x * 2 + len('ab')\n```\ndone")
    block = drv.find_elements(By.CSS_SELECTOR, ".msg.assistant")[-1]
    assert block.find_element(By.CSS_SELECTOR, ".code .tok-kw").text == "def"
    assert block.find_element(By.CSS_SELECTOR, ".code .tok-com").text == "# doubles"
    assert block.find_element(By.CSS_SELECTOR, ".code .tok-str").text == "'ab'"
    assert block.find_element(By.CSS_SELECTOR, ".code .tok-num").text == "2"
    assert block.find_element(By.CSS_SELECTOR, ".code pre").text == "def f(x):  # doubles\n    return x * 2 + len('ab')"
    assert block.find_element(By.CSS_SELECTOR, ".code button.copy").text == "Copy"
    assert not drv.find_elements(By.CSS_SELECTOR, "script:not([src])"), "the page runs no inline script"
    path = _screenshot(drv, "chat_page.png")
    assert path.stat().st_size > 10_000


def test_unreachable_server_is_a_message(browser, server, tmp_path):
    """The page loaded, then the server gone: a clear message, not a blank page."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    drv = browser
    drv.get(server + "/")
    WebDriverWait(drv, HANG_GUARD_S).until(lambda d: d.find_element(By.ID, "key-form").is_displayed())
    # Point the page's fetches at a closed port: what a stopped server looks like to it.
    port = _free_port()
    drv.execute_script("const f = window.fetch; window.fetch = (u, o) => f('http://127.0.0.1:%d/' + u, o);" % port)
    drv.find_element(By.ID, "input").send_keys("hello")
    drv.find_element(By.ID, "send").click()
    WebDriverWait(drv, HANG_GUARD_S).until(
        lambda d: "Cannot reach the server" in d.find_element(By.CSS_SELECTOR, ".msg.error").text)


def _open_with_key(drv, server):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    drv.get(server + "/")
    wait = WebDriverWait(drv, HANG_GUARD_S, poll_frequency=0.05)
    wait.until(lambda d: d.find_element(By.ID, "key-form").is_displayed())
    drv.find_element(By.ID, "api-key").send_keys(KEY)
    drv.find_element(By.ID, "key-submit").click()
    wait.until(lambda d: MODEL in d.find_element(By.ID, "model-info").text)
    return wait


def test_context_full_and_busy_are_messages(browser, server, engine):
    """A 400 context_length_exceeded from the server reads as 'Context full'; a 429 is retried after its
    Retry-After (the 429 is injected in the page: filling the server's queue from a test would be a race)."""
    from selenium.webdriver.common.by import By
    drv = browser
    wait = _open_with_key(drv, server)
    el = lambda i: drv.find_element(By.ID, i)      # noqa: E731

    el("max-tokens").clear()
    el("max-tokens").send_keys(str(engine.max_context + 1))
    el("input").send_keys("hello")
    el("send").click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".msg.error"))
    err = drv.find_elements(By.CSS_SELECTOR, ".msg.error")[-1].text
    assert err.startswith("Context full:") and str(engine.max_context) in err and "/reset" in err

    drv.execute_script("""
        const realFetch = window.fetch; window.sentAfter429 = null;
        window.fetch = (url, opts) => {
          if (String(url).endsWith("chat/completions") && window.sentAfter429 === null) {
            window.sentAfter429 = 0;
            return Promise.resolve(new Response('{"error": {"message": "busy", "code": "queue_full"}}',
                                                {status: 429, headers: {"Retry-After": "2"}}));
          }
          if (window.sentAfter429 === 0) window.sentAfter429 = performance.now();
          return realFetch(url, opts);
        };
        window.t429 = performance.now();""")
    el("max-tokens").clear()
    el("max-tokens").send_keys("4")
    el("input").send_keys("hello again")
    el("send").click()
    wait.until(lambda d: "busy (429)" in el("banner").text and "2 s" in el("banner").text)
    wait.until(lambda d: el("send").is_enabled() and drv.execute_script("return state.history.length") == 2)
    waited_ms = drv.execute_script("return window.sentAfter429 - window.t429")
    assert waited_ms >= 2000, f"retried after {waited_ms} ms, before the server's Retry-After of 2 s"

    # Stop while waiting out a 429: the question is withdrawn (not answered, not kept in the history).
    drv.execute_script("window.sentAfter429 = null;")
    el("input").send_keys("a third question")
    el("send").click()
    wait.until(lambda d: "busy (429)" in el("banner").text)
    el("stop").click()
    wait.until(lambda d: "not sent" in d.find_elements(By.CSS_SELECTOR, ".msg.user")[-1].text)
    assert el("send").is_enabled() and not el("banner").is_displayed()
    assert drv.execute_script("return state.history.length") == 2
    time.sleep(2.5)                                           # past the Retry-After: no retry goes out
    assert drv.execute_script("return window.sentAfter429") == 0
