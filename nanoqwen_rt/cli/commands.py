"""`nanoqwen` command line: run, chat, bench, info, serve (the console script `nanoqwen`, and
`python -m nanoqwen_rt.cli`). `info` renders with info.py, `chat` reads lines with line_reader.py, `serve` runs
nanoqwen_rt.serve, `bench` runs nanoqwen_bench.

Every expected failure (missing file, not a .nanoqwen, prompt over the context, bad flag values) ends with ONE
line on stderr (`nanoqwen: error: ...`, or `nanoqwen <cmd>: error: ...` for a bad flag) and a non-zero exit:
2 for usage errors (bad flags/values), 1 for everything else, 130 after Ctrl-C. Generated text goes to stdout;
everything else (device, stats) to stderr, so
`nanoqwen run ... > out.txt` captures only the completion.
"""
from __future__ import annotations

import functools
import json
import sys
from typing import NoReturn

import click

from ..backends.cuda.backend import KV_FREE_MEMORY_FRACTION
from ..kv_pool import KV_PAGE_TOKENS
from ..scheduler import CPU_KV_BUDGET_BYTES, DEFAULT_MAX_BATCH
from ..serve.adapter import LoadError, load_engine, require_file
from .info import file_info, format_info
from .line_reader import input_function

DEFAULT_MAX_NEW_TOKENS = 128
DEFAULT_CHAT_MAX_NEW_TOKENS = 512
EXIT_INTERRUPTED = 130       # 128 + SIGINT, the shell convention
# serve: seconds a client has for a request's headers, then for its body (slow clients must not hold a
# connection forever); a real client sends either in one write, so 30 s only ever cuts the stuck.
DEFAULT_READ_TIMEOUT_S = 30.0
# serve: seconds an idle keep-alive connection stays open (uvicorn's default).
DEFAULT_KEEP_ALIVE_S = 5


class _OneLineErrors(click.Group):
    """A click group whose errors print as one line (no usage dump, no traceback)."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as e:      # bare `nanoqwen`: show the help, exit 2
            click.echo(e.format_message(), err=True)
            sys.exit(2)
        except click.UsageError as e:
            where = e.ctx.command_path if e.ctx is not None else "nanoqwen"
            click.echo(f"{where}: error: {_flat(e.format_message())} (see '{where} --help')", err=True)
            sys.exit(e.exit_code)
        except click.ClickException as e:
            click.echo(f"nanoqwen: error: {_flat(e.format_message())}", err=True)
            sys.exit(e.exit_code)
        except (click.exceptions.Abort, KeyboardInterrupt):
            click.echo("\nnanoqwen: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except OSError as e:      # writing the output failed (a full device, a closed pipe), or a file we write
            where = "cannot write the output: " if _quiet_broken_stdout() else ""
            click.echo(f"nanoqwen: error: {where}{_os_error_text(e)}", err=True)
            sys.exit(1)
        sys.exit(0)


def _os_error_text(e: OSError) -> str:
    where = f"{e.filename}: " if getattr(e, "filename", None) else ""
    return _flat(f"{where}{e.strerror or e}")


def _quiet_broken_stdout(force: bool = False) -> bool:
    """If stdout cannot take more output (or `force`: the caller saw it fail), point it at /dev/null, so the
    interpreter's final flush does not print a second, multi-line error. True when it did."""
    import os
    if not force:
        try:
            sys.stdout.flush()
            return False
        except OSError:
            pass
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
    return True


def _output_failed(e: OSError) -> click.ClickException:
    """Writing to stdout failed (a full device, a closed pipe): one line, and stdout muted for the exit flush."""
    _quiet_broken_stdout(force=True)
    return _fail(f"cannot write the output: {_os_error_text(e)}")


def _require_stdio(stdin: bool = False, stdout: bool = False) -> None:
    """A standard stream the command needs was closed by the shell (`<&-`, `>&-`: Python then sets it to None):
    one line now, before any work, instead of an AttributeError later or output silently dropped."""
    if stdin and sys.stdin is None:
        raise _fail("stdin is closed: there is nothing to read the input from")
    if stdout and sys.stdout is None:
        raise _fail("stdout is closed: the output would have nowhere to go")


def _flat(text: str) -> str:
    return " ".join(str(text).split())


def _fail(message: str) -> click.ClickException:
    return click.ClickException(message)


# ------------------------------------------------------------------ shared options

def _sampling_options(default_max_new: int):
    def deco(f):
        opts = [
            click.option("--max-new-tokens", "-n", type=click.IntRange(min=1), default=default_max_new,
                         show_default=True, help="Most tokens to generate (fewer if the context fills up)."),
            click.option("--temperature", "-t", type=click.FloatRange(min=0.0, max=100.0), default=0.0,
                         show_default=True, help="Sampling temperature; 0 = greedy (deterministic)."),
            click.option("--top-k", type=click.IntRange(min=0), default=0, show_default=True,
                         help="Sample only among the k most likely tokens; 0 = off."),
            click.option("--top-p", type=click.FloatRange(min=0.0, max=1.0, min_open=True), default=1.0,
                         show_default=True, help="Nucleus sampling: smallest token set with this much "
                                                 "probability; 1 = off."),
            click.option("--seed", type=click.IntRange(min=0), default=None,
                         help="Random seed for sampling (same seed + settings → same text)."),
            click.option("--stop", multiple=True, metavar="TEXT",
                         help="Stop when this text appears (not printed). Repeat for several."),
            click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
                         show_default=True, help="auto = the GPU when libnanoqwen and a GPU are present, else CPU."),
            click.option("--max-context", type=click.IntRange(min=1), default=None,
                         help="KV-cache size in tokens (default: the model's max positions)."),
        ]
        for o in reversed(opts):
            f = o(f)
        return f
    return deco


def _gen_kwargs(max_new_tokens, temperature, top_k, top_p, seed, stop) -> dict:
    for s in stop:
        if s == "":
            raise click.BadParameter("must not be empty", param_hint="'--stop'")
    return dict(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                stop=list(stop) or None)


def _open(path: str, device: str, max_context: int | None, **batch):
    try:
        return load_engine(path, device, max_context, **batch)
    except LoadError as e:
        raise _fail(str(e)) from None


def _file_arg():
    """FILE, or --demo: the embedded model (nanoqwen_rt.demo), converted to INT4 into the user's cache on first
    use. The command receives the path either way."""
    def decorate(command):
        @functools.wraps(command)
        def with_file(*args, file, demo, **kwargs):
            return command(*args, file=_model_file(file, demo), **kwargs)
        with_file = click.option("--demo", is_flag=True,
                                 help="Use the embedded model (tiny-py, a toy trained on Python's standard library) "
                                      "instead of FILE; its first use converts it to INT4 into ~/.cache/nanoqwen "
                                      "(up to ~40 s in a fresh install).")(with_file)
        return click.argument("file", required=False, type=click.Path(dir_okay=True, path_type=str),
                              metavar="FILE")(with_file)
    return decorate


def _model_file(file: str | None, demo: bool) -> str:
    if demo and file is not None:
        raise click.UsageError(f"give FILE or --demo, not both (FILE: {file})", ctx=click.get_current_context())
    if not demo:
        if file is None:
            raise click.UsageError("missing FILE (a .nanoqwen file; --demo runs the embedded model)",
                                   ctx=click.get_current_context())
        return file
    from ..demo import DemoModelUnavailable, demo_model_path
    try:
        return str(demo_model_path(log=lambda message: click.echo(f"[nanoqwen] {message}", err=True)))
    except DemoModelUnavailable as e:
        raise _fail(str(e)) from None


def _stats_line(eng, n_prompt: int) -> str:
    st = eng.stats
    tps = st.decode_tokens_per_s
    tps_txt = f"{tps:.1f} tokens/s" if tps > 0 else "n/a tokens/s (fewer than 2 tokens)"
    return (f"[nanoqwen] device={eng.device}  prompt={n_prompt} tokens  TTFT={st.ttft_s * 1000:.1f} ms  "
            f"generated={st.completion_tokens} tokens  {tps_txt}  finish={st.finish_reason or 'interrupted'}")


def _engine_errors():
    """What generation may raise for a named reason: bad input, or a backend failure (CUDA error, out of
    memory: BackendError carries the library's message)."""
    from ..backends.base import BackendError
    from ..engine import EngineError
    return (EngineError, ValueError, BackendError)


def _load_errors():
    from nanoqwen_format import NanoqwenFormatError

    from ..backends.base import BackendError
    from ..engine import EngineError
    return (NanoqwenFormatError, EngineError, BackendError, OSError, ValueError)


def _require_file(path: str) -> None:
    try:
        require_file(path)
    except LoadError as e:
        raise _fail(str(e)) from None


def _check_can_listen(host: str, port: int) -> None:
    """Bind (host, port) once as uvicorn will (SO_REUSEADDR) and release it; a clear error if that fails."""
    import socket
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise _fail(f"cannot listen on {host}:{port}: unknown host ({e.strerror})") from None
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as e:
            raise _fail(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def _is_loopback(host: str) -> bool:
    """True when every address `host` names is a loopback one (127.0.0.0/8, ::1, "localhost")."""
    import ipaddress
    import socket
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


# ------------------------------------------------------------------ commands

@click.group(cls=_OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="nanoqwen", prog_name="nanoqwen")
def main():
    """nanoqwen: run Qwen2.5 / Qwen2.5-Coder models stored as .nanoqwen files (see nanoqwen-convert).

    \b
    nanoqwen run FILE -p "def fibonacci(n):"   complete a prompt, streaming
    nanoqwen chat FILE                         interactive chat with the model's chat template
    nanoqwen info FILE                         config, tensors, sizes, provenance
    nanoqwen serve FILE --port 8000            OpenAI-compatible HTTP server
    nanoqwen bench FILE                        load, TTFT, decode speed (GPU: MBU, torch peers)

    --demo in place of FILE runs the embedded model: nanoqwen run --demo -p "def fibonacci(n):"
    """


@main.command()
@_file_arg()
@click.option("--prompt", "-p", required=True, metavar="TEXT",
              help="The prompt; '-' reads it from stdin.")
@click.option("--chat", "as_chat", is_flag=True,
              help="Wrap the prompt as one user message in the model's chat template.")
@click.option("--system", default=None, metavar="TEXT", help="With --chat: a system message first.")
@click.option("--suffix", default=None, metavar="TEXT",
              help="Fill in the middle: generate the code between the prompt (the text before the cursor) and "
                   "this text (after it), with Qwen2.5-Coder's FIM tokens; '-' reads it from stdin.")
@_sampling_options(DEFAULT_MAX_NEW_TOKENS)
def run(file, prompt, as_chat, system, suffix, max_new_tokens, temperature, top_k, top_p, seed, stop, device,
        max_context):
    """Complete PROMPT with the model in FILE, streaming the text to stdout.

    Device, TTFT (time to first token) and decode speed are printed on stderr at the end.
    Greedy by default (--temperature 0), so the same command prints the same text.
    """
    if system is not None and not as_chat:
        raise click.UsageError("--system needs --chat")
    if suffix is not None and as_chat:
        raise click.UsageError("--suffix (fill in the middle) and --chat cannot be combined")
    if prompt == "-" and suffix == "-":
        raise click.UsageError("only one of --prompt and --suffix can read stdin")
    _require_stdio(stdin="-" in (prompt, suffix), stdout=True)
    if prompt == "-":
        prompt = _read_stdin_text()
    if suffix == "-":
        suffix = _read_stdin_text()
    kwargs = _gen_kwargs(max_new_tokens, temperature, top_k, top_p, seed, stop)
    eng = _open(file, device, max_context)
    try:
        if as_chat:
            text = _render_chat(eng, ([{"role": "system", "content": system}] if system else [])
                                + [{"role": "user", "content": prompt}])
        else:
            text = prompt
        try:   # the Engine checks the prompt (empty, too long for the context) when generate is called
            chunks = eng.generate(text, **kwargs) if suffix is None else eng.fim(text, suffix, **kwargs)
        except _engine_errors() as e:
            raise _fail(f"{type(e).__name__}: {e}") from None
        n_prompt = eng.stats.prompt_tokens
        room = eng.max_context - n_prompt
        note = f" (only {room} new tokens fit)" if room < max_new_tokens else ""
        click.echo(f"[nanoqwen] {file}: device={eng.device}, prompt {n_prompt} tokens, "
                   f"context {eng.max_context}{note}", err=True)
        interrupted = False
        try:
            for chunk in chunks:
                if chunk.text:
                    sys.stdout.write(chunk.text)
                    sys.stdout.flush()
        except KeyboardInterrupt:
            interrupted = True
        except _engine_errors() as e:
            raise _fail(f"{type(e).__name__}: {e}") from None
        except OSError as e:
            raise _output_failed(e) from None
        try:
            sys.stdout.write("\n")
            sys.stdout.flush()
        except OSError as e:
            raise _output_failed(e) from None
        click.echo(_stats_line(eng, n_prompt), err=True)
        if interrupted:
            sys.exit(EXIT_INTERRUPTED)
    finally:
        eng.close()


def _read_stdin_text() -> str:
    """All of stdin as UTF-8 text; anything else is a one-line error naming the first bad byte."""
    data = sys.stdin.buffer.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _fail(f"the prompt on stdin is not valid UTF-8: byte 0x{data[e.start]:02x} at offset {e.start} "
                    f"({e.reason})") from None


def _check_output_path(path: str, option: str) -> None:
    """A file this command will write at the end: its folder must exist and be writable, and it must not be a
    folder itself, checked before the (long) work so the work is not lost."""
    import os
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise click.BadParameter(f"{path} is a directory", param_hint=option)
    if not os.path.isdir(folder):
        raise click.BadParameter(f"{path}: the folder {folder} does not exist", param_hint=option)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise click.BadParameter(f"{path}: the folder {folder} is not writable", param_hint=option)


def _render_chat(eng, messages: list[dict]) -> str:
    from ..tokenizer import ChatTemplateError
    if eng.tokenizer is None:
        raise _fail("this file carries no tokenizer, so no chat template")
    try:
        return eng.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    except ChatTemplateError as e:
        raise _fail(f"chat template: {e}") from None


@main.command()
@_file_arg()
@click.option("--system", default=None, metavar="TEXT", help="A system message that opens the conversation.")
@_sampling_options(DEFAULT_CHAT_MAX_NEW_TOKENS)
def chat(file, system, max_new_tokens, temperature, top_k, top_p, seed, stop, device, max_context):
    """Interactive multi-turn chat with the model in FILE, using its chat template.

    \b
    Ctrl-C stops the current answer (the program keeps running).
    /reset   forget the conversation      /exit   quit (Ctrl-D too)
    """
    _require_stdio(stdin=True, stdout=True)
    kwargs = _gen_kwargs(max_new_tokens, temperature, top_k, top_p, seed, stop)
    eng = _open(file, device, max_context)
    try:
        if eng.tokenizer is None or eng.tokenizer.chat_template is None:
            raise _fail(f"{file}: the file has no chat template; use 'nanoqwen run' with a plain prompt")
        _chat_loop(eng, system, kwargs)
    finally:
        eng.close()


@main.command()
@_file_arg()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
@click.option("--no-verify", is_flag=True, help="Skip the CRC32C checks (faster on big files).")
def info(file, as_json, no_verify):
    """Show what FILE holds: model config, tensors (dtype, shape, size), blobs, provenance."""
    _require_stdio(stdout=True)
    try:
        data = file_info(file, verify_checksums=not no_verify)
    except LoadError as e:
        raise _fail(str(e)) from None
    try:
        click.echo(json.dumps(data, indent=2) if as_json else format_info(data))
    except OSError as e:
        raise _output_failed(e) from None


@main.command()
@_file_arg()
@click.option("--prompt-tokens", type=click.IntRange(min=1), default=512, show_default=True,
              help="Length of the (random-id) prompt whose prefill gives the TTFT.")
@click.option("--new-tokens", type=click.IntRange(min=1), default=128, show_default=True,
              help="Greedy tokens decoded per repeat.")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--no-peers", is_flag=True, help="Skip the torch int4 / cuBLAS fp16 comparison chains.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--json", "json_out", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Also write the full result dict to this JSON file.")
@click.option("--plot", "plot_out", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Also draw the run's figures to this .png/.svg/.pdf (needs matplotlib: nanoqwen[plot]).")
@click.option("--concurrency", "concurrency", default=None, metavar="N,N,...",
              help="Instead: N concurrent greedy streams through Engine.submit per level (e.g. 1,8,32,64): "
                   "aggregate tokens/s, per-stream inter-token p50/p90, TTFT, batch per step; with 1, the single "
                   "stream beside it.")
def bench(file, prompt_tokens, new_tokens, repeats, no_peers, device, json_out, plot_out, concurrency):
    """Benchmark FILE: load time, TTFT, decode tokens/s and bytes per token of the Engine; with CUDA also the
    bandwidth ceilings, MBU and the torch int4 / cuBLAS fp16 peers (skipped, with the reason, without CUDA).
    With --concurrency: the batched API under N concurrent streams instead (nanoqwen_bench.concurrency).
    """
    try:   # imported here: the runtime never imports the bench package (it needs torch for the GPU parts)
        from nanoqwen_bench.measure import BenchError, format_table, run_bench, write_json_atomic
    except ImportError as e:
        _bench_fail(f"the nanoqwen_bench package cannot be imported: {_flat(e)}")
    levels = None
    if concurrency is not None:
        from nanoqwen_bench.concurrency import parse_concurrency
        try:
            levels = parse_concurrency(concurrency)
        except BenchError as e:
            _bench_fail(_flat(e))
        if plot_out:
            _bench_fail("--plot draws the single-stream run; it does not combine with --concurrency")
    _require_file(file)
    _require_stdio(stdout=json_out is None)   # with --json the result has a place to go
    if json_out:
        _check_output_path(json_out, "'--json'")
    try:
        if levels is not None:
            from nanoqwen_bench.concurrency import format_concurrency_table as fmt
            from nanoqwen_bench.concurrency import run_concurrency
            result = run_concurrency(file, levels, prompt_tokens, new_tokens, device=device, repeats=repeats)
        else:
            if plot_out:      # before the run: a missing matplotlib or a bad path should not cost a whole bench
                from nanoqwen_bench.plot import check_output_path, plot, require_matplotlib
                check_output_path(plot_out)
                require_matplotlib()
            fmt = format_table
            result = run_bench(file, prompt_tokens, new_tokens, peers=not no_peers, device=device, repeats=repeats)
    except BenchError as e:
        _bench_fail(_flat(e))
    except _load_errors() as e:
        raise _fail(f"{file}: {type(e).__name__}: {_flat(e)}") from None
    if json_out:
        write_json_atomic(json_out, result)
    click.echo(fmt(result))
    if plot_out:              # after the table and the JSON: a plotting failure loses no measurement
        try:
            plot(result, plot_out)
        except BenchError as e:
            _bench_fail(_flat(e))


def _bench_fail(message: str) -> NoReturn:
    """The bench command's one-line error (its own exit status 2: a measurement that could not be made)."""
    click.echo(f"nanoqwen bench: error: {message}", err=True)
    sys.exit(2)


@main.command()
@_file_arg()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.option("--api-key", default=None, envvar="NANOQWEN_API_KEY", show_envvar=True,
              help="Require 'Authorization: Bearer KEY' on /v1/* (401 otherwise).")
@click.option("--queue-size", type=click.IntRange(min=1), default=8, show_default=True,
              help="Requests that may wait while --max-batch generate; more get 429 + Retry-After.")
@click.option("--max-batch", type=click.IntRange(min=1, max=1024), default=DEFAULT_MAX_BATCH, show_default=True,
              help="Requests that generate together (continuous batching).")
@click.option("--kv-pages", type=click.IntRange(min=1), default=None,
              help=f"KV pages of {KV_PAGE_TOKENS} tokens shared by the batch and the prefix cache (default: "
                   f"--max-batch full contexts; on the GPU within {KV_FREE_MEMORY_FRACTION:.0%} of the memory free "
                   f"after the weights (an error if that holds less than one full context), on the CPU within "
                   f"{CPU_KV_BUDGET_BYTES >> 30} GiB of float32 rows (at least one full context)). A request that "
                   f"needs more pages than are free waits for running ones to end.")
@click.option("--model-name", default=None, help="Model id clients send (default: FILE's name without "
                                                  ".nanoqwen).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--max-context", type=click.IntRange(min=1), default=None,
              help="KV-cache size in tokens (default: the model's max positions).")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]),
              default="info", show_default=True)
@click.option("--read-timeout", type=click.FloatRange(min=0.1, max=3600), default=DEFAULT_READ_TIMEOUT_S,
              show_default=True, metavar="SECONDS",
              help="A client must send a request's headers, and then its body, within this many seconds each.")
@click.option("--keep-alive-timeout", type=click.IntRange(min=1, max=3600), default=DEFAULT_KEEP_ALIVE_S,
              show_default=True, metavar="SECONDS", help="Close an idle keep-alive connection after this long.")
def serve(file, host, port, api_key, queue_size, max_batch, kv_pages, model_name, device, max_context, log_level,
          read_timeout, keep_alive_timeout):
    """Serve FILE over an OpenAI-compatible HTTP API.

    \b
    GET  /health  /metrics (Prometheus)  /v1/models
    POST /v1/completions  /v1/chat/completions   (stream: true → server-sent events)
    Up to --max-batch requests generate together (continuous batching, prefix cache
    over --kv-pages); others wait in a FIFO of --queue-size.
    Sampling: temperature, top_p, seed, stop, max_tokens; extensions top_k, ignore_eos.
    """
    import uvicorn

    from ..engine import EngineError
    from ..serve.app import GRACEFUL_SHUTDOWN_S, LOOPBACK_HOSTS, create_app
    from ..serve.adapter import default_model_name
    from ..serve.protocol import HeaderDeadlineH11Protocol
    if api_key is not None and not api_key.strip():
        raise click.BadParameter("must not be empty", param_hint="'--api-key'")
    if api_key is not None and (api_key != api_key.strip() or not api_key.isascii() or not api_key.isprintable()):
        # clients trim a header's spaces and send other characters as bytes the key would never match
        raise click.BadParameter("must be printable ASCII with no spaces around it (it travels in an HTTP header)",
                                 param_hint="'--api-key'")
    if model_name is not None and not model_name.strip():
        raise click.BadParameter("must not be empty", param_hint="'--model-name'")
    _require_file(file)
    _check_can_listen(host, port)          # before the (slow) model load; uvicorn would say it in 5 log lines
    eng = _open(file, device, max_context, max_batch=max_batch, kv_pages=kv_pages)
    try:
        eng.open_batch()                   # the KV pages now, so a pool that does not fit fails at start
        app = create_app(eng, model_name=model_name or default_model_name(file), api_key=api_key,
                         queue_size=queue_size, body_timeout_s=read_timeout,
                         allowed_hosts=LOOPBACK_HOSTS | {host.strip("[]").lower()} if _is_loopback(host) else None)
    except (LoadError, EngineError, MemoryError) as e:
        eng.close()
        raise _fail(f"{type(e).__name__}: {e}" if not isinstance(e, LoadError) else str(e)) from None
    click.echo(f"[nanoqwen] serving {file} as '{model_name or default_model_name(file)}' on "
               f"http://{host}:{port} (device={eng.device}, context={eng.max_context}, queue={queue_size}, "
               f"max batch={max_batch}, KV pages={eng.batch_stats().kv_pages})",
               err=True)
    if api_key is None and not _is_loopback(host):
        click.echo(f"[nanoqwen] warning: listening on {host} without --api-key: anyone who can reach this "
                   f"port can use the model", err=True)
    try:
        uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
                    http=HeaderDeadlineH11Protocol.with_timeout(read_timeout),
                    timeout_keep_alive=keep_alive_timeout)
    finally:
        # Free the engine only once the worker thread is gone: closing it under a running call (a stuck
        # prefill) could crash; the process is exiting anyway then.
        if not app.state.server.worker.alive:
            eng.close()


# ------------------------------------------------------------------ chat loop

CHAT_HELP = "commands: /reset (forget the conversation), /exit (quit; Ctrl-D too); Ctrl-C stops an answer"
def _chat_loop(eng, system: str | None, kwargs: dict) -> None:
    """Read user lines from stdin until /exit or EOF; stream each answer to stdout.

    Ctrl-C while an answer streams stops that answer (what was printed stays in the conversation);
    Ctrl-C at the prompt only reminds how to quit. A turn that no longer fits the context is refused with a
    hint to /reset, and the conversation is left as it was.
    """
    from ..engine import PromptTooLong
    head = [{"role": "system", "content": system}] if system else []
    history: list[dict] = []
    read_line = input_function()
    click.echo(f"[nanoqwen] chat with {eng.path} (device={eng.device}, context {eng.max_context} tokens); "
               f"{CHAT_HELP}", err=True)
    while True:
        try:
            line = read_line("you> ")
        except EOFError:
            click.echo("", err=True)
            return
        except KeyboardInterrupt:
            click.echo("\n(" + CHAT_HELP + ")", err=True)
            continue
        cmd = line.strip()
        if not cmd:
            continue
        if cmd in ("/exit", "/quit"):
            return
        if cmd == "/reset":
            history = []
            click.echo("(conversation cleared)", err=True)
            continue
        if cmd.startswith("/") and " " not in cmd:
            click.echo(f"(unknown command {cmd}; {CHAT_HELP})", err=True)
            continue
        user = {"role": "user", "content": line}
        text = _render_chat(eng, head + history + [user])
        try:
            chunks = eng.generate(text, **kwargs)
        except PromptTooLong as e:
            click.echo(f"(the conversation no longer fits the context: {_flat(e)}; /reset to start again)",
                       err=True)
            continue
        except _engine_errors() as e:
            click.echo(f"(error: {type(e).__name__}: {_flat(e)})", err=True)
            continue
        n_prompt = eng.stats.prompt_tokens
        parts: list[str] = []
        sys.stdout.write("assistant> ")
        sys.stdout.flush()
        try:
            for chunk in chunks:
                if chunk.text:
                    parts.append(chunk.text)
                    sys.stdout.write(chunk.text)
                    sys.stdout.flush()
        except KeyboardInterrupt:
            sys.stdout.write(" [stopped]")
        except _engine_errors() as e:
            sys.stdout.write("\n")
            click.echo(f"(error: {type(e).__name__}: {_flat(e)})", err=True)
            continue
        finally:
            chunks.close()       # a stopped answer frees the engine for the next turn
        sys.stdout.write("\n")
        sys.stdout.flush()
        click.echo(_stats_line(eng, n_prompt), err=True)
        history += [user, {"role": "assistant", "content": "".join(parts)}]
