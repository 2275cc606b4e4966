"""OpenAI-compatible HTTP server over one Engine: starlette routes, sse-starlette streaming, uvicorn.

Routes: GET / (the chat page, static/index.html; its files under /static), GET /health, GET /metrics (Prometheus text), GET /v1/models[/{id}], POST /v1/completions,
POST /v1/chat/completions (both with `"stream": true` → SSE chunks ending in `data: [DONE]`).

Concurrency model: continuous batching (`queue.py`): up to --max-batch requests generate together on the engine's
batch (Engine.submit/step), joining at step boundaries; the others wait in a bounded FIFO, and a full FIFO answers
429 + Retry-After. The engine runs on the worker thread only; handlers await events from it, so the event loop
stays free for other clients, /health and /metrics. A client that disconnects (streaming or not) cancels its job:
its sequence leaves the batch at the next step and its KV pages return to the pool, or the job leaves the queue
before it starts.

Every client mistake is an OpenAI-style 4xx body (`schemas.ApiError`); only a failure inside the engine
itself is a 500.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.to_thread
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .adapter import EngineAdapter
from .metrics import ServerMetrics
from .queue import Failed, Finished, GenerationWorker, Job, Piece, QueueFull
from ..tools import ToolCallStream, parse_tool_calls
from .schemas import (ApiError, ChatRequest, CompletionRequest, check_context, parse_chat,
                             parse_completion)

log = logging.getLogger("nanoqwen.server")

DEFAULT_QUEUE_SIZE = 8
# Bodies above this are refused (413) before parsing: a prompt this long cannot fit any context we serve anyway.
MAX_BODY_BYTES = 8 * 1024 * 1024
# Seconds a client has to send a whole request body once its headers are in (a slow body would hold its
# connection and handler forever); 8 MB at 1 MB/s fits with room.
DEFAULT_BODY_TIMEOUT_S = 30.0
# uvicorn's graceful shutdown (SIGINT/SIGTERM): seconds it waits for open requests before cancelling them.
GRACEFUL_SHUTDOWN_S = 5
# Seconds a live stream gets, after shutdown starts, to send its closing error event and [DONE] (well inside
# GRACEFUL_SHUTDOWN_S, after which uvicorn cancels what is left).
STREAM_SHUTDOWN_GRACE_S = 2.0
# Requests whose prompt is prepared (chat template, tokenization) at the same time; see _Server.prepare_off_loop.
PREPARE_CONCURRENCY = 1
# Status recorded (and sent, to nobody) when the client left before its answer was ready (nginx's convention).
CLIENT_CLOSED_STATUS = 499
# The chat page (plain HTML/CSS/JS, shipped as package data): no secret in it, so served without the API key.
STATIC_DIR = Path(__file__).resolve().parent / "static"


class ClientGone(Exception):
    """The client disconnected while its non-streaming request waited or generated."""


def _error_response(err: ApiError, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


#: the Host names a server bound to a loopback address answers to (serve passes them as allowed_hosts)
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def _host_name(host: str) -> str:
    """'name:port' / '[v6]:port' / 'name' → the name, lower case."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class BrowserGuard:
    """ASGI middleware against other web sites in the user's browser (the server needs no key on loopback):
    * allowed_hosts (a loopback server's LOOPBACK_HOSTS): a request whose Host header names another host is a
      403, so a page that rebinds its own DNS name to 127.0.0.1 cannot use the server;
    * a request other than GET / HEAD whose Origin header is not the server's own origin (scheme://Host) is a 403,
      so a page on another site cannot start generations with a form-like POST. Command-line clients send no
      Origin; the chat page is the server's own origin."""

    def __init__(self, app, allowed_hosts: frozenset[str] | None = None):
        self.app, self.allowed_hosts = app, allowed_hosts

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            headers = {k.lower(): v.decode("latin-1") for k, v in scope["headers"]}
            host = headers.get(b"host", "")
            origin = headers.get(b"origin")
            why = None
            if self.allowed_hosts is not None and _host_name(host) not in self.allowed_hosts:
                why = f"Host {host!r} is not this server's (it answers to {', '.join(sorted(self.allowed_hosts))})"
            elif origin is not None and scope["method"] not in ("GET", "HEAD") \
                    and origin.partition("://")[2].lower() != host.lower():
                why = f"a request from the web page at {origin!r} (not this server's own page)"
            if why is not None:
                await _error_response(ApiError(403, f"refused: {why}", code="forbidden"))(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _Server:
    """State shared by the route handlers: the engine adapter, the worker, metrics and settings."""

    def __init__(self, engine: EngineAdapter, model_name: str, api_key: str | None, queue_size: int,
                 body_timeout_s: float):
        self.engine = engine
        self.body_timeout_s = body_timeout_s
        self.model_name = model_name
        self.api_key = api_key
        self.metrics = ServerMetrics()
        self.metrics.watch_batch(engine.batch_stats)
        engine.on_step = lambda batch, _seconds: self.metrics.batch_size.observe(batch) if batch else None
        self.worker = GenerationWorker(queue_size, self.metrics, engine.max_batch)
        self.created = int(time.time())
        # Prompt preparation (template + tokenization) runs on threadpool threads, at most this many at once:
        # tokenizing holds the GIL, so parallel ones would only add memory, not speed.
        self._prepare_limiter: anyio.CapacityLimiter | None = None     # made on the event loop, at first use

    # ------------------------------------------------------------ plumbing

    def authorized(self, request: Request) -> bool:
        if self.api_key is None:
            return True
        auth = request.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        # starlette decodes header bytes as latin-1: encode back to the bytes the client sent (the key is ASCII:
        # serve refuses any other, which no HTTP client could send as typed)
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode("latin-1"),
                                                                  self.api_key.encode("latin-1"))

    async def read_json(self, request: Request):
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            raise ApiError(413, f"request body over {MAX_BODY_BYTES} bytes", code="request_too_large")
        parts, size = [], 0
        try:
            with anyio.fail_after(self.body_timeout_s):
                async for piece in request.stream():   # chunked bodies carry no length: count as they come
                    size += len(piece)
                    if size > MAX_BODY_BYTES:
                        raise ApiError(413, f"request body over {MAX_BODY_BYTES} bytes", code="request_too_large")
                    parts.append(piece)
        except TimeoutError:
            raise ApiError(408, f"the request body did not arrive within {self.body_timeout_s:g} s",
                           code="request_timeout") from None
        raw = b"".join(parts)
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise ApiError(400, f"the request body is not valid JSON: {e}", code="invalid_json") from None
        except RecursionError:
            raise ApiError(400, "the request body is nested too deeply to parse", code="invalid_json") from None

    def submit(self, prompt_tokens: int, start) -> tuple[Job, asyncio.Queue]:
        """Queue a job whose events land in the returned asyncio queue (thread-safe hand-off)."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def sink(ev):
            try:
                loop.call_soon_threadsafe(events.put_nowait, ev)
            except RuntimeError:      # the loop is closed: the server is going down, nobody is listening
                pass

        job = Job(start, sink, prompt_tokens)
        try:
            self.worker.submit(job)
        except QueueFull as e:
            self.metrics.rejected.inc()
            raise ApiError(429, f"the server is busy ({e}); retry later", type="rate_limit_error",
                           code="queue_full") from None
        return job, events

    # ------------------------------------------------------------ generation

    async def prepare_off_loop(self, req: CompletionRequest | ChatRequest):
        """prepare() on a threadpool thread, at most PREPARE_CONCURRENCY at once."""
        if self._prepare_limiter is None:
            self._prepare_limiter = anyio.CapacityLimiter(PREPARE_CONCURRENCY)
        return await anyio.to_thread.run_sync(self.prepare, req, limiter=self._prepare_limiter)

    async def start(self, req: CompletionRequest | ChatRequest, id_prefix: str):
        """Prepare `req` off the event loop and queue it: (Prepared, job, events, response id, created)."""
        prep = await self.prepare_off_loop(req)
        job, events = self.submit(prep.prompt_tokens, prep.start)
        return prep, job, events, f"{id_prefix}-{uuid.uuid4().hex}", int(time.time())

    def prepare(self, req: CompletionRequest | ChatRequest) -> "Prepared":
        """Render / tokenize the prompt, check the context budget, build the grammar constraint if any; return
        what the worker starts and what the response needs."""
        eng = self.engine
        n = 1
        echo = None
        make_constraint = None
        tools_active = False
        kwargs_extra: dict = {}
        if isinstance(req, ChatRequest):
            # Rendered here (not by Engine.chat) so the usage count is exactly the text the engine receives.
            tools_active = req.tools is not None and req.tool_choice != "none"
            prompt, param = eng.render_chat(req.messages, req.tools, req.tool_choice), "messages"
            rf = req.response_format
            if rf.type != "text":
                make_constraint = eng.constraint_factory("json", rf.schema if rf.type == "json_schema" else None,
                                                         "response_format")
            else:
                grammar = eng.tool_choice_grammar(req.tools, req.tool_choice)
                if grammar is not None:
                    make_constraint = eng.constraint_factory("lark", grammar, "tool_choice")
            ids = eng.prompt_ids(prompt, param)
        else:
            param = "prompt"
            n = req.n
            if req.suffix is not None:
                ids = eng.fim_ids(req.prompt, req.suffix)
                if not req.params.ignore_eos:
                    kwargs_extra["stop_token_ids"] = eng.fim_stop_ids()
            else:
                ids = eng.prompt_ids(req.prompt, param)
            if req.echo:
                echo = req.prompt if isinstance(req.prompt, str) else \
                    eng.engine.tokenizer.decode(req.prompt, skip_special_tokens=False)
        n_prompt = len(ids)
        if n_prompt == 0:
            raise ApiError(400, f"'{param}' is empty: the prompt must encode to at least one token", param=param,
                           code="invalid_value")
        n_new = check_context(n_prompt, req.params.max_tokens, eng.context_length, param)
        eng.check_pages(n_prompt, n_new, param)
        kwargs = {**req.params.engine_kwargs(n_new), **kwargs_extra}
        if n == 1 and make_constraint is None:
            start = lambda: eng.generate(ids, **kwargs)                      # noqa: E731
        else:
            start = lambda: eng.generate(ids, n=n, make_constraint=make_constraint, **kwargs)   # noqa: E731
        return Prepared(n_prompt, start, n, echo, tools_active)

    async def collect(self, request: Request, job: Job, events: asyncio.Queue):
        """Wait for the whole answer; a client disconnect cancels the job (ClientGone). Returns
        ({choice index: _Choice}, Finished)."""

        async def watch_disconnect():
            while True:
                msg = await request.receive()
                if msg["type"] == "http.disconnect":
                    self.worker.withdraw(job)
                    return

        watcher = asyncio.create_task(watch_disconnect())
        choices: dict[int, _Choice] = {}
        try:
            while True:
                ev = await events.get()
                if isinstance(ev, Piece):
                    c = choices.setdefault(ev.index, _Choice())
                    c.parts.append(ev.text)
                    if ev.logprobs:
                        c.logprobs += ev.logprobs
                    c.finish = ev.finish_reason or c.finish
                elif isinstance(ev, Failed):
                    raise _engine_error(ev.error)
                else:
                    if ev.cancelled:
                        raise ClientGone()
                    return choices, ev
        finally:
            watcher.cancel()
            self.worker.withdraw(job)     # no-op when finished; frees the engine if this task is cancelled

    def event_source(self, job: Job, events: asyncio.Queue, on_piece, on_finish, usage_chunk, role_chunk=None):
        """The SSE response of one streaming request: `stream` below, told when the server shuts down."""
        shutdown = anyio.Event()
        # send_timeout: a client that takes no bytes for body_timeout_s (--read-timeout) is dropped, its job withdrawn
        # (`stream`'s finally); without it a client that never reads held its whole answer in memory for as long as
        # it kept the connection open
        return EventSourceResponse(self.stream(job, events, on_piece, on_finish, usage_chunk, role_chunk, shutdown),
                                   shutdown_event=shutdown, shutdown_grace_period=STREAM_SHUTDOWN_GRACE_S,
                                   send_timeout=self.body_timeout_s)

    async def stream(self, job: Job, events: asyncio.Queue, on_piece, on_finish, usage_chunk, role_chunk=None,
                     shutdown: anyio.Event | None = None):
        """Async generator of SSE events. `on_piece(piece)` returns the JSON chunks of one Piece (its text,
        logprobs, and the choice's finish chunk when the piece ends that choice); `on_finish(finished)` the
        chunks still owed at the end (a finish chunk for every choice that has none yet); `usage_chunk(prompt_tokens,
        completion_tokens)` the optional usage chunk sent last, `role_chunk` an optional first chunk (chat: the
        assistant role). When `shutdown` is set (SIGINT/SIGTERM) the stream ends with an error event and
        `[DONE]`, never cut mid-way."""
        shutdown_wait = asyncio.ensure_future(shutdown.wait()) if shutdown is not None else None
        get = None
        try:
            if role_chunk is not None:
                yield {"data": json.dumps(role_chunk)}
            while True:
                if shutdown_wait is None:
                    ev = await events.get()
                else:
                    get = asyncio.ensure_future(events.get())
                    await asyncio.wait({get, shutdown_wait}, return_when=asyncio.FIRST_COMPLETED)
                    if not get.done():
                        get.cancel()
                        err = ApiError(503, "the server is shutting down; this answer is incomplete",
                                       type="server_error", code="server_shutdown")
                        yield {"data": json.dumps(err.body())}
                        yield {"data": "[DONE]"}
                        return
                    ev = get.result()
                if isinstance(ev, Piece):
                    for c in on_piece(ev):
                        yield {"data": json.dumps(c)}
                elif isinstance(ev, Failed):
                    yield {"data": json.dumps(_engine_error(ev.error).body())}
                    return
                else:
                    if ev.cancelled:
                        return
                    for c in on_finish(ev):
                        yield {"data": json.dumps(c)}
                    if usage_chunk is not None:
                        yield {"data": json.dumps(usage_chunk(job.prompt_tokens, ev.completion_tokens))}
                    yield {"data": "[DONE]"}
                    return
        finally:
            # Client gone (sse-starlette cancelled this generator) or stream done: either way free the engine.
            for pending in (shutdown_wait, get):
                if pending is not None:
                    pending.cancel()
            self.worker.withdraw(job)


@dataclass
class Prepared:
    """A request ready to queue: its prompt size, the worker's start callable, and what the answer needs."""
    prompt_tokens: int
    start: object
    n: int = 1
    echo: str | None = None          # completions echo: the prompt text before each choice's text
    tools_active: bool = False       # chat: parse <tool_call> blocks out of the answer


@dataclass
class _Choice:
    """One choice of a non-streaming answer, as it accumulates."""
    parts: list = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    finish: str | None = None

    @property
    def text(self) -> str:
        return "".join(self.parts)


def _engine_error(e: BaseException) -> ApiError:
    """An exception raised by the engine on the worker thread, as an API error. Requests are validated before
    they are queued, so an engine InvalidArgument here means our validation missed a case: still a 400."""
    from ..engine import InvalidArgument
    if isinstance(e, InvalidArgument):
        return ApiError(400, str(e), code="invalid_value")
    log.error("engine failure: %s: %s", type(e).__name__, e, exc_info=e)
    return ApiError(500, f"generation failed: {type(e).__name__}: {e}", type="server_error", code="engine_error")


def _finish(ev: Finished) -> str:
    # An engine generator that ends without a reason ran out of budget: report it as "length".
    return ev.finish_reason or "length"


def _usage_chunk(make_chunk):
    """The final stream chunk for stream_options.include_usage: the same id/object/model, no choices."""
    def usage_chunk(prompt_tokens: int, completion_tokens: int) -> dict:
        return {**make_chunk("", None), "choices": [], "usage": _usage(prompt_tokens, completion_tokens)}
    return usage_chunk


def _completion_logprobs(engine: EngineAdapter, lps: list, offset: int) -> dict:
    """/v1/completions' logprobs object for these tokens; text offsets count from `offset`."""
    tokens, offsets = [], []
    for t in lps:
        offsets.append(offset)
        tokens.append(engine.token_text(t.token_id))
        offset += len(tokens[-1])
    return {"tokens": tokens, "token_logprobs": [t.logprob for t in lps],
            "top_logprobs": [{engine.token_text(i): lp for i, lp in t.top} for t in lps], "text_offset": offsets}


def _chat_logprobs(engine: EngineAdapter, lps: list) -> dict:
    """/v1/chat/completions' logprobs object ({"content": [...]}) for these tokens."""
    def entry(i: int, lp: float) -> dict:
        b = engine.token_bytes(i)
        return {"token": b.decode("utf-8", errors="replace"), "logprob": lp, "bytes": list(b)}
    return {"content": [{**entry(t.token_id, t.logprob), "top_logprobs": [entry(i, lp) for i, lp in t.top]}
                        for t in lps]}


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def create_app(engine, *, model_name: str, api_key: str | None = None,
               queue_size: int = DEFAULT_QUEUE_SIZE, body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
               allowed_hosts: frozenset[str] | None = None) -> Starlette:
    """Build the ASGI app around `engine` (a `nanoqwen_rt.Engine`, or anything with the same API). allowed_hosts:
    the Host names it answers to (None: any; see BrowserGuard)."""
    srv = _Server(engine if isinstance(engine, EngineAdapter) else EngineAdapter(engine), model_name, api_key,
                  queue_size, body_timeout_s)

    def endpoint(name: str, needs_auth: bool = True):
        """Wrap a handler: auth, ApiError → OpenAI body, request counter by status."""
        def deco(fn):
            async def handler(request: Request):
                try:
                    if needs_auth and not srv.authorized(request):
                        raise ApiError(401, "missing or invalid API key (send 'Authorization: Bearer <key>')",
                                       code="invalid_api_key")
                    resp = await fn(request)
                except ClientGone:
                    resp = Response(status_code=CLIENT_CLOSED_STATUS)
                except ApiError as e:
                    headers = {"Retry-After": str(srv.worker.retry_after_s())} if e.status == 429 else None
                    resp = _error_response(e, headers)
                except Exception as e:       # a bug or an engine failure: logged, answered, server stays up
                    log.exception("internal error on %s", name)
                    resp = _error_response(ApiError(500, f"internal error: {type(e).__name__}: {e}",
                                                    type="server_error", code="internal_error"))
                srv.metrics.count_request(name, resp.status_code)
                return resp
            return handler
        return deco

    @endpoint("/health", needs_auth=False)
    async def health(request):
        return JSONResponse({"status": "ok", "model": srv.model_name, "device": srv.engine.device,
                             "queue_depth": srv.worker.depth, "queue_size": srv.worker.queue_size,
                             "max_batch": srv.worker.max_batch})

    @endpoint("/metrics", needs_auth=False)
    async def metrics(request):
        srv.metrics.queue_depth.set(srv.worker.depth)
        body, content_type = srv.metrics.render(request.headers.get("accept", ""))
        return Response(body, headers={"content-type": content_type})

    def model_card():
        return {"id": srv.model_name, "object": "model", "created": srv.created, "owned_by": "nanoqwen",
                "context_length": srv.engine.context_length}

    @endpoint("/v1/models")
    async def models(request):
        return JSONResponse({"object": "list", "data": [model_card()]})

    @endpoint("/v1/models/{id}")
    async def model(request):
        if request.path_params["id"] != srv.model_name:
            raise ApiError(404, f"The model '{request.path_params['id']}' does not exist", param="model",
                           code="model_not_found")
        return JSONResponse(model_card())

    @endpoint("/v1/completions")
    async def completions(request):
        req = parse_completion(await srv.read_json(request), srv.model_name, srv.engine.vocab_rows)
        prep, job, events, cid, created = await srv.start(req, "cmpl")
        want_lp = req.params.logprobs is not None

        def chunk(text, finish, index=0, lps=None, offset=0):
            return {"id": cid, "object": "text_completion", "created": created, "model": srv.model_name,
                    "choices": [{"index": index, "text": text,
                                 "logprobs": _completion_logprobs(srv.engine, lps, offset) if want_lp and lps
                                 else None, "finish_reason": finish}]}

        if req.stream:
            offsets: dict[int, int] = {}
            finished: set[int] = set()

            def on_piece(ev: Piece) -> list[dict]:
                out = []
                i = ev.index
                if i not in offsets:
                    offsets[i] = 0
                    if prep.echo:
                        out.append(chunk(prep.echo, None, i))
                        offsets[i] = len(prep.echo)
                if ev.text or ev.logprobs:
                    out.append(chunk(ev.text, None, i, ev.logprobs, offsets[i]))
                    offsets[i] += sum(len(srv.engine.token_text(t.token_id)) for t in ev.logprobs or ())
                if ev.finish_reason is not None:
                    finished.add(i)
                    out.append(chunk("", ev.finish_reason, i))
                return out

            def on_finish(ev: Finished) -> list[dict]:
                return [chunk("", _finish(ev), i) for i in range(prep.n) if i not in finished]

            usage = _usage_chunk(chunk) if req.include_usage else None
            return srv.event_source(job, events, on_piece, on_finish, usage)
        choices, fin = await srv.collect(request, job, events)
        out = []
        for i in range(prep.n):
            c = choices.get(i, _Choice())
            echo = prep.echo or ""
            out.append(chunk(echo + c.text, c.finish or _finish(fin), i, c.logprobs, len(echo))["choices"][0])
        body = chunk("", None)
        body["choices"] = out
        body["usage"] = _usage(prep.prompt_tokens, fin.completion_tokens)
        return JSONResponse(body)

    @endpoint("/v1/chat/completions")
    async def chat_completions(request):
        req = parse_chat(await srv.read_json(request), srv.model_name, srv.engine.vocab_rows)
        prep, job, events, cid, created = await srv.start(req, "chatcmpl")
        want_lp = req.params.logprobs is not None

        def chunk(text, finish, delta=None, lps=None):
            delta = delta if delta is not None else ({"content": text} if text else {})
            return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": srv.model_name,
                    "choices": [{"index": 0, "delta": delta,
                                 "logprobs": _chat_logprobs(srv.engine, lps) if want_lp and lps else None,
                                 "finish_reason": finish}]}

        if req.stream:
            calls = ToolCallStream() if prep.tools_active else None
            state = {"finished": False}

            def deltas(events_) -> list[dict]:
                out = []
                for kind, val in events_:
                    if kind == "content" and val:
                        out.append({"content": val})
                    elif kind == "tool_call":
                        out.append({"tool_calls": [{"index": calls.n_calls - 1, **val}]})
                return out

            def finish_chunks(reason: str) -> list[dict]:
                state["finished"] = True
                out = [chunk("", None, d) for d in deltas(calls.finish())] if calls is not None else []
                last = chunk("", "tool_calls" if calls is not None and calls.n_calls else reason)
                if calls is not None and calls.errors:
                    last["choices"][0]["tool_call_errors"] = list(calls.errors)
                return out + [last]

            def on_piece(ev: Piece) -> list[dict]:
                ds = deltas(calls.feed(ev.text)) if calls is not None else ([{"content": ev.text}] if ev.text else [])
                if ev.logprobs and not ds:
                    ds = [{}]
                out = [chunk("", None, d, ev.logprobs if k == 0 else None) for k, d in enumerate(ds)]
                if ev.finish_reason is not None:
                    out += finish_chunks(ev.finish_reason)
                return out

            def on_finish(ev: Finished) -> list[dict]:
                return [] if state["finished"] else finish_chunks(_finish(ev))

            usage = _usage_chunk(chunk) if req.include_usage else None
            role = chunk("", None, delta={"role": "assistant", "content": ""})
            return srv.event_source(job, events, on_piece, on_finish, usage, role_chunk=role)
        choices, fin = await srv.collect(request, job, events)
        c = choices.get(0, _Choice())
        finish = c.finish or _finish(fin)
        message = {"role": "assistant", "content": c.text}
        choice = {"index": 0, "message": message, "logprobs": _chat_logprobs(srv.engine, c.logprobs) if want_lp
                  else None, "finish_reason": finish}
        if prep.tools_active:
            parsed = parse_tool_calls(c.text)
            if parsed.tool_calls:
                message["content"] = parsed.content or None
                message["tool_calls"] = parsed.tool_calls
                choice["finish_reason"] = "tool_calls"
            if parsed.errors:
                choice["tool_call_errors"] = parsed.errors
        return JSONResponse({
            "id": cid, "object": "chat.completion", "created": created, "model": srv.model_name,
            "choices": [choice], "usage": _usage(prep.prompt_tokens, fin.completion_tokens)})

    async def http_error(request, exc: HTTPException):
        err = ApiError(exc.status_code, exc.detail or "error",
                       code="not_found" if exc.status_code == 404 else "invalid_request")
        return _error_response(err)

    @asynccontextmanager
    async def lifespan(app):
        srv.worker.start()
        try:
            yield
        finally:
            srv.worker.stop(timeout=5.0)

    async def chat_page(request):
        return FileResponse(STATIC_DIR / "index.html")

    routes = [
        Route("/", chat_page, methods=["GET"]),
        Mount("/static", StaticFiles(directory=STATIC_DIR), name="static"),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{id:path}", model, methods=["GET"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error},
                    middleware=[Middleware(BrowserGuard, allowed_hosts=allowed_hosts)])
    app.state.server = srv
    return app
