"""Request parsing and validation for the OpenAI-compatible server, and OpenAI-style error bodies.

Everything a client can send is checked here, before any engine work is queued: a bad request becomes an
`ApiError` (4xx, OpenAI error body), never an exception from deep inside the engine. Parsing is pure (no I/O,
no engine), so it is unit-testable on its own; the one engine-dependent check (prompt + max_tokens against the
context length) is `check_context`, called by the server once the prompt is tokenized.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..logits import LOGIT_BIAS_RANGE, MAX_LOGIT_BIAS, MAX_TOP_LOGPROBS, PENALTY_RANGE
from ..sampling import MIN_TEMPERATURE

# OpenAI allows at most 4 stop sequences; we keep the same limit so clients behave identically everywhere.
MAX_STOP_SEQUENCES = 4
# OpenAI's documented default for /v1/completions when max_tokens is absent.
DEFAULT_COMPLETION_MAX_TOKENS = 16
# OpenAI's documented ranges.
TEMPERATURE_RANGE = (0.0, 2.0)
# Seeds are passed to numpy/CUDA RNGs as unsigned 64-bit values.
SEED_RANGE = (0, 2**64 - 1)
# logit_bias values, penalties and top_logprobs: OpenAI's ranges, defined once in nanoqwen_rt.logits (completions'
# `logprobs` allows 5 at OpenAI; we allow the chat endpoint's 20 on both).
# (LOGIT_BIAS_RANGE, MAX_LOGIT_BIAS, MAX_TOP_LOGPROBS, PENALTY_RANGE imported above)
# Most completions one /v1/completions request may ask for (`n`): they generate one after another, each one a
# full generation, so a large n would hold the single sequence for n times as long.
MAX_N = 8

ROLES = ("system", "user", "assistant", "tool", "developer")


class ApiError(Exception):
    """An error answered to the client as `{"error": {"message", "type", "param", "code"}}` with `status`."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_param(param: str, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


@dataclass
class SamplingParams:
    """Generation settings shared by both endpoints (names follow the Engine API)."""
    max_tokens: int | None          # None: as many as the context allows (chat default)
    temperature: float = 1.0        # OpenAI default; 0 means greedy
    top_p: float = 1.0
    top_k: int = 0                  # extension (vLLM-style); 0 disables
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False        # extension (vLLM-style): do not stop on the model's end-of-sequence ids
    logprobs: int | None = None     # None: no logprobs; N: the sampled token's and the N most likely ones
    logit_bias: dict[int, float] = field(default_factory=dict)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def engine_kwargs(self, max_new_tokens: int) -> dict:
        """Engine.generate keyword arguments (the optional ones only when set)."""
        kw = dict(max_new_tokens=max_new_tokens, temperature=self.temperature, top_k=self.top_k,
                  top_p=self.top_p, seed=self.seed, stop=list(self.stop) or None,
                  stop_token_ids=[] if self.ignore_eos else None)
        if self.logprobs is not None:
            kw["logprobs"] = self.logprobs
        if self.logit_bias:
            kw["logit_bias"] = dict(self.logit_bias)
        if self.presence_penalty:
            kw["presence_penalty"] = self.presence_penalty
        if self.frequency_penalty:
            kw["frequency_penalty"] = self.frequency_penalty
        return kw


@dataclass
class ResponseFormat:
    """response_format: "text", "json_object" (any JSON object) or "json_schema" (`schema`)."""
    type: str = "text"
    schema: dict | None = None


@dataclass
class CompletionRequest:
    prompt: str | list[int]          # text, or token ids (OpenAI allows both)
    params: SamplingParams
    stream: bool
    include_usage: bool              # stream_options.include_usage
    suffix: str | None = None        # fill in the middle: the text after the gap (prompt = the text before it)
    echo: bool = False               # the prompt's text before each completion's
    n: int = 1                       # completions, generated one after another


@dataclass
class ChatRequest:
    messages: list[dict]             # [{"role", "content"[, "tool_calls"][, "tool_call_id"]}], content as text
    params: SamplingParams
    stream: bool
    include_usage: bool
    tools: list[dict] | None = None  # OpenAI tool definitions (type "function"); None: no tools
    tool_choice: str | dict = "auto"   # "none" | "auto" | "required" | {"type": "function", "function": {"name"}}
    response_format: ResponseFormat = field(default_factory=ResponseFormat)


# ---------------------------------------------------------------- field checkers


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _opt_number(body: dict, name: str, default: float, lo: float, hi: float) -> float:
    v = body.get(name)
    if v is None:
        return default
    if not _is_number(v):
        raise bad_param(name, f"'{name}' must be a number, got {v!r}", code="invalid_type")
    if not lo <= v <= hi:
        raise bad_param(name, f"'{name}' must be between {lo} and {hi}, got {v!r}")
    return float(v)


def _opt_int(body: dict, name: str, lo: int, hi: int | None = None) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if not _is_int(v):
        raise bad_param(name, f"'{name}' must be an integer, got {v!r}", code="invalid_type")
    if v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"between {lo} and {hi}"
        raise bad_param(name, f"'{name}' must be {rng}, got {v!r}")
    return v


def _opt_bool(body: dict, name: str, default: bool) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad_param(name, f"'{name}' must be a boolean, got {v!r}", code="invalid_type")
    return v


def _stop(body: dict) -> list[str]:
    v = body.get("stop")
    if v is None:
        return []
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise bad_param("stop", "'stop' must be a string or a list of strings", code="invalid_type")
    if len(v) > MAX_STOP_SEQUENCES:
        raise bad_param("stop", f"'stop' takes at most {MAX_STOP_SEQUENCES} sequences, got {len(v)}")
    if any(s == "" for s in v):
        raise bad_param("stop", "'stop' sequences must not be empty")
    return list(v)


def _reject_unsupported(body: dict, endpoint: str) -> None:
    """Fail closed on parameters that would change the answer's meaning if silently ignored."""
    n = body.get("n")
    if endpoint == "chat" and n is not None and n != 1:
        raise bad_param("n", "only n=1 is supported on /v1/chat/completions (use /v1/completions for n > 1)",
                        code="unsupported_value")
    best_of = body.get("best_of")
    if best_of is not None and best_of != 1:
        raise bad_param("best_of", "only best_of=1 is supported", code="unsupported_value")
    names = ("functions", "function_call") + (("tools", "tool_choice", "response_format", "top_logprobs")
                                              if endpoint == "completions" else ("suffix", "echo"))
    for name in names:
        if body.get(name) not in (None, False, [], {}, ""):
            raise bad_param(name, f"'{name}' is not supported on this endpoint", code="unsupported_parameter")


def _logit_bias(body: dict, vocab_rows: int) -> dict[int, float]:
    v = body.get("logit_bias")
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise bad_param("logit_bias", "'logit_bias' must be an object {token id: bias}", code="invalid_type")
    if len(v) > MAX_LOGIT_BIAS:
        raise bad_param("logit_bias", f"'logit_bias' has {len(v)} entries, at most {MAX_LOGIT_BIAS}")
    out = {}
    for k, b in v.items():
        # ASCII digits only (str.isdigit also takes '²' and '١', which int() rejects or reads as another id), and few
        # enough that int() takes them (it refuses strings of more than 4,300 digits)
        if not (isinstance(k, str) and k.isascii() and k.isdigit() and len(k) <= 10 and int(k) < vocab_rows):
            raise bad_param("logit_bias", f"'logit_bias' key {k!r} is not a token id in [0, {vocab_rows})")
        if not _is_number(b) or not LOGIT_BIAS_RANGE[0] <= b <= LOGIT_BIAS_RANGE[1]:
            raise bad_param("logit_bias", f"'logit_bias' value for {k} must be a number in "
                                          f"[{LOGIT_BIAS_RANGE[0]:g}, {LOGIT_BIAS_RANGE[1]:g}], got {b!r}")
        out[int(k)] = float(b)
    return out


def _logprobs(body: dict, endpoint: str) -> int | None:
    """completions: `logprobs: N` (int); chat: `logprobs: bool` + `top_logprobs: N`."""
    if endpoint == "completions":
        return _opt_int(body, "logprobs", 0, MAX_TOP_LOGPROBS)
    want = _opt_bool(body, "logprobs", False)
    top = _opt_int(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top is not None and not want:
        raise bad_param("top_logprobs", "'top_logprobs' needs 'logprobs': true")
    return (top or 0) if want else None


def _check_model(body: dict, model_name: str) -> None:
    m = body.get("model")
    if m is None:
        raise bad_param("model", "'model' is required", code="missing_required_parameter")
    if not isinstance(m, str):
        raise bad_param("model", "'model' must be a string", code="invalid_type")
    if m != model_name:
        raise ApiError(404, f"The model '{m}' does not exist; this server serves '{model_name}'",
                       param="model", code="model_not_found")


def _sampling(body: dict, default_max_tokens: int | None, endpoint: str, vocab_rows: int) -> SamplingParams:
    max_tokens = _opt_int(body, "max_tokens", 1)
    mct = _opt_int(body, "max_completion_tokens", 1)       # the newer chat name for the same limit
    if max_tokens is not None and mct is not None and max_tokens != mct:
        raise bad_param("max_completion_tokens", "'max_tokens' and 'max_completion_tokens' disagree")
    max_tokens = max_tokens if max_tokens is not None else mct
    seed = _opt_int(body, "seed", SEED_RANGE[0], SEED_RANGE[1])
    top_k = _opt_int(body, "top_k", -1)                  # -1 = off, as vLLM spells it
    top_p = _opt_number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0.0:
        raise bad_param("top_p", "'top_p' must be > 0 (use temperature=0 for greedy decoding)")
    temperature = _opt_number(body, "temperature", 1.0, *TEMPERATURE_RANGE)
    if 0.0 < temperature < MIN_TEMPERATURE:   # the engine's floor (nanoqwen_rt.sampling): 0 is greedy
        raise bad_param("temperature", f"'temperature' must be 0 (greedy) or >= {MIN_TEMPERATURE:g}")
    return SamplingParams(
        max_tokens=max_tokens if max_tokens is not None else default_max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=max(top_k or 0, 0),
        seed=seed,
        stop=_stop(body),
        ignore_eos=_opt_bool(body, "ignore_eos", False),
        logprobs=_logprobs(body, endpoint),
        logit_bias=_logit_bias(body, vocab_rows),
        presence_penalty=_opt_number(body, "presence_penalty", 0.0, *PENALTY_RANGE),
        frequency_penalty=_opt_number(body, "frequency_penalty", 0.0, *PENALTY_RANGE),
    )


def _stream_flags(body: dict) -> tuple[bool, bool]:
    stream = _opt_bool(body, "stream", False)
    opts = body.get("stream_options")
    include_usage = False
    if opts is not None:
        if not isinstance(opts, dict):
            raise bad_param("stream_options", "'stream_options' must be an object", code="invalid_type")
        if not stream:
            raise bad_param("stream_options", "'stream_options' is only allowed when 'stream' is true")
        include_usage = _opt_bool(opts, "include_usage", False)
    return stream, include_usage


def _require_object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    return body


# ---------------------------------------------------------------- endpoints


def parse_completion(body: Any, model_name: str, vocab_rows: int = 2**31 - 1) -> CompletionRequest:
    """Validate a /v1/completions body. The prompt is one string or one list of token ids (a batch of exactly
    one of either is unwrapped); the ids' range is checked against the model by the server. `suffix` (fill in
    the middle) needs a text prompt; whether the model has FIM tokens is the server's check."""
    body = _require_object(body)
    _check_model(body, model_name)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if prompt is None:
        raise bad_param("prompt", "'prompt' is required", code="missing_required_parameter")
    is_ids = isinstance(prompt, list) and all(_is_int(t) for t in prompt)
    if not (isinstance(prompt, str) or is_ids):
        raise bad_param("prompt", "'prompt' must be a string or a list of token ids (a batch of one at most)",
                        code="invalid_type")
    _reject_unsupported(body, "completions")
    suffix = body.get("suffix")
    if suffix is not None:
        if not isinstance(suffix, str):
            raise bad_param("suffix", "'suffix' must be a string", code="invalid_type")
        if not isinstance(prompt, str):
            raise bad_param("suffix", "'suffix' (fill in the middle) needs a text prompt, not token ids")
    echo = _opt_bool(body, "echo", False)
    if echo and suffix is not None:
        raise bad_param("echo", "'echo' and 'suffix' cannot be combined", code="unsupported_value")
    n = _opt_int(body, "n", 1, MAX_N)
    stream, include_usage = _stream_flags(body)
    return CompletionRequest(prompt, _sampling(body, DEFAULT_COMPLETION_MAX_TOKENS, "completions", vocab_rows),
                             stream, include_usage, suffix, echo, n if n is not None else 1)


def _message_text(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):          # [{"type": "text", "text": "..."}]: text parts only
        parts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise bad_param(f"messages[{i}].content", "only text content parts are supported",
                                code="unsupported_value")
            parts.append(part["text"])
        return "".join(parts)
    raise bad_param(f"messages[{i}].content", "message content must be a string or a list of text parts",
                    code="invalid_type")


def _tool_calls(v: Any, i: int) -> list[dict]:
    """An assistant message's tool_calls, with each `arguments` JSON string parsed to the object the chat
    template renders (OpenAI sends a string; Qwen's template writes `arguments | tojson`)."""
    import json
    param = f"messages[{i}].tool_calls"
    if not isinstance(v, list):
        raise bad_param(param, "'tool_calls' must be a list", code="invalid_type")
    out = []
    for j, tc in enumerate(v):
        fn = tc.get("function") if isinstance(tc, dict) else None
        if not (isinstance(fn, dict) and isinstance(fn.get("name"), str)):
            raise bad_param(param, f"tool call {j} needs a function with a name", code="invalid_type")
        args = fn.get("arguments", "{}")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError as e:
                raise bad_param(param, f"tool call {j}: 'arguments' is not valid JSON: {e}") from None
        out.append({"id": tc.get("id"), "type": "function", "function": {"name": fn["name"], "arguments": args}})
    return out


def _tools(body: dict) -> tuple[list[dict] | None, str | dict]:
    from ..tools import InvalidTools, check_tools
    try:
        return check_tools(body.get("tools"), body.get("tool_choice"))
    except InvalidTools as e:
        raise bad_param(e.param, str(e), code=e.code) from None


def _response_format(body: dict) -> ResponseFormat:
    rf = body.get("response_format")
    if rf is None:
        return ResponseFormat()
    if not isinstance(rf, dict) or rf.get("type") not in ("text", "json_object", "json_schema"):
        raise bad_param("response_format", "'response_format' must be {'type': 'text' | 'json_object' | "
                                           "'json_schema', ...}")
    if rf["type"] != "json_schema":
        return ResponseFormat(rf["type"])
    js = rf.get("json_schema")
    if not isinstance(js, dict) or not isinstance(js.get("schema", {}), dict):
        raise bad_param("response_format", "'json_schema' must be an object with a 'schema' object",
                        code="invalid_type")
    return ResponseFormat("json_schema", js.get("schema", {}))


def parse_chat(body: Any, model_name: str, vocab_rows: int = 2**31 - 1) -> ChatRequest:
    """Validate a /v1/chat/completions body; message contents are flattened to plain text, assistant tool calls
    kept (their arguments parsed), tool results kept with their tool_call_id."""
    body = _require_object(body)
    _check_model(body, model_name)
    msgs = body.get("messages")
    if msgs is None:
        raise bad_param("messages", "'messages' is required", code="missing_required_parameter")
    if not isinstance(msgs, list) or not msgs:
        raise bad_param("messages", "'messages' must be a non-empty list", code="invalid_type")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise bad_param(f"messages[{i}]", "each message must be an object", code="invalid_type")
        role = m.get("role")
        if role not in ROLES:
            raise bad_param(f"messages[{i}].role", f"unknown role {role!r}; expected one of {', '.join(ROLES)}")
        msg = {"role": "system" if role == "developer" else role}
        if role == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = _tool_calls(m["tool_calls"], i)
            msg["content"] = _message_text(m["content"], i) if m.get("content") is not None else ""
        else:
            msg["content"] = _message_text(m.get("content"), i)
        if role == "tool" and isinstance(m.get("tool_call_id"), str):
            msg["tool_call_id"] = m["tool_call_id"]
        out.append(msg)
    _reject_unsupported(body, "chat")
    tools, tool_choice = _tools(body)
    rf = _response_format(body)
    if rf.type != "text" and tools is not None and tool_choice != "none":
        raise bad_param("response_format", "'response_format' and 'tools' cannot be combined",
                        code="unsupported_value")
    stream, include_usage = _stream_flags(body)
    return ChatRequest(out, _sampling(body, None, "chat", vocab_rows), stream, include_usage, tools, tool_choice, rf)


def check_context(prompt_tokens: int, max_tokens: int | None, context_length: int, prompt_param: str) -> int:
    """Return the number of new tokens to generate, or raise a 400 if the request does not fit the context."""
    if prompt_tokens >= context_length:
        raise ApiError(400, f"the prompt has {prompt_tokens} tokens; this model's context is {context_length} "
                            f"tokens, so at most {context_length - 1} fit with room for one new token",
                       param=prompt_param, code="context_length_exceeded")
    if max_tokens is None:
        return context_length - prompt_tokens
    if prompt_tokens + max_tokens > context_length:
        raise ApiError(400, f"prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) = "
                            f"{prompt_tokens + max_tokens} exceeds this model's context of {context_length} tokens",
                       param="max_tokens", code="context_length_exceeded")
    return max_tokens
