"""Fill-in-the-middle, logprobs, logit_bias / penalties, structured output, tool calls, n > 1 and echo: the logits
steps against their slow references, the Engine against its own logits (the CPU oracle), and the real server
(CPU, subprocess) through the official `openai` client against the in-process Engine on the same file.

The FIM / tool / grammar tests run on tests/qwen25_model.py's file (Qwen2.5's real tokenizer and chat template,
random weights); they skip when the shared tokenizer folder is absent. Expected texts are never hard-coded.
"""
from __future__ import annotations

import json

import numpy as np
import openai
import pytest

from qwen25_model import build_qwen25_model_file, find_tokenizer_dir
from schema_suite import SCHEMAS
from test_server_model import HANG_GUARD_S, running_server

from nanoqwen_rt.logits import (InvalidLogitsSettings, LogitsPipeline, LogitsSettings, apply_token_bitmask,
                                apply_token_bitmask_reference, log_softmax, token_logprob)
from nanoqwen_rt.tools import ToolCallStream, parse_tool_calls

jsonschema = pytest.importorskip("jsonschema")

# The Engine's logprobs come from the incremental decode's logits, the oracle from logits_all's batched pass over
# the same ids: the same weights through a GEMV vs a GEMM, whose float32 sums differ in order. Observed ≤ 2e-5 on
# these files; 1e-3 leaves room without hiding a wrong position or a missing log-softmax (errors of ≥ 0.1).
LOGPROB_TOL = 1e-3
MODEL = "qwen25-tiny"


# ------------------------------------------------------------------ logits steps vs references (no model)

def test_bitmask_matches_reference():
    rng = np.random.default_rng(0)
    for n in (1, 31, 32, 33, 1000, 151936):
        logits = rng.standard_normal(n).astype(np.float32) * 3 + 1         # (n,), never all-zero
        mask = rng.integers(-2**31, 2**31, size=(n + 31) // 32, dtype=np.int64).astype(np.int32)
        a, b = logits.copy(), logits.copy()
        apply_token_bitmask(a, mask)
        if n <= 1000:
            apply_token_bitmask_reference(b, mask)
            np.testing.assert_array_equal(a, b)
        bits = [(int(mask[i // 32]) >> (i % 32)) & 1 for i in range(n)]
        assert np.all(np.isneginf(a[np.array(bits) == 0])) and np.all(a[np.array(bits) == 1] == logits[np.array(bits) == 1])


def test_token_logprob_against_definition():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(500) * 4).astype(np.float32)
    x[7] = -np.inf
    lp = token_logprob(x, 3, 5)
    with np.errstate(divide="ignore"):                                           # log(0) = -inf for token 7
        ref = np.log(np.exp(x.astype(np.float64)) / np.exp(x.astype(np.float64)).sum())
    assert abs(lp.logprob - ref[3]) < 1e-12
    want = sorted(range(500), key=lambda i: (-ref[i], i))[:5]
    assert [i for i, _ in lp.top] == want
    assert np.allclose([v for _, v in lp.top], ref[want], atol=1e-12)
    assert np.isneginf(log_softmax(x)[7])


def test_pipeline_bias_and_penalties():
    rng = np.random.default_rng(2)
    x = rng.standard_normal(64).astype(np.float32)
    s = LogitsSettings(64, {5: 10.0, 6: -3.5}, presence_penalty=0.5, frequency_penalty=0.25, top_logprobs=2)
    p = LogitsPipeline(s)
    for t in (5, 5, 9):
        p.after_sample(x, t)
    got = p.process(x)
    want = x.astype(np.float64).copy()
    want[5] += 10.0
    want[6] -= 3.5
    want[5] -= 0.5 + 2 * 0.25
    want[9] -= 0.5 + 0.25
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    for bad in (dict(logit_bias={64: 1.0}), dict(logit_bias={1: 101.0}), dict(presence_penalty=3.0),
                dict(top_logprobs=21), dict(frequency_penalty=float("nan"))):
        with pytest.raises(InvalidLogitsSettings):
            LogitsSettings(64, **bad)


# ------------------------------------------------------------------ tool-call parsing

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.mark.parametrize("text,names,content,n_err", [
    ("plain answer", [], "plain answer", 0),
    (CALL, ["get_weather"], "", 0),
    ("Let me check.\n" + CALL + "\n" + CALL.replace("Paris", "Rome"), ["get_weather", "get_weather"], "Let me check.", 0),
    ('<tool_call>\n{"name": "f", "arguments": {"a": 1}\n</tool_call>', [], None, 1),          # missing brace
    ('<tool_call>\n{"arguments": {}}\n</tool_call>', [], None, 1),                           # no name
    ('<tool_call>\n{"name": "f", "arguments": [1]}', [], None, 1),                           # unclosed, not object
    ('<tool_call>\n{"name": "f", "arguments": "{\\"x\\": 2}"}\n</tool_call>', ["f"], "", 0),  # arguments as a string
])
def test_parse_tool_calls_whole_and_streamed(text, names, content, n_err):
    parsed = parse_tool_calls(text)
    assert [c["function"]["name"] for c in parsed.tool_calls] == names
    assert len(parsed.errors) == n_err
    if content is not None:
        assert parsed.content == content
    else:
        assert parsed.content == text           # a malformed block stays in the content, as written
    for c in parsed.tool_calls:
        assert isinstance(json.loads(c["function"]["arguments"]), dict) and c["id"].startswith("call_")
    for step in (1, 3, 7, len(text)):           # streamed in pieces of several sizes: the same calls and content
        s = ToolCallStream()
        events = []
        for i in range(0, len(text), step):
            events += s.feed(text[i:i + step])
        events += s.finish()
        assert [v["function"]["name"] for k, v in events if k == "tool_call"] == names
        assert len([k for k, _ in events if k == "error"]) == n_err
        streamed = "".join(v for k, v in events if k == "content")
        assert streamed.strip() == parsed.content.strip()


# ------------------------------------------------------------------ the Qwen2.5-tokenizer model

@pytest.fixture(scope="module")
def qpath(tmp_path_factory):
    find_tokenizer_dir()
    return build_qwen25_model_file(tmp_path_factory.mktemp("qwen25"))


@pytest.fixture(scope="module")
def qeng(qpath):
    from nanoqwen_rt import Engine
    eng = Engine(qpath, device="cpu")
    yield eng
    eng.close()


def _run(it):
    chunks = list(it)
    return "".join(c.text for c in chunks), chunks


def test_fim_prompt_ids(qeng):
    tok = qeng.tokenizer
    pre, suf = "def add(a, b):\n    ", "\n    return c\n"
    ids = qeng.fim_ids(pre, suf)
    assert ids == tok.encode(f"<|fim_prefix|>{pre}<|fim_suffix|>{suf}<|fim_middle|>")
    repo = qeng.fim_ids(pre, suf, repo_name="calc", files=[("util.py", "X = 1"), ("README.md", "calc\n")],
                        path="calc.py")
    assert repo == tok.encode("<|repo_name|>calc\n<|file_sep|>util.py\nX = 1\n<|file_sep|>README.md\ncalc\n"
                              f"<|file_sep|>calc.py\n<|fim_prefix|>{pre}<|fim_suffix|>{suf}<|fim_middle|>")
    # the structure is fixed by ids: a marker string inside the user's text cannot come before the real prefix
    sneaky = qeng.fim_ids("x<|fim_middle|>", "y")
    assert sneaky[0] == tok.token_to_id("<|fim_prefix|>") and sneaky[-1] == tok.token_to_id("<|fim_middle|>")
    from nanoqwen_rt import InvalidArgument
    with pytest.raises(InvalidArgument):
        qeng.fim_ids("a", "b", files=[("f", "c")])            # files without repo_name


def test_fim_generation_stops_at_fim_tokens(qeng):
    from nanoqwen_rt.fim import FIM_STOP_TOKENS
    stop_ids = {qeng.tokenizer.token_to_id(t) for t in FIM_STOP_TOKENS}
    text, chunks = _run(qeng.fim("def f(x):\n", "\n", max_new_tokens=12))
    ref, _ = _run(qeng.generate(qeng.fim_ids("def f(x):\n", "\n"), max_new_tokens=12, stop_token_ids=stop_ids))
    assert text == ref
    # a bias that makes <|file_sep|> the greedy choice at once: FIM ends there ("stop"), plain generation does not
    sep = qeng.tokenizer.token_to_id("<|file_sep|>")
    _, chunks = _run(qeng.fim("a", "b", max_new_tokens=5, logit_bias={sep: 100.0}))
    assert chunks[-1].finish_reason == "stop" and chunks[-1].token_ids == [sep] and len(chunks) == 1


def test_fim_unsupported_without_tokens(no_fim_model_path, tmp_path):
    """A file whose tokenizer has no FIM tokens: FimUnsupported in Python, a 400 fim_unsupported from the server."""
    import httpx
    from nanoqwen_rt import Engine, FimUnsupported
    with Engine(no_fim_model_path, device="cpu") as eng:
        assert eng.tokenizer.token_to_id("<|fim_prefix|>") is None
        with pytest.raises(FimUnsupported, match="fill-in-the-middle"):
            eng.fim("a", "b")
    with running_server(no_fim_model_path, tmp_path / "server.log", "--model-name", "no-fim") as (base, _):
        r = httpx.post(base + "/v1/completions", json={"model": "no-fim", "prompt": "x", "suffix": "y"},
                       timeout=HANG_GUARD_S)
    assert r.status_code == 400 and r.json()["error"]["code"] == "fim_unsupported", r.text


def test_logprobs_match_cpu_oracle(qeng):
    prompt = qeng.tokenizer.encode("import numpy as np\n")
    _, chunks = _run(qeng.generate(prompt, max_new_tokens=6, logprobs=5, stop_token_ids=[]))
    gen = [c.token_ids[0] for c in chunks]
    lps = [lp for c in chunks for lp in c.logprobs]   # a token of held-back text has its entry in a later chunk
    ref = qeng.logits(prompt + gen[:-1])[len(prompt) - 1:]                        # (6, vocab_rows)
    for i, (t, lp) in enumerate(zip(gen, lps)):
        want = log_softmax(ref[i])
        assert lp.token_id == t == int(np.argmax(ref[i]))                             # greedy: the top token
        assert abs(lp.logprob - want[t]) < LOGPROB_TOL
        assert [j for j, _ in lp.top][0] == t and len(lp.top) == 5
        np.testing.assert_allclose([v for _, v in lp.top], want[[j for j, _ in lp.top]], atol=LOGPROB_TOL)
    # without logprobs the same greedy ids come out (the host-steered path and the plain path agree)
    _, plain = _run(qeng.generate(prompt, max_new_tokens=6, stop_token_ids=[]))
    assert [c.token_ids[0] for c in plain] == gen


def test_logit_bias_forces_a_token(qeng):
    target = qeng.tokenizer.encode(" banana")[0]
    _, chunks = _run(qeng.generate("x", max_new_tokens=4, logit_bias={target: 100.0}, stop_token_ids=[]))
    assert [c.token_ids[0] for c in chunks] == [target] * 4
    # a strong frequency penalty then takes it away after its first use
    _, chunks = _run(qeng.generate("x", max_new_tokens=3, logit_bias={target: 5.0}, frequency_penalty=2.0,
                                   presence_penalty=2.0, stop_token_ids=[]))
    assert [c.token_ids[0] for c in chunks].count(target) <= 2


@pytest.mark.parametrize("schema", SCHEMAS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_outputs_validate(qeng, schema, temperature):
    text, chunks = _run(qeng.generate("Answer in JSON:", max_new_tokens=120, temperature=temperature, seed=5,
                                      constraint=qeng.json_constraint(schema)))
    assert chunks[-1].finish_reason == "stop", text
    jsonschema.validate(json.loads(text), schema)


def test_bad_schema_is_a_named_error(qeng):
    from nanoqwen_rt import InvalidGrammar
    with pytest.raises(InvalidGrammar):
        qeng.json_constraint({"type": "object", "properties": {"a": {"type": "no-such-type"}}})


# ------------------------------------------------------------------ the real server, openai client

@pytest.fixture(scope="module")
def qserver(qpath, tmp_path_factory):
    log_path = tmp_path_factory.mktemp("qserver") / "server.log"
    with running_server(qpath, log_path, "--model-name", MODEL, "--log-level", "warning") as (base, proc):
        yield base


@pytest.fixture(scope="module")
def qclient(qserver):
    return openai.OpenAI(base_url=qserver + "/v1", api_key="unused", max_retries=0, timeout=HANG_GUARD_S)


def test_server_fim_equals_engine(qclient, qeng):
    pre, suf = "def mean(xs):\n    ", "\n    return total / len(xs)\n"
    ref, chunks = _run(qeng.fim(pre, suf, max_new_tokens=16))
    r = qclient.completions.create(model=MODEL, prompt=pre, suffix=suf, max_tokens=16, temperature=0)
    assert r.choices[0].text == ref and r.choices[0].finish_reason == chunks[-1].finish_reason
    assert r.usage.prompt_tokens == len(qeng.fim_ids(pre, suf))
    streamed = list(qclient.completions.create(model=MODEL, prompt=pre, suffix=suf, max_tokens=16, temperature=0,
                                               stream=True))
    assert "".join(c.choices[0].text for c in streamed) == ref


# The server's engine and the test's are two CPU backends on one file: their float32 sums may associate differently
# (numpy's BLAS thread count is process-wide state the prefill changes while it runs), so logits agree to a few
# float32 ulps, not bit for bit: ~1e-6 seen on logprobs of magnitude ~10 (2^-23 x 10 x a few); 1e-5 allowed. A
# logprob computed from the wrong logits or by a wrong log-softmax is off by > 1e-2.
LOGPROB_ATOL = 1e-5


def test_server_logprobs_equal_engine(qclient, qeng):
    ref, chunks = _run(qeng.generate("x = ", max_new_tokens=5, logprobs=3))
    lps = [lp for c in chunks for lp in (c.logprobs or [])]
    r = qclient.completions.create(model=MODEL, prompt="x = ", max_tokens=5, temperature=0, logprobs=3)
    got = r.choices[0].logprobs
    assert r.choices[0].text == ref
    assert np.allclose(got.token_logprobs, [lp.logprob for lp in lps], rtol=0, atol=LOGPROB_ATOL)
    assert [len(t) for t in got.top_logprobs] == [len({qeng.tokenizer.token_bytes(i) for i, _ in lp.top})
                                                  for lp in lps]
    c = qclient.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                        temperature=0, logprobs=True, top_logprobs=2)
    cref, cchunks = _run(qeng.chat([{"role": "user", "content": "hi"}], max_new_tokens=4, logprobs=2))
    clps = [lp for ch in cchunks for lp in (ch.logprobs or [])]
    content = c.choices[0].logprobs.content
    assert [e.logprob for e in content] == pytest.approx([lp.logprob for lp in clps], abs=LOGPROB_ATOL)
    assert b"".join(bytes(e.bytes) for e in content).decode() == cref
    assert all(len(e.top_logprobs) == 2 for e in content)
    streamed = list(qclient.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                    max_tokens=4, temperature=0, logprobs=True, stream=True))
    s_lps = [e.logprob for ch in streamed if ch.choices and ch.choices[0].logprobs
             for e in ch.choices[0].logprobs.content]
    assert s_lps == pytest.approx([lp.logprob for lp in clps], abs=LOGPROB_ATOL)


def test_server_n_and_echo(qclient, qeng):
    r = qclient.completions.create(model=MODEL, prompt="def f():", max_tokens=6, temperature=1.0, seed=9, n=3,
                                   echo=True, extra_body={"ignore_eos": True})
    assert [c.index for c in r.choices] == [0, 1, 2]
    for i, c in enumerate(r.choices):
        ref, _ = _run(qeng.generate("def f():", max_new_tokens=6, temperature=1.0, seed=9 + i, stop_token_ids=[]))
        assert c.text == "def f():" + ref
    assert r.usage.completion_tokens == 18
    streamed = list(qclient.completions.create(model=MODEL, prompt="def f():", max_tokens=6, temperature=1.0,
                                               seed=9, n=2, stream=True, extra_body={"ignore_eos": True}))
    for i in range(2):
        ref, _ = _run(qeng.generate("def f():", max_new_tokens=6, temperature=1.0, seed=9 + i, stop_token_ids=[]))
        assert "".join(c.choices[0].text for c in streamed if c.choices[0].index == i) == ref
        assert [c.choices[0].finish_reason for c in streamed if c.choices[0].index == i][-1] == "length"


def test_server_echo_of_token_ids_keeps_special_tokens(qclient, qeng):
    """echo of a token-id prompt is the prompt's text as given, special tokens included (as a text prompt's echo)."""
    tok = qeng.tokenizer
    ids = [tok.token_to_id("<|im_start|>"), *tok.encode("x"), tok.token_to_id("<|im_end|>")]
    assert None not in ids
    r = qclient.completions.create(model=MODEL, prompt=ids, max_tokens=1, temperature=0, echo=True)
    assert r.choices[0].text.startswith("<|im_start|>x<|im_end|>")


def test_logprobs_follow_the_text_a_stop_string_cuts(qeng):
    """A stop string that begins inside token k and ends two tokens later: the text ends inside token k, and the
    logprobs are those of tokens 0..k, the tokens whose text is emitted (in part); the two after the cut, whose
    text was held back as a stop prefix, are not reported (they were)."""
    tok = qeng.tokenizer
    for seed in range(20):   # random weights: find a run of three ASCII tokens, the first of two chars or more
        kw = dict(max_new_tokens=32, temperature=1.0, seed=seed, stop_token_ids=[], logprobs=0)
        text, chunks = _run(qeng.generate("x", **kw))
        ids = [lp.token_id for c in chunks for lp in c.logprobs]
        pieces = [tok.decode([i]) for i in ids]
        starts = np.cumsum([0] + [len(p) for p in pieces])
        ok = [k for k in range(len(ids) - 2) if len(pieces[k]) >= 2 and all(
            p.isascii() and p.isprintable() and p for p in pieces[k:k + 3])]
        for k in ok:
            stop = pieces[k][1:] + pieces[k + 1] + pieces[k + 2][:1]
            if "".join(pieces) == text and text.find(stop) == starts[k] + 1:
                break
        else:
            continue
        cut_text, cut_chunks = _run(qeng.generate("x", **{**kw, "stop": [stop]}))
        assert cut_text == text[:starts[k] + 1]
        assert [lp.token_id for c in cut_chunks for lp in c.logprobs] == ids[:k + 1]
        assert cut_chunks[-1].finish_reason == "stop"
        return
    pytest.fail("no seed gave three ASCII tokens in a row")


def test_server_penalties_and_bias_equal_engine(qclient, qeng):
    target = qeng.tokenizer.encode(" banana")[0]
    kw = dict(max_new_tokens=5, logit_bias={target: 6.0}, presence_penalty=1.5, frequency_penalty=0.5)
    ref, _ = _run(qeng.generate("x", **kw))
    r = qclient.completions.create(model=MODEL, prompt="x", max_tokens=5, temperature=0,
                                   logit_bias={str(target): 6.0}, presence_penalty=1.5, frequency_penalty=0.5)
    assert r.choices[0].text == ref


@pytest.mark.parametrize("schema", SCHEMAS[:3])
def test_server_json_schema(qclient, schema):
    for stream in (False, True):
        kw = dict(model=MODEL, messages=[{"role": "user", "content": "JSON please"}], max_tokens=120,
                  temperature=1.0, seed=3, response_format={"type": "json_schema",
                                                            "json_schema": {"name": "s", "schema": schema}})
        if stream:
            chunks = list(qclient.chat.completions.create(stream=True, **kw))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        else:
            r = qclient.chat.completions.create(**kw)
            text, finish = r.choices[0].message.content, r.choices[0].finish_reason
        assert finish == "stop", text
        jsonschema.validate(json.loads(text), schema)


def test_server_bad_schema_is_400(qclient):
    with pytest.raises(openai.BadRequestError):
        qclient.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], response_format={
            "type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "no-such-type"}}})


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string", "maxLength": 16},
                                          "unit": {"enum": ["C", "F"]}}, "required": ["city", "unit"]}}},
    {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}},
]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_server_forced_tool_call(qclient, qeng, choice):
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    r = qclient.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, tool_choice=choice, max_tokens=80,
                                        temperature=0)
    assert r.choices[0].finish_reason == "tool_calls"
    calls = r.choices[0].message.tool_calls
    assert len(calls) == 1
    names = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    if isinstance(choice, dict):
        assert calls[0].function.name == "get_weather"
    jsonschema.validate(json.loads(calls[0].function.arguments), names[calls[0].function.name])
    # the tools went through the model's own template: the prompt is exactly Engine.render_chat's
    assert r.usage.prompt_tokens == len(qeng.tokenizer.encode(qeng.render_chat(msgs, TOOLS)))
    chunks = list(qclient.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, tool_choice=choice,
                                                  max_tokens=80, temperature=0, stream=True))
    deltas = [tc for c in chunks if c.choices and c.choices[0].delta.tool_calls for tc in c.choices[0].delta.tool_calls]
    assert [(d.function.name, d.function.arguments) for d in deltas] == \
        [(c.function.name, c.function.arguments) for c in calls]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    # the conversation continues with the call and its result, rendered by the template
    follow = msgs + [{"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in calls]},
                     {"role": "tool", "tool_call_id": calls[0].id, "content": '{"temp": 21}'}]
    r2 = qclient.chat.completions.create(model=MODEL, messages=follow, tools=TOOLS, max_tokens=5, temperature=0)
    assert r2.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_server_auto_tools_render_through_template(qclient, qeng):
    msgs = [{"role": "user", "content": "hello"}]
    r = qclient.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, max_tokens=8, temperature=0)
    rendered = qeng.render_chat(msgs, TOOLS)
    assert "<tools>" in rendered and '"name": "get_weather"' in rendered
    assert r.usage.prompt_tokens == len(qeng.tokenizer.encode(rendered))
    ref, _ = _run(qeng.generate(rendered, max_new_tokens=8))
    parsed = parse_tool_calls(ref)
    assert (r.choices[0].message.content or "") == (parsed.content if parsed.tool_calls else ref)


def test_engine_tool_choice_on_both_kinds_of_file(qeng, engine):
    """Engine.render_chat / tool_choice_grammar / chat with tool_choice, on a Qwen2.5 file (tools section,
    `<tool_call>` tokens: matched by id) and on the demo's file (neither: markers as text, "auto" refused)."""
    from nanoqwen_rt import InvalidArgument, ToolsUnsupported
    from nanoqwen_rt.tools import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert qeng.tokenizer.renders_tools
    ids = [qeng.tokenizer.token_to_id(t) for t in (TOOL_CALL_OPEN, TOOL_CALL_CLOSE)]
    grammar = qeng.tool_choice_grammar(TOOLS, named)
    assert all(f"<[{i}]>" in grammar for i in ids) and TOOL_CALL_OPEN not in grammar
    for choice in (None, "auto", "required", named):
        assert qeng.render_chat(msgs, TOOLS, choice) == qeng.render_chat(msgs, TOOLS) != qeng.render_chat(msgs)
    assert qeng.render_chat(msgs, TOOLS, "none") == qeng.render_chat(msgs)
    assert qeng.tool_choice_grammar(TOOLS, "auto") is None and qeng.tool_choice_grammar(None, None) is None

    if engine.tokenizer.renders_tools:
        pytest.skip("this test model's chat template has a tools section (NANOQWEN_TEST_MODEL)")
    assert engine.tokenizer.token_to_id(TOOL_CALL_OPEN) is None
    grammar = engine.tool_choice_grammar(TOOLS, "required")
    assert json.dumps(TOOL_CALL_OPEN) in grammar and json.dumps(TOOL_CALL_CLOSE) in grammar and "<[" not in grammar
    for choice in (None, "auto"):
        with pytest.raises(ToolsUnsupported, match="tools section"):
            engine.render_chat(msgs, TOOLS, choice)
    for choice in ("none", "required", named):           # forced: the grammar, not the prompt, carries the tools
        assert engine.render_chat(msgs, TOOLS, choice) == engine.render_chat(msgs)
    text = "".join(c.text for c in engine.chat(msgs, TOOLS, named, max_new_tokens=100))
    (call,) = parse_tool_calls(text).tool_calls
    assert call["function"]["name"] == "get_weather"
    jsonschema.validate(json.loads(call["function"]["arguments"]), TOOLS[0]["function"]["parameters"])
    with pytest.raises(InvalidArgument, match="constraint"):
        engine.chat(msgs, TOOLS, "required", constraint=engine.json_constraint())
    for tools, choice in ((TOOLS, "always"), (TOOLS, {"type": "function", "function": {"name": "nope"}}),
                          (None, "required"), ([{"type": "function"}], "required")):
        with pytest.raises(InvalidArgument):
            engine.chat(msgs, tools, choice)


def test_limits_match_the_c_header():
    """The Python edge checks the same limits the C ABI checks again (csrc/include/nanoqwen.h)."""
    import re
    from pathlib import Path
    from nanoqwen_rt.logits import MAX_LOGIT_BIAS, MAX_TOP_LOGPROBS
    header = (Path(__file__).resolve().parent.parent / "csrc" / "include" / "nanoqwen.h").read_text()
    defines = dict(re.findall(r"#define (NQ_MAX_\w+) (\d+)", header))
    assert int(defines["NQ_MAX_TOP_LOGPROBS"]) == MAX_TOP_LOGPROBS
    assert int(defines["NQ_MAX_LOGIT_BIAS"]) == MAX_LOGIT_BIAS
    from nanoqwen_rt.backends.cuda.abi import NQ_MAX_BATCH
    assert int(defines["NQ_MAX_BATCH"]) == NQ_MAX_BATCH


def test_cli_run_suffix(qpath, qeng, no_fim_model_path):
    """`nanoqwen run --suffix`: the FIM middle on stdout, equal to Engine.fim; a file without FIM tokens: exit 1
    with one line on stderr."""
    import subprocess
    import sys
    pre, suf = "def area(r):\n    ", "\n    return a\n"
    p = subprocess.run([sys.executable, "-m", "nanoqwen_rt.cli", "run", qpath, "-p", pre, "--suffix", suf,
                        "--max-new-tokens", "10", "--device", "cpu"], capture_output=True, text=True,
                       timeout=HANG_GUARD_S)
    assert p.returncode == 0, p.stderr
    assert p.stdout == "".join(c.text for c in qeng.fim(pre, suf, max_new_tokens=10)) + "\n"
    p = subprocess.run([sys.executable, "-m", "nanoqwen_rt.cli", "run", no_fim_model_path, "-p", "a", "--suffix",
                        "b", "--device", "cpu"], capture_output=True, text=True, timeout=HANG_GUARD_S)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 1 and len(lines) == 1 and "FimUnsupported" in lines[0], p.stderr
    p = subprocess.run([sys.executable, "-m", "nanoqwen_rt.cli", "run", qpath, "-p", "a", "--suffix", "b", "--chat"],
                       capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert p.returncode == 2 and "--suffix" in p.stderr
