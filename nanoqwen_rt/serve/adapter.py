"""The few things the CLI and the server need from an Engine, in one place, with errors turned into the
server's 4xx `ApiError`s (server side) or into one-line messages (CLI side, via `load_engine`'s named errors).
"""
from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass

from .schemas import ApiError

FILE_SUFFIX = ".nanoqwen"


class LoadError(Exception):
    """The model file could not be opened as an engine (message: one line, names the file and the reason)."""


def _format_error_types() -> tuple[type, ...]:
    try:
        from nanoqwen_format.errors import NanoqwenFormatError
        return (NanoqwenFormatError,)
    except ImportError:               # the format package is always present in a real install
        return ()


def require_file(path: str) -> None:
    """LoadError unless `path` is an existing regular file."""
    if not os.path.exists(path):
        raise LoadError(f"{path}: no such file")
    if os.path.isdir(path):
        raise LoadError(f"{path}: is a directory, expected a {FILE_SUFFIX} file "
                        f"(convert a checkpoint folder with nanoqwen-convert first)")
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise LoadError(f"{path}: cannot stat: {e.strerror}") from None
    if not stat.S_ISREG(mode):   # a FIFO would block open() until some writer came; a device is no model file
        raise LoadError(f"{path}: not a regular file, expected a {FILE_SUFFIX} file")


def open_model_file(path: str, verify_checksums: bool = True):
    """nanoqwen_format.open_file with every expected failure as a one-line LoadError."""
    from nanoqwen_format import open_file
    require_file(path)
    try:
        return open_file(path, verify_checksums=verify_checksums)
    except _format_error_types() as e:
        raise LoadError(f"{path}: not a valid {FILE_SUFFIX} file: {type(e).__name__}: {_one_line(e)}") from None
    except OSError as e:
        raise LoadError(f"{path}: cannot read: {type(e).__name__}: {_one_line(e)}") from None


def load_engine(path: str, device: str = "auto", max_context: int | None = None, *, max_batch: int | None = None,
                kv_pages: int | None = None):
    """Open `path` as an Engine (max_batch / kv_pages: its batched API's settings, None = the defaults); every
    expected failure becomes a LoadError with a one-line message."""
    from ..backends.base import BackendError
    from ..engine import Engine, EngineError

    require_file(path)
    batch = {k: v for k, v in (("max_batch", max_batch), ("kv_pages", kv_pages)) if v is not None}
    try:
        return Engine(path, device=device, max_context=max_context, **batch)
    except _format_error_types() as e:
        raise LoadError(f"{path}: not a valid {FILE_SUFFIX} file: {type(e).__name__}: {_one_line(e)}") from None
    except (EngineError, BackendError) as e:
        raise LoadError(f"{path}: {type(e).__name__}: {_one_line(e)}") from None
    except (OSError, ValueError) as e:
        raise LoadError(f"{path}: cannot load: {type(e).__name__}: {_one_line(e)}") from None


def _one_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return " ".join(text.split())


def default_model_name(path: str) -> str:
    """The model id the server answers to by default: the file name without its .nanoqwen suffix."""
    name = os.path.basename(os.fspath(path))
    return name[: -len(FILE_SUFFIX)] if name.endswith(FILE_SUFFIX) else name


class EngineAdapter:
    """Engine calls made by the server. Tokenization runs on a threadpool thread (HF `tokenizers` is thread-safe
    and does not touch the engine's sequence state), after a length cut (`max_prompt_chars`): `tokenizers` holds
    the GIL while it encodes, so an unbounded prompt would stall the event loop however it is scheduled.
    `generate` runs only on the worker thread: it submits to the engine's batch (Engine.submit) and returns an
    iterator that yields each chunk, or None after a step that produced none for this request (its prompt is
    still being computed, or it waits for KV pages), so the worker can go on to the other requests."""

    def __init__(self, engine):
        if getattr(engine, "tokenizer", None) is None:
            raise LoadError("this file carries no tokenizer: the server needs one to accept text prompts")
        self.engine = engine
        self.device: str = getattr(engine, "device", "unknown")
        self.context_length: int = int(engine.max_context)
        self.has_chat_template: bool = getattr(engine.tokenizer, "chat_template", None) is not None
        self.vocab_rows: int = int(engine.config.vocab_rows)
        #: longest text prompt (characters) that can fit the context: no token covers more characters than the
        #: longest vocabulary entry, so a longer prompt is refused without tokenizing it
        self.max_prompt_chars: int = self.context_length * int(engine.tokenizer.max_token_chars)
        #: sequences the engine's batch runs at once (the worker runs as many requests)
        self.max_batch: int = int(engine.max_batch)
        #: called after each engine step the server makes: (sequences in the step, seconds)
        self.on_step = None

    def batch_stats(self):
        """The engine's BatchStats (None before its first request)."""
        return self.engine.batch_stats()

    def check_pages(self, n_prompt: int, n_new: int, param: str) -> None:
        """A 400 before queueing for a request that needs more KV pages than the engine's whole pool (it could
        never run: Engine.submit would raise KvPoolTooSmall)."""
        from ..kv_pool import pages_for
        st = self.engine.batch_stats()
        if st is None:
            return
        need = pages_for(min(n_prompt + n_new - 1, self.context_length))
        if need > st.kv_pages:
            raise ApiError(400, f"this request needs {need} KV pages (prompt {n_prompt} + up to {n_new} new tokens);"
                                f" the server's pool has {st.kv_pages} (--kv-pages): ask for fewer tokens",
                           param="max_tokens", code="invalid_value")

    def check_prompt_chars(self, text: str, param: str = "prompt") -> None:
        """A 400 (context_length_exceeded) for text longer than any prompt that fits the context."""
        if len(text) > self.max_prompt_chars:
            raise ApiError(400, f"'{param}' has {len(text)} characters; no prompt over {self.max_prompt_chars} "
                                f"characters fits this model's context of {self.context_length} tokens",
                           param=param, code="context_length_exceeded")

    def prompt_ids(self, prompt: str | list[int], param: str = "prompt") -> list[int]:
        """The prompt as token ids, encoded once (the generation takes these ids, not the text again), as
        Engine.encode would encode it; token-id prompts are range-checked here (a 400 names the bad id)."""
        from ..backends.base import InvalidTokenIds, check_token_ids
        from ..tokenizer import TokenizerError
        if isinstance(prompt, str):
            self.check_prompt_chars(prompt, param)
            try:
                return self.engine.tokenizer.encode(prompt, add_bos=True)
            except TokenizerError as e:
                raise ApiError(400, f"'{param}': {_one_line(e)}", param=param, code="invalid_value") from None
        if prompt:       # an empty prompt is the caller's 400 ("encodes to zero tokens")
            try:
                check_token_ids(prompt, self.vocab_rows)
            except InvalidTokenIds as e:
                raise ApiError(400, str(e), param="prompt", code="invalid_value") from None
        return list(prompt)

    def render_chat(self, messages: list[dict], tools: list[dict] | None = None,
                    tool_choice: str | dict | None = None) -> str:
        """The chat template applied with the generation prompt and the tools, as Engine.render_chat does (the
        rule for templates without a tools section lives there); a template failure is a 400, and so are tools
        with tool_choice "auto" on such a template (code tools_unsupported)."""
        from ..engine import ChatError, InvalidArgument, ToolsUnsupported
        try:
            return self.engine.render_chat(messages, tools, tool_choice)
        except ToolsUnsupported as e:
            raise ApiError(400, _one_line(e), param="tool_choice", code="tools_unsupported") from None
        except ChatError as e:
            raise ApiError(400, f"cannot apply the model's chat template: {_one_line(e)}", param="messages",
                           code="chat_template_error") from None
        except InvalidArgument as e:
            raise ApiError(400, _one_line(e), param="tools", code="invalid_value") from None

    def tool_choice_grammar(self, tools: list[dict] | None, tool_choice: str | dict | None) -> str | None:
        """Engine.tool_choice_grammar: the grammar that forces one tool call, None when nothing is forced."""
        return self.engine.tool_choice_grammar(tools, tool_choice)

    def fim_ids(self, prefix: str, suffix: str) -> list[int]:
        """The fill-in-the-middle prompt's ids; a 400 when the model's tokenizer has no FIM tokens."""
        from ..engine import FimUnsupported, InvalidArgument
        self.check_prompt_chars(prefix + suffix, "prompt")
        try:
            return self.engine.fim_ids(prefix, suffix)
        except FimUnsupported as e:
            raise ApiError(400, _one_line(e), param="suffix", code="fim_unsupported") from None
        except InvalidArgument as e:
            raise ApiError(400, _one_line(e), param="prompt", code="invalid_value") from None

    def fim_stop_ids(self) -> list[int]:
        from ..fim import fim_stop_ids
        return list(fim_stop_ids(self.engine.tokenizer))

    def constraint_factory(self, kind: str, spec, param: str):
        """A callable making one fresh grammar constraint per generation: kind "json" (spec: a schema or None)
        or "lark" (spec: the grammar). The first one is built now, so a schema the grammar engine refuses is a
        400 before the request is queued (and the grammar engine's tokenizer is built off the worker)."""
        from ..engine import InvalidGrammar
        make = (lambda: self.engine.json_constraint(spec)) if kind == "json" else \
            (lambda: self.engine.lark_constraint(spec))
        try:
            first = [make()]
        except InvalidGrammar as e:
            raise ApiError(400, _one_line(e), param=param, code="invalid_value") from None

        def factory():
            return first.pop() if first else make()
        return factory

    def token_text(self, token_id: int) -> str:
        """One token as text for logprobs (an incomplete UTF-8 sequence shows as U+FFFD)."""
        return self.token_bytes(token_id).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        return self.engine.tokenizer.token_bytes(token_id)

    def generate(self, prompt: str | list[int], n: int = 1, make_constraint=None, **kwargs):
        """Worker thread only. `prompt`: the token ids from prompt_ids (or text, for other callers). Returns an
        iterator of chunks and Nones (see the class docstring). n > 1 or a constraint: `ChoiceChunk`s of n
        generations (seed s → choice i uses s + i)."""
        if n == 1 and make_constraint is None:
            return self._stepped(self.engine.submit(prompt, **kwargs))
        return self._choices(prompt, n, make_constraint, kwargs)

    def _stepped(self, handle, index: int | None = None):
        """The handle's chunks (as ChoiceChunks of `index` when given), stepping the engine when none is ready;
        None after a step that gave this handle nothing. Closing this generator closes the handle (its sequence
        leaves the batch and frees its pages)."""
        try:
            while True:
                ready = handle.poll()
                if not ready and not handle.done:
                    t0 = time.perf_counter()
                    self.engine.step()
                    if self.on_step is not None:
                        st = self.engine.batch_stats()
                        self.on_step(st.last_batch if st is not None else 0, time.perf_counter() - t0)
                    ready = handle.poll()
                for c in ready:
                    yield c if index is None else ChoiceChunk(index, c.text, c.token_ids, c.finish_reason,
                                                              getattr(c, "logprobs", None))
                if handle.done:
                    return
                if not ready:
                    yield None
        finally:
            handle.close()

    def _choices(self, prompt, n: int, make_constraint, kwargs: dict):
        """n choices on the batch: the first is submitted alone, the others once its prompt is computed, so they
        find the prompt's full pages in the prefix cache instead of computing them again."""
        seed = kwargs.get("seed")
        its = []
        try:
            for i in range(n):
                kw = dict(kwargs)
                if seed is not None:
                    kw["seed"] = (seed + i) % 2**64
                if make_constraint is not None:
                    kw["constraint"] = make_constraint()
                its.append(self._stepped(self.engine.submit(prompt, **kw), i))
                if i == 0 and n > 1:
                    for c in its[0]:            # the first choice until its first token: the prompt is cached
                        yield c
                        if c is not None:
                            break
            live = list(its)
            while live:                         # then every choice one chunk (or None) per round
                for it in list(live):
                    try:
                        yield next(it)
                    except StopIteration:
                        live.remove(it)
        finally:
            for it in its:
                it.close()


@dataclass
class ChoiceChunk:
    """A GenerationChunk of choice `index` (n > 1)."""
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    logprobs: list | None = None
