"""`nanoqwen` CLI on the real Engine (CPU backend, the test model of tests/test_server_model.py).

Outputs are compared with Engine.generate / Engine.chat on the same file (never hard-coded). Most cases run
in process with click's CliRunner (the engine's numba kernels stay warm); the ones that need a real process
(stdout/stderr of `python -m nanoqwen_rt.cli`, a real SIGINT) use subprocess.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from click.testing import CliRunner

import nanoqwen_rt.cli.commands as cli
from nanoqwen_rt.cli.line_reader import LineReader
from nanoqwen_format import open_file
from nanoqwen_rt import Engine
from process_helpers import as_from_a_terminal, wait_for_mapped
from test_server_model import HANG_GUARD_S, PROMPT


def _ref(engine, prompt=None, messages=None, **kw):
    it = engine.chat(messages, **kw) if messages is not None else engine.generate(prompt, **kw)
    return "".join(c.text for c in it)


def _invoke(*args, input=None):
    return CliRunner().invoke(cli.main, list(args), input=input, catch_exceptions=False)


def _subprocess(*args, input=None):
    return subprocess.run([sys.executable, "-m", "nanoqwen_rt.cli", *args], input=input, capture_output=True,
                          text=True, timeout=HANG_GUARD_S)


def _one_line_error(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one error line, got:\n{stderr}"
    assert "Traceback" not in stderr
    return lines[0]


# ------------------------------------------------------------------ run


def test_run_subprocess_greedy_equals_engine_and_prints_stats(model_path, engine):
    """The quick-start command: streams the completion to stdout, device/TTFT/tokens/s on stderr."""
    p = _subprocess("run", model_path, "-p", PROMPT, "--max-new-tokens", "24", "--device", "cpu")
    assert p.returncode == 0, p.stderr
    assert p.stdout == _ref(engine, PROMPT, max_new_tokens=24, temperature=0.0) + "\n"
    stats = p.stderr.strip().splitlines()[-1]
    assert "device=cpu" in stats and "TTFT=" in stats and "tokens/s" in stats
    n_prompt = len(engine.tokenizer.encode(PROMPT))
    assert f"prompt={n_prompt} tokens" in stats
    assert "Traceback" not in p.stderr


def test_run_prompt_from_stdin(model_path, engine):
    r = _invoke("run", model_path, "-p", "-", "-n", "12", "--device", "cpu", input=PROMPT)
    assert r.exit_code == 0, r.stderr
    assert r.stdout == _ref(engine, PROMPT, max_new_tokens=12, temperature=0.0) + "\n"


def test_run_chat_flag_uses_chat_template(model_path, engine):
    r = _invoke("run", model_path, "--chat", "--system", "Be brief.", "-p", "sort a list", "-n", "12",
                "--device", "cpu")
    assert r.exit_code == 0, r.stderr
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "sort a list"}]
    assert r.stdout == _ref(engine, messages=msgs, max_new_tokens=12, temperature=0.0) + "\n"


def test_run_stop_and_seeded_sampling(model_path, engine):
    full = _ref(engine, PROMPT, max_new_tokens=24, temperature=0.0)
    assert len(full) >= 6, full
    stop = full[len(full) // 2: len(full) // 2 + 2]
    r = _invoke("run", model_path, "-p", PROMPT, "-n", "24", "--stop", stop, "--stop", "\x00never", "--device",
                "cpu")
    assert r.exit_code == 0, r.stderr
    assert r.stdout == full[:full.find(stop)] + "\n"
    assert "finish=stop" in r.stderr

    args = ["--temperature", "0.9", "--top-k", "40", "--top-p", "0.8", "--seed", "77"]
    r = _invoke("run", model_path, "-p", PROMPT, "-n", "16", "--device", "cpu", *args)
    assert r.exit_code == 0, r.stderr
    assert r.stdout == _ref(engine, PROMPT, max_new_tokens=16, temperature=0.9, top_k=40, top_p=0.8, seed=77) + "\n"


# ------------------------------------------------------------------ info


def test_info_json_matches_reader(model_path):
    r = _invoke("info", model_path, "--json")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    with open_file(model_path) as f:
        assert d["config"] == f.config.to_dict()
        assert d["file_size"] == os.path.getsize(model_path)
        assert {t["name"]: (tuple(t["shape"]), t["nbytes"]) for t in d["tensors"]} == \
            {n: (tuple(t.shape), t.nbytes) for n, t in f.tensors.items()}
        assert d["parameters"] == sum(int(np.prod(t.shape)) for t in f.tensors.values())
        assert sum(a["nbytes"] for a in d["by_dtype"].values()) == sum(t.nbytes for t in f.tensors.values())
        assert {b["kind"] for b in d["blobs"]} == {k.name.lower() for k in f.blob_kinds}
    assert d["checksums"] == "verified"
    assert isinstance(d["provenance"], dict) and d["provenance"]


def test_info_text_lists_everything(model_path):
    r = _invoke("info", model_path)
    assert r.exit_code == 0, r.stderr
    with open_file(model_path) as f:
        for name in f.tensors:
            assert name in r.stdout
        assert "hidden_size" in r.stdout and str(f.config.hidden_size) in r.stdout
    assert "provenance:" in r.stdout and "int4g" in r.stdout


# ------------------------------------------------------------------ bad input: one line, non-zero, no traceback


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory, model_path):
    d = tmp_path_factory.mktemp("bad")
    (d / "notes.txt").write_text("this is not a model\n" * 20)
    raw = open(model_path, "rb").read()
    (d / "truncated.nanoqwen").write_bytes(raw[: len(raw) // 2])
    os.mkfifo(d / "fifo.nanoqwen")   # open() would block on it until a writer came: refused before any open
    return d


@pytest.mark.parametrize("case", ["missing", "directory", "text", "truncated", "fifo"])
def test_bad_model_files(case, bad_files, model_path):
    path = {"missing": str(bad_files / "nope.nanoqwen"), "directory": str(bad_files),
            "text": str(bad_files / "notes.txt"), "truncated": str(bad_files / "truncated.nanoqwen"),
            "fifo": str(bad_files / "fifo.nanoqwen")}[case]
    for args in (["run", path, "-p", "x"], ["info", path], ["chat", path], ["serve", path, "--port", "1"]):
        r = _invoke(*args)
        assert r.exit_code == 1, (args, r.stderr)
        line = _one_line_error(r.stderr)
        assert path in line
        assert r.stdout == ""


@pytest.mark.parametrize("flags", [
    ["--temperature", "-1"], ["--top-p", "0"], ["--top-p", "1.5"], ["--max-new-tokens", "0"], ["--top-k", "-2"],
    ["--device", "tpu"], ["--seed", "-3"], ["--stop", ""], ["--max-context", "0"], ["--no-such-flag"],
    ["--system", "s"],
])
def test_bad_flag_values(flags, model_path):
    r = _invoke("run", model_path, "-p", "x", *flags)
    assert r.exit_code == 2, r.stderr
    assert "error" in _one_line_error(r.stderr)


def test_bad_serve_flags(model_path):
    # keys no HTTP client sends as typed (clients trim a header's spaces; other characters go as bytes the key
    # would never match): refused at start instead of a server nobody can use
    for flags in (["--port", "70000"], ["--queue-size", "0"], ["--api-key", " "], ["--api-key", " padded "],
                  ["--api-key", "s3cret\n"], ["--api-key", "ключ-1"], ["--api-key", "s3cret-ké"]):
        r = _invoke("serve", model_path, *flags)
        assert r.exit_code == 2, r.stderr
        _one_line_error(r.stderr)


def test_serve_port_in_use(model_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        r = _invoke("serve", model_path, "--port", str(port))
    assert r.exit_code == 1
    assert f"127.0.0.1:{port}" in _one_line_error(r.stderr)


def test_prompt_longer_than_context(model_path):
    r = _invoke("run", model_path, "-p", "x " * 40, "--max-context", "8", "--device", "cpu")
    assert r.exit_code == 1
    assert "context" in _one_line_error(r.stderr)
    r = _invoke("run", model_path, "-p", "", "--device", "cpu")
    assert r.exit_code == 1
    assert "empty" in _one_line_error(r.stderr)


def test_bad_input_in_a_real_process_has_no_traceback(bad_files):
    p = _subprocess("run", str(bad_files / "notes.txt"), "-p", "x")
    assert p.returncode == 1
    assert "not a valid .nanoqwen" in _one_line_error(p.stderr)


def test_bench_on_cpu_small(model_path, tmp_path):
    """bench runs the Engine part on the CPU (GPU ceilings/peers are skipped there) and writes its JSON."""
    out = tmp_path / "bench.json"
    r = _invoke("bench", model_path, "--no-peers", "--device", "cpu", "--prompt-tokens", "8", "--new-tokens", "4",
                "--repeats", "1", "--json", str(out))
    assert r.exit_code == 0, r.stderr
    assert "TTFT" in r.stdout
    d = json.loads(out.read_text())
    assert d["engine"]["prompt_tokens"] == 8 and d["engine"]["new_tokens"] == 4
    assert d["engine"]["deterministic"] is True
    r = _invoke("bench", model_path, "--no-peers", "--device", "cpu", "--prompt-tokens", "100000")
    assert r.exit_code == 2
    assert "max_positions" in _one_line_error(r.stderr)


def test_bench_concurrency_on_cpu_small(model_path, tmp_path):
    """bench --concurrency: every level through Engine.submit on the CPU backend, with the single stream at 1;
    the JSON's numbers are consistent with each other (each stream got every token, batches within the level)."""
    out = tmp_path / "conc.json"
    r = _invoke("bench", model_path, "--device", "cpu", "--concurrency", "1,3", "--prompt-tokens", "6",
                "--new-tokens", "5", "--repeats", "1", "--json", str(out))
    assert r.exit_code == 0, r.stderr
    assert "ITL p50" in r.stdout and "single stream (generate_ids)" in r.stdout
    d = json.loads(out.read_text())
    levels = d["concurrency"]["levels"]
    assert [x["concurrency"] for x in levels] == [1, 3]
    for x in levels:
        n = x["concurrency"]
        assert 1 <= x["batch_min"] <= x["batch_median"] <= x["batch_max"] <= n
        assert x["tokens_per_s"] > 0 and 0 < x["ttft_p50_ms"] <= x["ttft_p90_ms"] <= x["ttft_max_ms"]
        assert 0 < x["itl_p50_ms"] <= x["itl_p50_worst_ms"]
        assert x["wall_s"] * x["tokens_per_s"] == pytest.approx(n * 5)
    assert levels[1]["batch_max"] == 3 and levels[1]["steady_steps"] >= 1 and levels[1]["decode_tokens_per_s"] > 0
    assert d["single_stream"]["ms_per_token"] > 0 and d["single_stream"]["batch1_itl_vs_single"] > 0


@pytest.mark.parametrize("arg,why", [("0,8", "outside [1, 256]"), ("8,x", "'x' is not a positive integer"),
                                     ("8,8", "8 is given twice"), ("", "'' is not a positive integer"),
                                     ("300", "outside [1, 256]")])
def test_bench_concurrency_bad_levels_exit_with_one_line(model_path, arg, why):
    r = _invoke("bench", model_path, "--device", "cpu", "--concurrency", arg)
    assert r.exit_code == 2 and why in _one_line_error(r.stderr)


def test_bench_concurrency_refuses_plot(model_path, tmp_path):
    r = _invoke("bench", model_path, "--concurrency", "1", "--plot", str(tmp_path / "x.png"))
    assert r.exit_code == 2 and "--plot" in _one_line_error(r.stderr)


# ------------------------------------------------------------------ chat


def _answers(stdout: str) -> list[str]:
    """The assistant answers in a chat transcript ('you> ' prompts and 'assistant> ' prefixes on stdout)."""
    return [re.sub(r"\n(you> )*$", "", part) for part in stdout.split("assistant> ")[1:]]


def test_chat_multi_turn_and_reset(model_path, engine):
    kw = dict(max_new_tokens=10, temperature=0.0)
    script = "hello\nwrite a loop\n/reset\nhello\n/exit\n"
    p = _subprocess("chat", model_path, "-n", "10", "--device", "cpu", input=script)
    assert p.returncode == 0, p.stderr
    a = _answers(p.stdout)
    assert len(a) == 3
    u1, u2 = {"role": "user", "content": "hello"}, {"role": "user", "content": "write a loop"}
    assert a[0] == _ref(engine, messages=[u1], **kw)
    assert a[1] == _ref(engine, messages=[u1, {"role": "assistant", "content": a[0]}, u2], **kw)
    assert a[2] == a[0]                                    # /reset: the same first turn again
    assert "conversation cleared" in p.stderr


class _InterruptFirstAnswer:
    """The real Engine, except that the first generate() raises KeyboardInterrupt after two chunks: what
    Ctrl-C does to the CLI at that moment, made deterministic."""

    def __init__(self, eng):
        self._eng = eng
        self.calls = 0

    def __getattr__(self, name):
        return getattr(self._eng, name)

    def generate(self, *a, **kw):
        self.calls += 1
        it = self._eng.generate(*a, **kw)
        if self.calls > 1:
            return it

        def interrupted():
            for i, chunk in enumerate(it):
                if i == 2:
                    it.close()
                    raise KeyboardInterrupt
                yield chunk
        return interrupted()


def test_chat_ctrl_c_stops_the_answer_not_the_program(model_path, engine, monkeypatch):
    wrapped = {}

    def load(path, device, max_context):
        wrapped["e"] = _InterruptFirstAnswer(Engine(path, device="cpu"))
        return wrapped["e"]
    monkeypatch.setattr(cli, "load_engine", load)
    r = _invoke("chat", model_path, "-n", "10", input="hello\nagain\n/exit\n")
    assert r.exit_code == 0, r.stderr
    a = _answers(r.stdout)
    assert len(a) == 2 and a[0].endswith(" [stopped]")
    partial = a[0][: -len(" [stopped]")]
    first_two = "".join(c.text for c, _ in zip(engine.chat([{"role": "user", "content": "hello"}],
                                                           max_new_tokens=10, temperature=0.0), range(2)))
    assert partial == first_two
    history = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": partial},
               {"role": "user", "content": "again"}]
    assert a[1] == _ref(engine, messages=history, max_new_tokens=10, temperature=0.0)


def test_chat_sigint_at_the_prompt_keeps_running(model_path):
    """A real SIGINT while chat waits for input: a hint, then the next command still works."""
    proc = subprocess.Popen([sys.executable, "-m", "nanoqwen_rt.cli", "chat", model_path, "--device", "cpu"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=as_from_a_terminal)
    out = bytearray()

    def pump():
        while chunk := proc.stdout.read1(4096):
            out.extend(chunk)
    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + HANG_GUARD_S
        while b"you> " not in out:
            assert proc.poll() is None and time.monotonic() < deadline, "chat did not show its prompt"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + HANG_GUARD_S         # its own guard: start-up may have used the first one
        while out.count(b"you> ") < 2:                     # it prompts again instead of exiting
            assert proc.poll() is None, "chat exited on SIGINT"
            assert time.monotonic() < deadline, "chat did not prompt again after SIGINT"
            time.sleep(0.05)
        _, err = proc.communicate(b"/exit\n", timeout=HANG_GUARD_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    assert b"Ctrl-C" in err and b"Traceback" not in err


def test_line_reader_splits_lines_and_ends_with_eof(capsys):
    """The chat prompt's reader: whole lines in order from a real descriptor (several per read), the last
    unterminated line, then EOFError; UTF-8 split across writes is reassembled."""
    r, w = os.pipe()
    data = "first\nsecond line\r\nthird é".encode()
    os.write(w, data[:-1])
    os.write(w, data[-1:])
    os.close(w)
    reader = LineReader(r)
    try:
        assert [reader.readline("> ") for _ in range(3)] == ["first", "second line", "third é"]
        with pytest.raises(EOFError):
            reader.readline("> ")
    finally:
        os.close(r)
    assert capsys.readouterr().out == "> " * 4


def test_file_without_tokenizer(tmp_path):
    """A valid file that carries no tokenizer: info works, text commands refuse in one line."""
    from format_helpers import make_random_file
    path = str(tmp_path / "no-tokenizer.nanoqwen")
    make_random_file(path, blobs={})
    r = _invoke("info", path)
    assert r.exit_code == 0, r.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for args in (["run", path, "-p", "x", "--device", "cpu"], ["chat", path, "--device", "cpu"],
                 ["serve", path, "--device", "cpu", "--port", str(port)]):
        r = _invoke(*args)
        assert r.exit_code == 1, (args, r.stderr)
        assert "tokenizer" in _one_line_error(r.stderr)


def test_run_ctrl_c_prints_what_it_has_and_exits_130(model_path, engine, monkeypatch):
    monkeypatch.setattr(cli, "load_engine", lambda path, device, max_context: _InterruptFirstAnswer(
        Engine(path, device="cpu")))
    r = _invoke("run", model_path, "-p", PROMPT, "-n", "10")
    assert r.exit_code == cli.EXIT_INTERRUPTED
    first_two = "".join(c.text for c, _ in zip(engine.generate(PROMPT, max_new_tokens=10, temperature=0.0),
                                               range(2)))
    assert r.stdout == first_two + "\n"
    assert "finish=interrupted" in r.stderr and "Traceback" not in r.stderr


# ------------------------------------------------------------------ every command, bad input, a real process

def _bad_input_table(model, notes, missing):
    """(args, stdin bytes, stdout to /dev/full?, expected exit code)."""
    return [
        (["run", model, "-p", "-"], b"def \xff(", False, 1),                  # invalid UTF-8 on stdin
        (["run", model, "-p", "def f(\udcff)"], None, False, 1),               # undecodable argv → lone surrogate
        (["run", model, "-p", "x", "-n", "3"], None, True, 1),                 # output to a full device
        (["run", model, "-p", "x", "--threads", "-3"], None, False, 2),
        (["run", model, "-p", "x", "--max-new-tokens", "-3"], None, False, 2),
        (["run", missing, "-p", "x"], None, False, 1),
        (["chat", model, "--top-p", "2"], None, False, 2),
        (["chat", notes], None, False, 1),
        (["info", missing], None, False, 1),
        (["info", model], None, True, 1),                                      # output to a full device
        (["bench", model, "--json", "/missing/dir/x.json"], None, False, 2),  # refused before the benchmark
        (["bench", notes], None, False, 1),
        (["serve", model, "--port", "70000"], None, False, 2),
        (["serve", model, "--read-timeout", "-1"], None, False, 2),
        (["serve", notes, "--port", "1"], None, False, 1),
        (["no-such-command"], None, False, 2),
    ]


def test_every_command_with_bad_input_prints_one_line_and_fails(model_path, bad_files):
    env = {**os.environ, "PYTHONIOENCODING": "utf-8:surrogateescape"}
    for args, stdin, to_full, code in _bad_input_table(model_path, str(bad_files / "notes.txt"),
                                                        str(bad_files / "nope.nanoqwen")):
        argv = [a.encode("utf-8", "surrogateescape") for a in [sys.executable, "-m", "nanoqwen_rt.cli", *args]]
        with open("/dev/full", "wb") as full:
            p = subprocess.run(argv, input=stdin if stdin is not None else b"", stdout=full if to_full else
                               subprocess.PIPE, stderr=subprocess.PIPE, timeout=HANG_GUARD_S, env=env)
        err = p.stderr.decode("utf-8", "replace")
        # `run` reports its device/prompt on stderr before it writes (the full-device cases): a status line,
        # not an error line
        lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("[nanoqwen] ")]
        assert "Traceback" not in err, (args, err)
        assert len(lines) == 1, (args, err)
        assert p.returncode == code, (args, p.returncode, err)
        if to_full:
            assert "cannot write the output" in lines[0], (args, err)


@pytest.mark.parametrize("args,closed,what", [
    (["chat", "{model}"], 0, "stdin"), (["run", "{model}", "-p", "-"], 0, "stdin"),
    (["run", "{model}", "-p", "x", "--suffix", "-"], 0, "stdin"), (["run", "{model}", "-p", "x"], 1, "stdout"),
    (["chat", "{model}"], 1, "stdout"), (["info", "{model}"], 1, "stdout")])
def test_closed_stdin_or_stdout_is_one_line(args, closed, what, model_path):
    """A shell's `<&-` / `>&-` leaves Python's sys.stdin / sys.stdout None: a command that needs the stream says
    so in one line (it raised AttributeError / RuntimeError, or `info` printed nothing and exited 0)."""
    argv = [sys.executable, "-m", "nanoqwen_rt.cli", *[a.format(model=model_path) for a in args]]
    p = subprocess.run(argv, stdin=subprocess.DEVNULL if closed != 0 else None, stderr=subprocess.PIPE,
                       stdout=subprocess.DEVNULL if closed != 1 else None, preexec_fn=lambda: os.close(closed),
                       timeout=HANG_GUARD_S, text=True)
    line = _one_line_error(p.stderr)
    assert p.returncode == 1 and f"{what} is closed" in line, (p.returncode, p.stderr)


def test_ctrl_c_during_start_up_has_no_traceback(model_path):
    """SIGINT while the command is still importing / loading the model: one line and exit 130, never a
    traceback. (A SIGINT before the interpreter has finished its own start-up, the `site` import, is Python's
    business: it aborts before any code of ours runs, so the signals here wait for our imports to begin.)"""
    for needle in ("_multiarray_umath", "numba"):      # numpy's and numba's extension modules: engine imports
        for _attempt in range(3):
            p = subprocess.Popen([sys.executable, "-m", "nanoqwen_rt.cli", "run", model_path, "-p", "x", "-n", "2000"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=as_from_a_terminal)
            assert wait_for_mapped(p.pid, needle, HANG_GUARD_S), needle
            if p.poll() is not None:     # this test's own process was descheduled past the child's whole run
                p.communicate()
                continue
            p.send_signal(signal.SIGINT)
            out, err = p.communicate(timeout=HANG_GUARD_S)
            text = err.decode("utf-8", "replace")
            # the signal landed after the run had finished and reported (a loaded 2-core machine can deschedule this
            # process between poll() and the signal for the child's whole sub-second run): not the case under test
            if p.returncode == 0 and "finish=" in text:
                continue
            break
        else:
            raise AssertionError(f"{needle}: the child finished three times before it could be signalled")
        assert "Traceback" not in text, (needle, text)
        # 130 from our handler; or, after our handler's line, death by SIGINT itself (-2 here), which a shell
        # reports as the same status 130. Seen ~1 run in 6 on this 2-core VM with the interrupt landing inside
        # numba's import (session 40, also with session 39's code): the user sees the one line and status 130
        # either way.
        assert p.returncode in (cli.EXIT_INTERRUPTED, -signal.SIGINT), (needle, p.returncode, text)
        assert "interrupted" in text
