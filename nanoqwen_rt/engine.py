"""Engine: the public Python API (docs/architecture.md). Picks a backend, owns the tokenizer, streams text.

    with Engine("model.nanoqwen", device="auto") as eng:
        for chunk in eng.generate("def fib(n):", max_new_tokens=64):
            print(chunk.text, end="")
        print(eng.stats)

`generate`/`chat` validate their arguments when called (named EngineError subclasses, before any token is
produced) and return an iterator of GenerationChunk: one chunk per generated token (its text may be "" while a
multi-byte character or a possible stop-string prefix is held back); the last chunk has finish_reason "stop"
(stop id or stop string; the stop string / stop token text is never included) or "length" (max_new_tokens
reached or the context is full). Closing the iterator early is fine; `stats` then describes what ran.

generate()/chat() run one sequence: while a generator from them is live (not exhausted, closed or
garbage-collected), another generate/chat/logits call raises EngineBusy, from any thread. Many sequences at once go
through the batched API: submit() → a BatchGeneration handle, step() / start_loop() (nanoqwen_rt/scheduler.py).
"""
from __future__ import annotations

import collections
import contextlib
import os
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

import numpy as np

from .backends.base import Backend, BackendError, ContextFull, InvalidMaxContext, InvalidTokenIds, check_token_ids
from .fim import NoFimTokens, fim_prompt_ids, fim_stop_ids
from .logits import InvalidLogitsSettings, LogitsPipeline, LogitsSettings, TokenConstraint, TokenLogprob
from .kv_pool import PoolTooSmall
from .sampling import InvalidSamplingParams, SamplingParams, is_real
from .scheduler import DEFAULT_MAX_BATCH, BatchStats, Scheduler, _Seq
from .tokenizer import ChatTemplateError, Tokenizer, TokenizerError
from .tools import (TOOL_CALL_CLOSE, TOOL_CALL_OPEN, InvalidTools, check_tools, forced_tool_name,
                    tool_call_grammar)

__all__ = ["Engine", "GenerationChunk", "GenerationStats", "EngineError", "PromptTooLong", "EmptyPrompt",
           "InvalidArgument", "DeviceUnavailable", "EngineClosed", "EngineBusy", "NoTokenizer", "ChatError",
           "TokenIdOutOfRange", "FimUnsupported", "ToolsUnsupported", "TokenLogprob", "InvalidGrammar",
           "KvPoolTooSmall", "BatchGeneration", "BatchStats"]


# -- errors ---------------------------------------------------------------------------------------------
class EngineError(Exception):
    """Base of every error the Engine raises for bad input or an unusable setup."""


class InvalidArgument(EngineError, ValueError):
    """An argument is out of range or of the wrong type (message names it)."""


class PromptTooLong(InvalidArgument):
    """The prompt leaves no room for a generated token within max_context."""


class EmptyPrompt(InvalidArgument):
    """The prompt encodes to zero tokens."""


class TokenIdOutOfRange(InvalidArgument):
    """A token id is < 0 or ≥ vocab_rows."""


class DeviceUnavailable(EngineError):
    """device="cuda" was asked for but no CUDA backend can run here (or the device name is unknown)."""


class EngineClosed(EngineError):
    """The engine was used after close()."""


class EngineBusy(EngineError):
    """A generation (or logits call) started while another one of the same Engine is live. An Engine holds ONE
    sequence: finish, close() or drop the live generator first, or give each thread its own Engine."""


class NoTokenizer(EngineError):
    """Text was given but the file carries no tokenizer."""


class ChatError(InvalidArgument):
    """chat(): no chat template in the file, malformed messages, or the template raised."""


class ToolsUnsupported(ChatError):
    """chat()/render_chat() with tools and tool_choice "auto" on a file whose chat template has no tools section:
    the model would never see the tools (a forced tool_choice still works: its grammar carries them)."""


class InvalidGrammar(InvalidArgument):
    """json_constraint()/lark_constraint(): a schema or grammar the grammar engine refuses (message: its reason)."""


class KvPoolTooSmall(InvalidArgument):
    """submit(): the request (prompt + max_new_tokens) needs more KV pages than the engine's whole pool
    (Engine(kv_pages=...)); it could never run."""


class FimUnsupported(InvalidArgument):
    """fim(): the file's tokenizer has no fill-in-the-middle (or repo / file) marker tokens."""


# -- results --------------------------------------------------------------------------------------------
@dataclass
class GenerationChunk:
    text: str                      # new text (never contains a stop string or a stop token's text)
    token_ids: list[int]           # ids generated in this step (a stop id is listed; its text is not emitted)
    finish_reason: str | None = None   # None | "stop" | "length"
    #: with generate(logprobs=N): a TokenLogprob for each generated token whose text is emitted (in part), in the
    #: chunk whose text holds the token's first character (a token of held-back text comes with a later chunk, and
    #: one cut off wholly by a stop string never comes); a stop id has none
    logprobs: list[TokenLogprob] | None = None


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    completion_tokens: int = 0     # ids sampled, incl. a final stop id
    ttft_s: float = 0.0            # call → first token sampled (includes prefill)
    decode_s: float = 0.0          # first token → last token
    total_s: float = 0.0
    finish_reason: str | None = None

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens after the first / time after the first (0.0 when fewer than 2 tokens)."""
        n = self.completion_tokens - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0

    def as_dict(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "ttft_s": self.ttft_s, "decode_s": self.decode_s, "total_s": self.total_s,
                "decode_tokens_per_s": self.decode_tokens_per_s, "finish_reason": self.finish_reason}


# -- backend choice -------------------------------------------------------------------------------------
def _cuda_backend():
    """(nanoqwen_rt.backends.cuda, None) when the CUDA backend can run here, else (None, the reason in one line:
    missing library, dlopen error, missing symbol, ABI version, no device). Never raises."""
    try:
        from .backends import cuda
    except Exception as e:
        return None, f"the CUDA binding does not import: {type(e).__name__}: {e}"
    why = cuda.unavailable_reason()
    return (cuda, None) if why is None else (None, why)


DEVICES = ("auto", "cpu", "cuda")
#: numerics of the CPU backend (nanoqwen_rt/backends/cpu/backend.py): "fast" (int16 activations in the int4
#: products, an int8 lm_head: what the Engine serves with) or "oracle" (float32 throughout: what the tests compare
#: the CUDA backend and transformers against, and what nanoqwen-verify measures). The CUDA backend has one numerics.
CPU_NUMERICS = ("fast", "oracle")


class Engine:
    """One model file, one backend: one sequence at a time through generate(), many through submit()/step().

    Sharing is refused, never silently wrong: while a generator returned by generate()/chat() is live (not yet
    exhausted, closed or garbage-collected), or a logits() call runs, any other generate/chat/logits call (this
    thread or another) raises EngineBusy. The server drives the batched API from its worker thread.

    cpu_numerics: how the CPU backend computes when it is the one chosen (CPU_NUMERICS); "fast" by default.
    """

    def __init__(self, path: str | os.PathLike, device: str = "auto", max_context: int | None = None,
                 verify_checksums: bool = True, *, max_batch: int = DEFAULT_MAX_BATCH, kv_pages: int | None = None,
                 cpu_numerics: str = "fast"):
        from nanoqwen_format import open_file
        if device not in DEVICES:
            raise DeviceUnavailable(f"unknown device {device!r}: expected one of {', '.join(DEVICES)}")
        if cpu_numerics not in CPU_NUMERICS:
            raise InvalidArgument(f"cpu_numerics must be one of {', '.join(CPU_NUMERICS)}, got {cpu_numerics!r}")
        for name, v in (("max_batch", max_batch), ("kv_pages", kv_pages)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1):
                raise InvalidArgument(f"{name} must be a positive integer, got {v!r}")
        # the batched API (submit/step): its scheduler and KV pages are made on the first submit()
        self._max_batch = int(max_batch)
        self._kv_pages = None if kv_pages is None else int(kv_pages)
        self._scheduler: Scheduler | None = None
        self._batch_lock = threading.Lock()
        self._loop: tuple[threading.Thread, threading.Event] | None = None
        self.path = os.fspath(path)
        self._file = open_file(self.path, verify_checksums=verify_checksums)   # raises NanoqwenFormatError
        self._closed = False
        # Held while one sequence uses the backend (a live generation or a logits call); released by whichever
        # thread ends it (a threading.Lock, not an RLock: a generator may be finished on another thread or by GC).
        self._sequence = threading.Lock()
        # Held while a backend call computes (one generation step, a logits call): close() waits for it, so the
        # file and device memory are never freed under a running step of another thread.
        self._step = threading.Lock()
        self._live_generation: weakref.ref | None = None   # the generator holding the sequence, if any
        self._grammar_compiler = None                      # built on first use (nanoqwen_rt.grammar)
        self._grammar_lock = threading.Lock()
        self.backend: Backend | None = None
        #: why device="auto" runs on the CPU (None when it runs on CUDA or the CPU was asked for)
        self.cpu_reason: str | None = None
        try:
            self.config = self._file.config
            cuda, why = _cuda_backend() if device in ("auto", "cuda") else (None, None)
            if device == "cuda" and cuda is None:
                raise DeviceUnavailable(f"device 'cuda' asked for, but the CUDA backend cannot run here: {why}")
            self.cpu_reason = why
            try:
                if cuda is not None:
                    try:
                        self.backend = cuda.CudaBackend(self.path, max_context=max_context, file=self._file)
                    except cuda.UnsupportedModel as e:
                        # a valid file libnanoqwen does not run: "auto" falls back to the CPU, "cuda" says why
                        if device == "cuda":
                            raise DeviceUnavailable(f"the CUDA backend does not run this model: {e}") from None
                        self.cpu_reason = str(e)
                if self.backend is None:
                    from .backends.cpu import CPUBackend
                    self.backend = CPUBackend(self.path, max_context=max_context, file=self._file,
                                              numerics=cpu_numerics)
            except InvalidMaxContext as e:
                raise InvalidArgument(str(e)) from None
            self.device = self.backend.name
            try:
                self.tokenizer: Tokenizer | None = Tokenizer.from_file(self._file)
            except TokenizerError:
                self.tokenizer = None
            self.stats = GenerationStats()
        except BaseException:
            self.close()
            raise

    # -- lifetime -------------------------------------------------------------------------------------
    def close(self) -> None:
        """Free the backend and unmap the file. Idempotent. Waits for a step another thread is computing (one
        token). A generate() iterator still live is closed: it ends (StopIteration) without a finish_reason; a
        submit() handle raises EngineClosed on its next step."""
        if getattr(self, "_closed", True) and self.backend is None and getattr(self, "_file", None) is None:
            return
        if getattr(self, "_loop", None) is not None:
            self.stop_loop()             # before the step lock: the loop thread may be waiting for it
        step = getattr(self, "_step", None)
        with step if step is not None else contextlib.nullcontext():
            self._close_now()

    def _close_now(self) -> None:
        self._closed = True
        live = self._live_generation() if getattr(self, "_live_generation", None) is not None else None
        if live is not None:
            live.close()            # stops its backend stream (CUDA: the nq_generate thread) before the free
        if getattr(self, "_scheduler", None) is not None:
            self._scheduler.close(EngineClosed("the engine was closed during this generation"))
        if self.backend is not None:
            self.backend.close()
            self.backend = None
        if getattr(self, "_file", None) is not None:
            close = getattr(self._file, "close", None)
            if close is not None:
                close()
            self._file = None

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False

    def _check_open(self) -> Backend:
        if self._closed or self.backend is None:
            raise EngineClosed("the engine is closed")
        return self.backend

    def _claim_sequence(self) -> None:
        """Take the engine's one sequence, or raise EngineBusy (never waits: a wait could deadlock a thread that
        holds the live generator itself)."""
        if not self._sequence.acquire(blocking=False):
            raise EngineBusy("this Engine is already generating (a live generator, or a call on another thread): "
                             "finish or close() that generator first, or use one Engine per thread")

    @property
    def max_context(self) -> int:
        return self._check_open().max_context

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """Default stop ids: the file's generation_config eos ids + header eos id."""
        if self.tokenizer is not None:
            return self.tokenizer.stop_token_ids
        e = self.config.eos_token_id
        return (int(e),) if e >= 0 else ()

    # -- inputs ---------------------------------------------------------------------------------------
    def encode(self, prompt: str | Sequence[int]) -> np.ndarray:
        """str → ids via the file's tokenizer (with the BOS id first when its config says add_bos_token, as
        transformers does); a list of ints is type-checked and passed through as is. int64 (n,); the range of
        the ids is checked by the backend (Backend.prefill/generate_ids), once. Text that is not valid Unicode
        (a lone surrogate) is an InvalidArgument."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise NoTokenizer("this file has no tokenizer: pass token ids instead of text")
            try:
                ids = self.tokenizer.encode(prompt, add_bos=True)
            except TokenizerError as e:
                raise InvalidArgument(f"prompt: {e}") from None
        elif isinstance(prompt, np.ndarray) and prompt.ndim != 1:
            raise InvalidArgument(f"token ids must be a 1-D array, got shape {prompt.shape}")
        elif isinstance(prompt, np.ndarray) and prompt.dtype.kind in "iu":
            ids = prompt                                 # integer array: no per-element check needed
            if prompt.dtype.kind == "u" and prompt.size and int(prompt.max()) > np.iinfo(np.int64).max:
                raise TokenIdOutOfRange(f"token id {int(prompt.max())} is outside the vocabulary")
        elif isinstance(prompt, (list, tuple)) and set(map(type, prompt)) == {int}:
            ids = prompt                                 # plain ints (the common case: ~2x faster than the loop below)
        elif isinstance(prompt, (list, tuple, np.ndarray)):
            ids = list(prompt)
            for i in ids:
                if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
                    raise InvalidArgument(f"token ids must be integers, found {i!r}")
        else:
            raise InvalidArgument(f"prompt must be str or a list of token ids, got {type(prompt).__name__}")
        if len(ids) == 0:
            raise EmptyPrompt("the prompt is empty (0 tokens)")
        try:
            return np.asarray(ids, dtype=np.int64)  # ids are range-checked once, by the backend edge
        except OverflowError:                       # an int past int64 is no token id either
            big = next(int(i) for i in ids if not -2**63 <= int(i) < 2**63)
            raise TokenIdOutOfRange(f"token id {big} is outside the vocabulary") from None

    # -- API ------------------------------------------------------------------------------------------
    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """float32 (len(ids), vocab_rows) logits of every position of a fresh sequence (for tests)."""
        be = self._check_open()
        arr = self.encode(list(ids) if not isinstance(ids, np.ndarray) else ids)
        self._claim_sequence()
        try:
            with self._step, _named_input_errors():
                self._check_open()
                return be.logits_all(arr)
        finally:
            self._sequence.release()

    def generate(self, prompt: str | Sequence[int], max_new_tokens: int = 128, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, seed: int | None = None, stop: Iterable[str] | None = None,
                 stop_token_ids: Iterable[int] | None = None, *, logprobs: int | None = None,
                 logit_bias: dict[int, float] | None = None, presence_penalty: float = 0.0,
                 frequency_penalty: float = 0.0,
                 constraint: TokenConstraint | None = None) -> Iterator[GenerationChunk]:
        """Stream a completion of `prompt` (text or ids). Arguments are validated now; tokens come lazily.

        stop_token_ids None → the file's default stop ids (eos); pass [] to disable them. `stop`: strings that
        end generation (not included in the text).
        logprobs N (0..20): each chunk carries the sampled tokens' logprobs and the N most likely alternatives
        (nanoqwen_rt.logits: computed from the logits the sampler used). logit_bias {token id: -100..100},
        presence_penalty / frequency_penalty (-2..2): as OpenAI's. constraint: a grammar (json_constraint())
        that masks the tokens it does not allow; the generation ends ("stop") once the grammar is complete.
        """
        t0 = time.perf_counter()
        be = self._check_open()
        max_new_tokens, params, stop_ids, stops_s, settings = self._request_settings(
            max_new_tokens, temperature, top_k, top_p, seed, stop, stop_token_ids, logprobs, logit_bias,
            presence_penalty, frequency_penalty, constraint)
        ids = self.encode(prompt)
        self._claim_sequence()
        try:
            with _named_input_errors():      # the backend checks ids and the context (eagerly, at this call)
                if settings.changes_logits or settings.top_logprobs is not None or constraint is not None:
                    token_iter = be.generate_steered(ids, params, max_new_tokens, stop_ids,
                                                     LogitsPipeline(settings, constraint))
                else:
                    token_iter = _plain_steps(be.generate_ids(ids, params, max_new_tokens, stop_ids))
        except BaseException:
            self._sequence.release()
            raise
        self.stats = GenerationStats(prompt_tokens=int(ids.shape[0]))
        gen = _Generation(self, self._stream(token_iter, ids.shape[0], max_new_tokens, be.max_context,
                                             stop_ids, stops_s, t0))
        self._live_generation = weakref.ref(gen)
        return gen

    def _request_settings(self, max_new_tokens, temperature, top_k, top_p, seed, stop, stop_token_ids, logprobs,
                          logit_bias, presence_penalty, frequency_penalty, constraint):
        """generate()/submit()'s argument checks, one place: (max_new_tokens capped at what the context can hold
        (the C ABI takes an int32), SamplingParams, stop ids, stop strings, LogitsSettings), or a named
        InvalidArgument / NoTokenizer."""
        if constraint is not None and not all(hasattr(constraint, a) for a in ("fill_bitmask", "accept", "complete")):
            raise InvalidArgument(f"constraint must be a TokenConstraint (json_constraint(), lark_constraint()), got "
                                  f"{type(constraint).__name__}")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) \
                or max_new_tokens < 1:
            raise InvalidArgument(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        try:   # numbers become floats; anything else (a bool, a string) reaches the check as it is
            params = SamplingParams(float(temperature) if is_real(temperature) else temperature,
                                    top_k, float(top_p) if is_real(top_p) else top_p, seed)
        except InvalidSamplingParams as e:
            raise InvalidArgument(str(e)) from None
        stops_s: list[str] = []
        if stop is not None:
            if isinstance(stop, str):
                stop = [stop]
            if not isinstance(stop, (list, tuple, set, frozenset)):
                raise InvalidArgument(f"stop must be a str or a list of str, got {type(stop).__name__}")
            for s in stop:
                if not isinstance(s, str) or s == "":
                    raise InvalidArgument(f"stop strings must be non-empty str, got {s!r}")
                stops_s.append(s)
        if stops_s and self.tokenizer is None:
            raise NoTokenizer("stop strings need the file's tokenizer")
        if stop_token_ids is None:
            stop_ids = set(self.stop_token_ids)
        else:
            if not isinstance(stop_token_ids, (list, tuple, set, frozenset, np.ndarray)):
                raise InvalidArgument(f"stop_token_ids must be a list of token ids, got "
                                      f"{type(stop_token_ids).__name__}")
            stop_ids = set()
            vocab = int(self.config.vocab_rows)
            for t in stop_token_ids:
                if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
                    raise InvalidArgument(f"stop_token_ids must be integers, found {t!r}")
                if not 0 <= t < vocab:   # one that can never be sampled would never stop anything
                    raise TokenIdOutOfRange(f"stop_token_ids: {int(t)} is outside [0, {vocab})")
                stop_ids.add(int(t))
        try:
            settings = LogitsSettings(int(self.config.vocab_rows), {} if logit_bias is None else logit_bias,
                                      presence_penalty, frequency_penalty, logprobs)
        except InvalidLogitsSettings as e:
            raise InvalidArgument(str(e)) from None
        return min(int(max_new_tokens), self._check_open().max_context), params, stop_ids, stops_s, settings

    def chat(self, messages: Sequence[dict], tools: Sequence[dict] | None = None,
             tool_choice: str | dict | None = None, **kw) -> Iterator[GenerationChunk]:
        """Apply the file's chat template (with the generation prompt) and generate(); same keyword arguments.
        `tools`: OpenAI-style tool definitions, rendered by the template's own tools section (Qwen2.5's asks for
        `<tool_call>{...}</tool_call>` answers; nanoqwen_rt.tools.parse_tool_calls parses them). `tool_choice`
        as OpenAI's: "auto" (the default with tools), "none", "required" or {"type": "function", "function":
        {"name": ...}}; the last two force one valid call with a grammar (tool_choice_grammar), so they cannot be
        combined with `constraint`. See render_chat for a template without a tools section."""
        prompt = self.render_chat(messages, tools, tool_choice)
        grammar = self.tool_choice_grammar(tools, tool_choice)
        if grammar is not None:
            if kw.get("constraint") is not None:
                raise InvalidArgument("a forced tool_choice already constrains the answer; drop constraint=")
            kw["constraint"] = self.lark_constraint(grammar)
        return self.generate(prompt, **kw)

    def render_chat(self, messages: Sequence[dict], tools: Sequence[dict] | None = None,
                    tool_choice: str | dict | None = None) -> str:
        """The prompt text chat() generates from (ChatError on a bad conversation or template). The tools are
        rendered unless tool_choice is "none". A template without a tools section (Tokenizer.renders_tools; the
        embedded demo model's) never shows them to the model: with tool_choice "auto" that is ToolsUnsupported,
        since the model could not know the tools; a forced tool_choice renders the conversation alone, the
        grammar carrying the tools' names and schemas."""
        if self.tokenizer is None:
            raise NoTokenizer("this file has no tokenizer, so no chat template")
        if not isinstance(messages, (list, tuple)):
            raise ChatError(f"messages must be a list of dicts, got {type(messages).__name__}")
        tools, choice = self._check_tools(tools, tool_choice)
        try:
            if tools is not None and choice != "none" and not self.tokenizer.renders_tools:
                if choice == "auto":
                    raise ToolsUnsupported(
                        "this file's chat template has no tools section, so with tool_choice 'auto' the model "
                        "would never see the tools; force a call (tool_choice 'required' or a named function: a "
                        "grammar then carries the tools) or pass tool_choice 'none'")
                tools = None
            return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                      **({"tools": tools} if tools and choice != "none" else {}))
        except ChatTemplateError as e:
            raise ChatError(str(e)) from None

    def tool_choice_grammar(self, tools: Sequence[dict] | None, tool_choice: str | dict | None) -> str | None:
        """The Lark grammar a forced tool_choice ("required" or a named function) puts on the answer: exactly one
        `<tool_call>` of such a tool, its arguments valid against the tool's `parameters`
        (nanoqwen_rt.tools.tool_call_grammar); None for "auto" / "none" / no tools. The markers are matched as
        the tokenizer's `<tool_call>` / `</tool_call>` tokens where it has them (Qwen2.5's), as text where not
        (the embedded demo model's)."""
        tools, choice = self._check_tools(tools, tool_choice)
        if tools is None or choice in ("auto", "none"):
            return None
        if self.tokenizer is None:
            raise NoTokenizer("this file has no tokenizer: a forced tool call is text, so it needs one")
        ids = (self.tokenizer.token_to_id(TOOL_CALL_OPEN), self.tokenizer.token_to_id(TOOL_CALL_CLOSE))
        return tool_call_grammar(tools, forced_tool_name(choice), None if None in ids else ids)

    @staticmethod
    def _check_tools(tools, tool_choice):
        try:
            return check_tools(tools, tool_choice)
        except InvalidTools as e:
            raise InvalidArgument(str(e)) from None

    def _grammars(self):
        from .grammar import GrammarCompiler, GrammarError
        if self.tokenizer is None:
            raise NoTokenizer("this file has no tokenizer: a grammar constrains text, so it needs one")
        with self._grammar_lock:
            if self._grammar_compiler is None:
                try:
                    self._grammar_compiler = GrammarCompiler(self.tokenizer.json_text, int(self.config.vocab_rows),
                                                             list(self.stop_token_ids))
                except GrammarError as e:
                    raise InvalidGrammar(str(e)) from None
            return self._grammar_compiler

    def json_constraint(self, schema: dict | None = None):
        """A constraint for generate(constraint=...): the output is one JSON object (schema None) or one JSON
        value valid against `schema`. Make one per generation (it holds the parse state). InvalidGrammar when the
        grammar engine refuses the schema. The first call builds the grammar engine's tokenizer (seconds for a
        150k vocabulary); later calls reuse it."""
        from .grammar import GrammarError
        try:
            return self._grammars().json(schema)
        except GrammarError as e:
            raise InvalidGrammar(f"response format: {e}") from None

    def lark_constraint(self, grammar: str):
        """A constraint from a Lark grammar (llguidance's dialect; `%json {...}` embeds a JSON Schema)."""
        from .grammar import GrammarError
        if not isinstance(grammar, str):
            raise InvalidGrammar(f"grammar must be a str (a Lark grammar), got {type(grammar).__name__}")
        try:
            return self._grammars().lark(grammar)
        except GrammarError as e:
            raise InvalidGrammar(f"grammar: {e}") from None

    def fim_ids(self, prefix: str, suffix: str = "", *, repo_name: str | None = None,
                files: Sequence[tuple[str, str]] = (), path: str | None = None) -> list[int]:
        """Token ids of Qwen2.5-Coder's fill-in-the-middle prompt (nanoqwen_rt.fim); FimUnsupported when the
        tokenizer lacks the marker tokens."""
        if self.tokenizer is None:
            raise NoTokenizer("this file has no tokenizer: fill-in-the-middle needs its marker tokens")
        for name, v in (("prefix", prefix), ("suffix", suffix)):
            if not isinstance(v, str):
                raise InvalidArgument(f"{name} must be str, got {type(v).__name__}")
        try:
            return fim_prompt_ids(self.tokenizer, prefix, suffix, repo_name=repo_name, files=list(files), path=path)
        except NoFimTokens as e:
            raise FimUnsupported(str(e)) from None
        except (TokenizerError, ValueError, TypeError) as e:
            raise InvalidArgument(f"fill-in-the-middle: {e}") from None

    def fim(self, prefix: str, suffix: str = "", *, repo_name: str | None = None,
            files: Sequence[tuple[str, str]] = (), path: str | None = None, **kw) -> Iterator[GenerationChunk]:
        """Generate the code between `prefix` and `suffix` (Qwen2.5-Coder's FIM prompt). Repository form with
        `repo_name`: `files` = the other files as (path, content), `path` = this file's path. Stops at the FIM end
        tokens (nanoqwen_rt.fim.FIM_STOP_TOKENS) unless stop_token_ids is given. Other keyword arguments as
        generate()."""
        ids = self.fim_ids(prefix, suffix, repo_name=repo_name, files=files, path=path)
        kw.setdefault("stop_token_ids", fim_stop_ids(self.tokenizer))
        return self.generate(ids, **kw)

    # -- many sequences (the batched API) ---------------------------------------------------------------
    def submit(self, prompt: str | Sequence[int], max_new_tokens: int = 128, temperature: float = 0.0,
               top_k: int = 0, top_p: float = 1.0, seed: int | None = None, stop: Iterable[str] | None = None,
               stop_token_ids: Iterable[int] | None = None, *, logprobs: int | None = None,
               logit_bias: dict[int, float] | None = None, presence_penalty: float = 0.0,
               frequency_penalty: float = 0.0, constraint: TokenConstraint | None = None) -> "BatchGeneration":
        """Queue a generation on the engine's batch and return its handle at once (no compute here). Same
        arguments, checks and chunks as generate(). Many handles may be live at once, from any threads.

        The work happens in step() (nanoqwen_rt/scheduler.py): iterating a handle calls step() itself while it has
        no chunk ready (so a plain `for chunk in handle` works); start_loop() runs steps on a background thread
        instead; `handle.poll()` returns the chunks ready now without stepping. Closing (or dropping) a handle
        cancels its sequence and returns its KV pages at once. The first submit() allocates the KV pages
        (Engine(kv_pages=...), max_batch sequences at a time). A request that needs more pages than the pool has
        raises KvPoolTooSmall; one that needs more than are free waits for running sequences to end.
        """
        t0 = time.perf_counter()
        be = self._check_open()
        max_new_tokens, params, stop_ids, stops_s, settings = self._request_settings(
            max_new_tokens, temperature, top_k, top_p, seed, stop, stop_token_ids, logprobs, logit_bias,
            presence_penalty, frequency_penalty, constraint)
        with _named_input_errors():
            ids = check_token_ids(self.encode(prompt), int(self.config.vocab_rows))
        if ids.shape[0] >= be.max_context:
            raise PromptTooLong(f"prompt of {ids.shape[0]} tokens leaves no room for a new token in "
                                f"max_context={be.max_context}")
        pipeline = LogitsPipeline(settings, constraint) if (settings.changes_logits or constraint is not None
                                                            or settings.top_logprobs is not None) else None
        sched = self._batch()
        handle = BatchGeneration(self, sched, int(ids.shape[0]), max_new_tokens, be.max_context, stop_ids,
                                 stops_s, t0)
        seq = _Seq(ids, params, max_new_tokens, stop_ids, pipeline, handle._push)
        handle._seq = seq
        try:
            sched.add(seq)
        except PoolTooSmall as e:
            handle._live = False
            raise KvPoolTooSmall(str(e)) from None
        return handle

    def step(self) -> int:
        """One step of the batch (admit, one decode token per running sequence, prompt chunks, retire): see
        nanoqwen_rt/scheduler.py. Returns the tokens sampled. A no-op before the first submit()."""
        self._check_open()
        sched = self._scheduler
        return sched.step() if sched is not None else 0

    def batch_stats(self) -> BatchStats | None:
        """Running / waiting sequences, KV pages used / free / cached, prefix-cache hits, tokens/s (None before
        the first submit())."""
        sched = self._scheduler
        return sched.stats() if sched is not None else None

    def start_loop(self) -> None:
        """Run step() on a background daemon thread whenever the batch has work, until stop_loop() or close();
        handles then wait for their chunks instead of stepping. Idempotent."""
        self._check_open()
        if self._loop is not None:
            return
        sched = self._batch()
        stop = threading.Event()

        def loop():
            while not stop.is_set():
                if sched.has_work:
                    sched.step()
                else:
                    with sched.changed:
                        if not sched.has_work and not stop.is_set():
                            sched.changed.wait()
        th = threading.Thread(target=loop, name="nanoqwen-batch", daemon=True)
        self._loop = (th, stop)
        th.start()

    def stop_loop(self) -> None:
        """Stop the background loop (after its current step). Handles go back to stepping themselves."""
        loop, self._loop = self._loop, None
        if loop is None:
            return
        th, stop = loop
        stop.set()
        sched = self._scheduler
        with sched.changed:
            sched.changed.notify_all()
        th.join()

    @property
    def max_batch(self) -> int:
        """Sequences the batched API runs at once (Engine(max_batch=...))."""
        return self._max_batch

    @property
    def looping(self) -> bool:
        return self._loop is not None

    def open_batch(self) -> None:
        """Make the batched API's scheduler and allocate its KV pages now (submit() does it on first use)."""
        self._batch()

    def _batch(self) -> Scheduler:
        """The scheduler, made (and the KV pages allocated) on first use."""
        with self._batch_lock:
            if self._scheduler is None:
                be = self._check_open()
                n_pages = self._kv_pages
                try:
                    n_pages = n_pages or be.default_kv_pages(self._max_batch)
                    self._scheduler = Scheduler(be, self._max_batch, n_pages, self._step)
                except BackendError as e:
                    raise DeviceUnavailable(str(e)) from None
                except (MemoryError, ValueError, OverflowError) as e:   # the CPU pool is numpy arrays
                    raise InvalidArgument(f"kv_pages={n_pages}: the KV pool cannot be allocated "
                                          f"({type(e).__name__}: {e})") from None
            return self._scheduler

    # -- streaming ------------------------------------------------------------------------------------
    def _stream(self, token_iter: Iterator[tuple[int, TokenLogprob | None, bool]], n_prompt: int, max_new: int,
                max_context: int, stop_ids: set[int], stops_s: list[str], t0: float,
                st: GenerationStats | None = None) -> Iterator[GenerationChunk]:
        """Token ids → text chunks (stop ids and strings, held-back stop prefixes, the finish reason); the timings
        go to `st` (the engine's stats by default)."""
        st = self.stats if st is None else st
        dec = self.tokenizer.stream_decoder() if self.tokenizer is not None else None
        acc = ""          # all text decoded so far
        emitted = 0       # chars of acc already yielded
        finish = None
        t_first = t_last = None
        # Logprobs travel with their token's text: (where the token's text starts in acc, its TokenLogprob) of the
        # tokens whose text is not yet emitted (held back as a possible stop prefix, or an incomplete character).
        # A chunk carries those whose text starts before the end of its text; a stop string's cut drops the tokens
        # wholly after it. None while logprobs are off (every lp is None).
        held: list[tuple[int, TokenLogprob]] | None = None

        def release(upto: int | None) -> list[TokenLogprob] | None:
            """The held logprobs of tokens whose text starts before char `upto` of acc (None: all of them)."""
            nonlocal held
            if held is None:
                return None
            k = len(held) if upto is None else sum(1 for start, _ in held if start < upto)
            out, held = [lp for _, lp in held[:k]], held[k:]
            return out

        try:
            for tok, lp, complete in token_iter:
                if lp is not None and held is None:
                    held = []
                t_last = time.perf_counter()
                if t_first is None:
                    t_first = t_last
                    st.ttft_s = t_first - t0
                st.completion_tokens += 1
                if tok in stop_ids:      # a stop id has no logprob entry and no text of its own
                    finish = "stop"
                    text = acc[emitted:] if dec is None else acc[emitted:] + dec.flush()
                    cut, hit = _cut_stop(text, stops_s)
                    yield GenerationChunk(cut, [tok], finish, release(emitted + len(cut) if hit else None))
                    return
                if lp is not None:
                    held.append((len(acc), lp))
                if dec is not None:
                    acc += dec.push([tok])
                end_now = (st.completion_tokens >= max_new
                           or n_prompt + st.completion_tokens >= max_context)
                if stops_s:
                    j = _find_stop(acc, emitted, stops_s)
                    if j >= 0:
                        finish = "stop"
                        yield GenerationChunk(acc[emitted:j], [tok], finish, release(j))
                        return
                if end_now or complete:
                    finish = "stop" if complete else "length"
                    rest = acc[emitted:] + (dec.flush() if dec is not None else "")
                    cut, hit = _cut_stop(rest, stops_s)
                    yield GenerationChunk(cut, [tok], "stop" if hit else finish,
                                          release(emitted + len(cut) if hit else None))
                    finish = "stop" if hit else finish
                    return
                safe = len(acc) - _held_back(acc, emitted, stops_s)
                text = acc[emitted:safe]
                emitted = safe
                yield GenerationChunk(text, [tok], None, release(safe if dec is not None else None))
        finally:
            if hasattr(token_iter, "close"):
                token_iter.close()
            now = time.perf_counter()
            st.total_s = now - t0
            if t_first is not None:
                st.decode_s = t_last - t_first
            st.finish_reason = finish


class _Generation:
    """The iterator generate() returns: it holds the Engine's sequence until it is exhausted, closed, fails or is
    garbage-collected (a plain generator that was never started runs no `finally` when dropped, so the
    release lives here)."""

    def __init__(self, engine: Engine, chunks: Iterator[GenerationChunk]):
        self._engine = engine
        self._chunks = chunks
        self._live = True

    def __iter__(self) -> "_Generation":
        return self

    def __next__(self) -> GenerationChunk:
        if not self._live:
            raise StopIteration
        try:
            with self._engine._step:
                if self._engine._closed:
                    raise EngineClosed("the engine was closed during this generation")
                return next(self._chunks)
        except BaseException:        # StopIteration, an error, Ctrl-C: the generation is over either way
            self.close()
            raise

    def close(self) -> None:
        """Stop the generation now and free the engine for the next one. Idempotent."""
        if not self._live:
            return
        self._live = False
        try:
            self._chunks.close()
        finally:
            self._engine._sequence.release()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class BatchGeneration:
    """The handle Engine.submit() returns: an iterator of GenerationChunk (the same chunks generate() yields for
    the request), fed by the engine's steps. `stats`: this request's GenerationStats (ttft_s counts from submit(),
    so it includes the time spent waiting for a batch slot or KV pages). Iterating steps the engine while no chunk
    is ready (or waits for the background loop's steps); poll() never steps. close() cancels the sequence: its
    KV pages return to the pool at once (or after the step now running). Thread-safe against the stepping
    thread; one consumer per handle."""

    def __init__(self, engine: Engine, sched: Scheduler, n_prompt: int, max_new: int, max_context: int,
                 stop_ids: set[int], stops_s: list[str], t0: float):
        self._engine = engine
        self._sched = sched
        self._seq: _Seq | None = None
        self._q: collections.deque = collections.deque()       # (token, logprob, complete) not yet consumed
        self.stats = GenerationStats(prompt_tokens=n_prompt)
        self._chunks = engine._stream(self._tokens(), n_prompt, max_new, max_context, stop_ids, stops_s, t0,
                                      self.stats)
        self._live = True

    def _push(self, tok: int, lp, complete: bool) -> None:
        """Called by the stepping thread, under the step lock, for each token sampled for this sequence."""
        self._q.append((tok, lp, complete))

    def _tokens(self):
        while True:
            if self._q:
                yield self._q.popleft()
            elif self._seq.done:
                return
            else:
                raise AssertionError("BatchGeneration: a chunk was asked for before its token was sampled")

    def _wait_for_token(self) -> None:
        seq, sched = self._seq, self._sched
        while not self._q and not seq.done:
            if self._engine.looping:
                with sched.changed:
                    if not self._q and not seq.done and self._engine.looping:
                        sched.changed.wait(0.25)
            else:
                self._engine._check_open()
                sched.step()

    def __iter__(self) -> "BatchGeneration":
        return self

    def __next__(self) -> GenerationChunk:
        if not self._live:
            raise StopIteration
        try:
            self._wait_for_token()
            if not self._q and self._seq.error is not None:
                raise self._seq.error
            chunk = next(self._chunks)
        except BaseException:         # StopIteration, an error, Ctrl-C: this generation is over either way
            self.close()
            raise
        if chunk.finish_reason is not None:
            self.close()              # a stop string ends it here: the sequence leaves the batch now
            self.stats.finish_reason = chunk.finish_reason
        return chunk

    def poll(self) -> list[GenerationChunk]:
        """The chunks ready now (possibly none), without stepping the engine. Raises what the generation raised."""
        out = []
        while self._live and (self._q or self._seq.done):
            try:
                out.append(next(self))
            except StopIteration:
                break
        return out

    @property
    def done(self) -> bool:
        """True once every chunk was consumed (or the handle was closed)."""
        return not self._live

    def close(self) -> None:
        """Cancel the generation (if it still runs) and free its KV pages. Idempotent."""
        if not self._live:
            return
        self._live = False
        try:
            self._chunks.close()
        finally:
            if self._seq is not None:
                self._sched.cancel(self._seq)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _plain_steps(token_iter: Iterator[int]) -> Iterator[tuple[int, None, bool]]:
    """generate_ids' ids in generate_steered's (token, logprob, complete) shape; closing this closes theirs."""
    try:
        for t in token_iter:
            yield t, None, False
    finally:
        token_iter.close()


@contextlib.contextmanager
def _named_input_errors():
    """The backend edge's input errors as the Engine's named ones: InvalidTokenIds → TokenIdOutOfRange,
    ContextFull → PromptTooLong."""
    try:
        yield
    except InvalidTokenIds as e:
        raise TokenIdOutOfRange(str(e)) from None
    except ContextFull as e:
        raise PromptTooLong(str(e)) from None


def _find_stop(acc: str, start: int, stops: list[str]) -> int:
    """Earliest index ≥ start where any stop string begins in acc, or -1."""
    best = -1
    for s in stops:
        j = acc.find(s, start)
        if j >= 0 and (best < 0 or j < best):
            best = j
    return best


def _cut_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    j = _find_stop(text, 0, stops)
    return (text, False) if j < 0 else (text[:j], True)


def _held_back(acc: str, start: int, stops: list[str]) -> int:
    """Length of the longest suffix of acc[start:] that is a proper prefix of some stop string."""
    best = 0
    tail = acc[start:]
    for s in stops:
        for n in range(min(len(s) - 1, len(tail)), best, -1):
            if tail.endswith(s[:n]):
                best = n
                break
    return best
