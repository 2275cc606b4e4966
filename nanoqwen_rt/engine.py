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
"""
from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

import numpy as np

from .backends.base import Backend, ContextFull, InvalidMaxContext, InvalidTokenIds
from .sampling import InvalidSamplingParams, SamplingParams
from .tokenizer import ChatTemplateError, Tokenizer, TokenizerError

__all__ = ["Engine", "GenerationChunk", "GenerationStats", "EngineError", "PromptTooLong", "EmptyPrompt",
           "InvalidArgument", "DeviceUnavailable", "EngineClosed", "NoTokenizer", "ChatError", "TokenIdOutOfRange"]


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


class NoTokenizer(EngineError):
    """Text was given but the file carries no tokenizer."""


class ChatError(InvalidArgument):
    """chat(): no chat template in the file, malformed messages, or the template raised."""


# -- results --------------------------------------------------------------------------------------------
@dataclass
class GenerationChunk:
    text: str                      # new text (never contains a stop string or a stop token's text)
    token_ids: list[int]           # ids generated in this step (a stop id is listed; its text is not emitted)
    finish_reason: str | None = None   # None | "stop" | "length"


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


class Engine:
    """One model file, one backend, one sequence at a time (not thread-safe: the server serialises calls)."""

    def __init__(self, path: str | os.PathLike, device: str = "auto", max_context: int | None = None,
                 verify_checksums: bool = True):
        from nanoqwen_format import open_file
        if device not in DEVICES:
            raise DeviceUnavailable(f"unknown device {device!r}: expected one of {', '.join(DEVICES)}")
        self.path = os.fspath(path)
        self._file = open_file(self.path, verify_checksums=verify_checksums)   # raises NanoqwenFormatError
        self._closed = False
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
                    self.backend = CPUBackend(self.path, max_context=max_context, file=self._file)
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
        """Free the backend and unmap the file. Idempotent."""
        if getattr(self, "_closed", True) and self.backend is None and getattr(self, "_file", None) is None:
            return
        self._closed = True
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
        """str → ids via the file's tokenizer; a list of ints is type-checked and passed through. int64 (n,);
        the range of the ids is checked by the backend (Backend.prefill/generate_ids), once."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise NoTokenizer("this file has no tokenizer: pass token ids instead of text")
            ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, (list, tuple, np.ndarray)):
            ids = list(prompt)
            for i in ids:
                if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
                    raise InvalidArgument(f"token ids must be integers, found {i!r}")
        else:
            raise InvalidArgument(f"prompt must be str or a list of token ids, got {type(prompt).__name__}")
        if len(ids) == 0:
            raise EmptyPrompt("the prompt is empty (0 tokens)")
        return np.asarray(ids, dtype=np.int64)      # ids are range-checked once, by the backend edge

    # -- API ------------------------------------------------------------------------------------------
    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """float32 (len(ids), vocab_rows) logits of every position of a fresh sequence (for tests)."""
        be = self._check_open()
        arr = self.encode(list(ids) if not isinstance(ids, np.ndarray) else ids)
        with _named_input_errors():
            return be.logits_all(arr)

    def generate(self, prompt: str | Sequence[int], max_new_tokens: int = 128, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, seed: int | None = None, stop: Iterable[str] | None = None,
                 stop_token_ids: Iterable[int] | None = None) -> Iterator[GenerationChunk]:
        """Stream a completion of `prompt` (text or ids). Arguments are validated now; tokens come lazily.

        stop_token_ids None → the file's default stop ids (eos); pass [] to disable them. `stop`: strings that
        end generation (not included in the text).
        """
        t0 = time.perf_counter()
        be = self._check_open()
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) \
                or max_new_tokens < 1:
            raise InvalidArgument(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        try:
            params = SamplingParams(float(temperature) if isinstance(temperature, (int, float)) else temperature,
                                    top_k, float(top_p) if isinstance(top_p, (int, float)) else top_p, seed)
        except InvalidSamplingParams as e:
            raise InvalidArgument(str(e)) from None
        stops_s: list[str] = []
        if stop is not None:
            if isinstance(stop, str):
                stop = [stop]
            for s in stop:
                if not isinstance(s, str) or s == "":
                    raise InvalidArgument(f"stop strings must be non-empty str, got {s!r}")
                stops_s.append(s)
        if stops_s and self.tokenizer is None:
            raise NoTokenizer("stop strings need the file's tokenizer")
        if stop_token_ids is None:
            stop_ids = set(self.stop_token_ids)
        else:
            stop_ids = set()
            for t in stop_token_ids:
                if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
                    raise InvalidArgument(f"stop_token_ids must be integers, found {t!r}")
                stop_ids.add(int(t))
        ids = self.encode(prompt)
        with _named_input_errors():      # the backend checks ids and the context (eagerly, at this call)
            token_iter = be.generate_ids(ids, params, int(max_new_tokens), stop_ids)
        self.stats = GenerationStats(prompt_tokens=int(ids.shape[0]))
        return self._stream(token_iter, ids.shape[0], int(max_new_tokens), be.max_context, stop_ids, stops_s, t0)

    def chat(self, messages: Sequence[dict], **kw) -> Iterator[GenerationChunk]:
        """Apply the file's chat template (with the generation prompt) and generate(); same keyword arguments."""
        if self.tokenizer is None:
            raise NoTokenizer("this file has no tokenizer, so no chat template")
        if not isinstance(messages, (list, tuple)):
            raise ChatError(f"messages must be a list of dicts, got {type(messages).__name__}")
        try:
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        except ChatTemplateError as e:
            raise ChatError(str(e)) from None
        return self.generate(text, **kw)

    # -- streaming ------------------------------------------------------------------------------------
    def _stream(self, token_iter: Iterator[int], n_prompt: int, max_new: int, max_context: int, stop_ids: set[int],
                stops_s: list[str], t0: float) -> Iterator[GenerationChunk]:
        st = self.stats
        dec = self.tokenizer.stream_decoder() if self.tokenizer is not None else None
        acc = ""          # all text decoded so far
        emitted = 0       # chars of acc already yielded
        finish = None
        t_first = t_last = None
        try:
            for tok in token_iter:
                t_last = time.perf_counter()
                if t_first is None:
                    t_first = t_last
                    st.ttft_s = t_first - t0
                st.completion_tokens += 1
                if tok in stop_ids:
                    finish = "stop"
                    text = acc[emitted:] if dec is None else acc[emitted:] + dec.flush()
                    yield GenerationChunk(_cut_stop(text, stops_s)[0], [tok], finish)
                    return
                if dec is not None:
                    acc += dec.push([tok])
                end_now = (st.completion_tokens >= max_new
                           or n_prompt + st.completion_tokens >= max_context)
                if stops_s:
                    j = _find_stop(acc, emitted, stops_s)
                    if j >= 0:
                        finish = "stop"
                        yield GenerationChunk(acc[emitted:j], [tok], finish)
                        return
                if end_now:
                    finish = "length"
                    rest = acc[emitted:] + (dec.flush() if dec is not None else "")
                    cut, hit = _cut_stop(rest, stops_s)
                    yield GenerationChunk(cut, [tok], "stop" if hit else finish)
                    finish = "stop" if hit else finish
                    return
                safe = len(acc) - _held_back(acc, emitted, stops_s)
                text = acc[emitted:safe]
                emitted = safe
                yield GenerationChunk(text, [tok], None)
        finally:
            if hasattr(token_iter, "close"):
                token_iter.close()
            now = time.perf_counter()
            st.total_s = now - t0
            if t_first is not None:
                st.decode_s = t_last - t_first
            st.finish_reason = finish


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
