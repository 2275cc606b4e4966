"""Text in and out: the tokenizer, chat template and stop ids embedded in a .nanoqwen file.

* encode/decode through `tokenizers.Tokenizer.from_str(<TOKENIZER_JSON blob>)`;
* `StreamDecoder`: incremental detokenization that never emits half a UTF-8 character;
* `apply_chat_template`: jinja2 rendering exactly as Hugging Face transformers does it
  (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, its `tojson`, `raise_exception`,
  `strftime_now`; bos/eos/pad/unk tokens from the TOKENIZER_CONFIG blob as template variables);
* `stop_token_ids`: eos ids from the GENERATION_CONFIG blob plus the header's eos_token_id.
"""
from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any, Iterable, Sequence

__all__ = ["Tokenizer", "StreamDecoder", "TokenizerError", "ChatTemplateError"]


class TokenizerError(ValueError):
    """The file has no usable tokenizer, or input could not be tokenized."""


class ChatTemplateError(ValueError):
    """No chat template in the file, bad messages, or the template raised (raise_exception / jinja error)."""


# A conversation and a tool that probe whether a chat template has a tools section (Tokenizer.renders_tools): the
# name is one no template writes by itself.
_TOOLS_PROBE_MESSAGES = [{"role": "user", "content": "hello"}]
_TOOLS_PROBE_NAME = "nanoqwen_tools_probe"
_TOOLS_PROBE = [{"type": "function", "function": {"name": _TOOLS_PROBE_NAME, "description": "probe",
                                                  "parameters": {"type": "object", "properties": {}}}}]

_SPM_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")       # a SentencePiece byte-fallback piece
# the named special tokens transformers passes to chat templates (PreTrainedTokenizerBase.SPECIAL_TOKENS_ATTRIBUTES)
_SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _token_text(v: Any) -> str | None:
    """tokenizer_config.json stores special tokens as "text" or {"content": "text", ...} (AddedToken)."""
    if isinstance(v, str):
        return v
    if isinstance(v, dict) and isinstance(v.get("content"), str):
        return v["content"]
    return None


def _compile_template(source: str):
    """The jinja environment transformers' `_cached_compile_jinja_template` builds (minus its generation-mask
    extension, which only matters for assistant masks)."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # transformers overrides jinja's tojson (which HTML-escapes) with plain json.dumps
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


def _post_processor_bos(post_processor) -> int | None:
    """The id of the special token a `tokenizers` post-processor puts before a single sequence (a
    TemplateProcessing whose `single` template starts with one special token, alone or in a Sequence of
    processors), else None."""
    if post_processor is None:
        return None
    try:
        state = json.loads(post_processor.__getstate__())
    except (TypeError, ValueError):
        return None
    procs = state.get("processors", []) if state.get("type") == "Sequence" else [state]
    for pp in procs:
        if not isinstance(pp, dict) or pp.get("type") != "TemplateProcessing":
            continue
        single = pp.get("single") or []
        first = single[0].get("SpecialToken") if single and isinstance(single[0], dict) else None
        if isinstance(first, dict):
            ids = (pp.get("special_tokens") or {}).get(first.get("id"), {}).get("ids") or []
            if len(ids) == 1 and isinstance(ids[0], int):
                return ids[0]
    return None


class Tokenizer:
    """Tokenizer of one model. Build with `Tokenizer.from_file(nanoqwen_file)` or `Tokenizer(json_str, ...)`."""

    def __init__(self, tokenizer_json: str, *, chat_template: str | None = None,
                 tokenizer_config: dict | None = None, generation_config: dict | None = None,
                 header_eos_token_id: int = -1):
        from tokenizers import Tokenizer as _HFTok
        #: the tokenizer.json text this tokenizer was built from (the grammar engine builds its own from it)
        self.json_text = tokenizer_json
        try:
            self._tok = _HFTok.from_str(tokenizer_json)
        except Exception as e:  # tokenizers raises a bare Exception on bad json
            raise TokenizerError(f"TOKENIZER_JSON blob could not be loaded: {e}") from None
        self.tokenizer_config = dict(tokenizer_config or {})
        self.generation_config = dict(generation_config or {})
        tmpl = chat_template if chat_template is not None else self.tokenizer_config.get("chat_template")
        if isinstance(tmpl, list):  # HF allows a list of named templates; use "default"
            named = {t.get("name"): t.get("template") for t in tmpl if isinstance(t, dict)}
            tmpl = named.get("default")
        self.chat_template: str | None = tmpl if isinstance(tmpl, str) and tmpl else None
        self._compiled = None
        self._renders_tools: bool | None = None
        self.special_tokens: dict[str, str] = {}
        for k in _SPECIAL_TOKEN_KEYS:
            t = _token_text(self.tokenizer_config.get(k))
            if t is not None:
                self.special_tokens[k] = t
        stops: list[int] = []
        eos = self.generation_config.get("eos_token_id")
        for v in (eos if isinstance(eos, list) else [eos]):
            if isinstance(v, int) and v >= 0 and v not in stops:
                stops.append(v)
        if header_eos_token_id >= 0 and header_eos_token_id not in stops:
            stops.append(header_eos_token_id)
        if not stops and "eos_token" in self.special_tokens:
            t = self._tok.token_to_id(self.special_tokens["eos_token"])
            if t is not None:
                stops.append(int(t))
        #: ids that end generation by default (generation_config eos ids, then the header's eos id)
        self.stop_token_ids: tuple[int, ...] = tuple(stops)
        #: the BOS id a plain text prompt starts with, else None: tokenizer_config's bos_token when it says
        #: add_bos_token (Llama-2-family configs; Qwen's says false or nothing); without that key, the special
        #: token that tokenizer.json's post-processor puts first (Llama-3-style TemplateProcessing), which is what
        #: transformers adds to a text prompt by default
        self.bos_token_id: int | None = None
        add_bos = self.tokenizer_config.get("add_bos_token")
        if add_bos is True and "bos_token" in self.special_tokens:
            t = self._tok.token_to_id(self.special_tokens["bos_token"])
            self.bos_token_id = int(t) if t is not None else None
        elif add_bos is None:
            self.bos_token_id = _post_processor_bos(self._tok.post_processor)
        self._max_token_chars: int | None = None
        self._byte_decoder: dict[str, int] | None = None
        self._sentencepiece = False          # a SentencePiece tokenizer (set with _byte_decoder)
        self._added: set[int] = set()

    @classmethod
    def from_file(cls, f) -> "Tokenizer":
        """f: an open nanoqwen_format.NanoqwenFile."""
        from nanoqwen_format import BlobKind
        tj = f.blob_text(BlobKind.TOKENIZER_JSON)
        if tj is None:
            raise TokenizerError("the file has no TOKENIZER_JSON blob: text input/output is unavailable "
                                 "(token ids still work)")
        tcfg = f.blob_json(BlobKind.TOKENIZER_CONFIG)
        gcfg = f.blob_json(BlobKind.GENERATION_CONFIG)
        tmpl = f.blob_text(BlobKind.CHAT_TEMPLATE)
        return cls(tj, chat_template=tmpl, tokenizer_config=tcfg if isinstance(tcfg, dict) else None,
                   generation_config=gcfg if isinstance(gcfg, dict) else None,
                   header_eos_token_id=int(f.config.eos_token_id))

    # -- ids <-> text ----------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        """Text → ids. No special tokens are added, except the BOS id first when `add_bos` and the tokenizer
        config asks for one (`bos_token_id`) and the text does not already start with it (a chat template
        that writes bos_token itself). Text that is not valid Unicode (a lone surrogate) is a TokenizerError."""
        if not isinstance(text, str):
            raise TokenizerError(f"encode() needs str, got {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise TokenizerError(f"the text is not valid Unicode: {e.reason} at character {e.start} "
                                 f"({text[e.start]!r})") from None
        ids = list(self._tok.encode(text, add_special_tokens=False).ids)
        if add_bos and self.bos_token_id is not None and (not ids or ids[0] != self.bos_token_id):
            ids.insert(0, self.bos_token_id)
        return ids

    @property
    def max_token_chars(self) -> int:
        """Characters of the longest vocabulary entry (incl. added tokens): no token covers more text than this
        unless a normalizer deletes characters, so `context × max_token_chars` characters bound a prompt that
        fits (the server cuts longer prompts before tokenizing them). Computed once."""
        if self._max_token_chars is None:
            self._max_token_chars = max((len(k) for k in self._tok.get_vocab(with_added_tokens=True)), default=1)
        return self._max_token_chars

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (OpenAI's logprobs `bytes`): a byte-level BPE piece mapped back through
        GPT-2's byte↔character table, an added token's text, a SentencePiece piece with ▁ as a space and
        `<0xHH>` as its byte, or (other tokenizers) its decoded text."""
        if self._byte_decoder is None:
            dec = json.loads(self.json_text).get("decoder") or {}
            self._byte_decoder = _gpt2_byte_decoder() if dec.get("type") == "ByteLevel" else {}
            self._sentencepiece = any(d.get("type") == "ByteFallback" for d in dec.get("decoders") or [])
            self._added = {int(k) for k in self._tok.get_added_tokens_decoder()}
        i = int(token_id)
        piece = self._tok.id_to_token(i)
        if piece is None:
            return b""
        if self._sentencepiece and i not in self._added:
            m = _SPM_BYTE.fullmatch(piece)
            return bytes([int(m.group(1), 16)]) if m else piece.replace("\u2581", " ").encode("utf-8")
        if i in self._added or not self._byte_decoder:
            return self.decode([i], skip_special_tokens=False).encode("utf-8") if i not in self._added \
                else piece.encode("utf-8")
        try:
            return bytes(self._byte_decoder[c] for c in piece)
        except KeyError:
            return piece.encode("utf-8")

    def stream_decoder(self, skip_special_tokens: bool = True) -> "StreamDecoder":
        return StreamDecoder(self, skip_special_tokens)

    # -- chat ------------------------------------------------------------------------------------------
    def apply_chat_template(self, messages: Iterable[dict], add_generation_prompt: bool = True,
                            **template_kwargs) -> str:
        """Render messages to the prompt text the way transformers' `apply_chat_template(tokenize=False)` does."""
        import jinja2
        if self.chat_template is None:
            raise ChatTemplateError("the file has no chat template (CHAT_TEMPLATE blob or tokenizer_config "
                                    "chat_template): use a plain prompt instead")
        msgs = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict):
                raise ChatTemplateError(f"message {i} must be a dict with 'role' and 'content', got "
                                        f"{type(m).__name__}")
            if "role" not in m:
                raise ChatTemplateError(f"message {i} has no 'role'")
            if not isinstance(m["role"], str):
                raise ChatTemplateError(f"message {i}: 'role' must be a str, got {type(m['role']).__name__}")
            # transformers drops keys whose value is None before rendering
            msgs.append({k: v for k, v in m.items() if v is not None})
        if not msgs:
            raise ChatTemplateError("cannot apply the chat template to an empty conversation")
        if self._compiled is None:
            try:
                self._compiled = _compile_template(self.chat_template)
            except jinja2.exceptions.TemplateError as e:
                raise ChatTemplateError(f"chat template does not compile: {e}") from None
        kw = {**self.special_tokens, **template_kwargs}
        try:
            return self._compiled.render(messages=msgs, tools=kw.pop("tools", None),
                                         documents=kw.pop("documents", None),
                                         add_generation_prompt=add_generation_prompt, **kw)
        except jinja2.exceptions.TemplateError as e:
            raise ChatTemplateError(f"chat template raised: {e}") from None
        except (TypeError, ValueError, AttributeError, KeyError, IndexError) as e:
            # what the template's own expressions raise on values it cannot take (a content of 5, a list of parts
            # where it concatenates strings): the messages do not fit this template
            raise ChatTemplateError(f"chat template cannot render these messages: {type(e).__name__}: {e}") from None

    @property
    def renders_tools(self) -> bool:
        """Whether the chat template has a tools section: a tool passed as `tools` appears in the rendered prompt
        (Qwen2.5's template lists them in `<tools>`; a template without such a section, like the embedded demo
        model's, ignores the variable). Found by rendering a probe once; a template that raises when given tools
        has none. ChatTemplateError when there is no template or it cannot render a plain conversation."""
        if self._renders_tools is None:
            self.apply_chat_template(_TOOLS_PROBE_MESSAGES)
            try:
                rendered = self.apply_chat_template(_TOOLS_PROBE_MESSAGES, tools=_TOOLS_PROBE)
            except ChatTemplateError:
                rendered = ""
            self._renders_tools = _TOOLS_PROBE_NAME in rendered
        return self._renders_tools


def _gpt2_byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet (the `bytes_to_unicode` table byte-level BPE vocabularies are written in),
    character → byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class StreamDecoder:
    """Incremental detokenization. `push(ids) -> str` returns only newly completed text; `flush() -> str` the rest.

    Method (as in TGI/vLLM): decode ids[prefix:] and ids[prefix:read]; the difference is new text, unless it
    ends in U+FFFD (an incomplete UTF-8 sequence from byte-level tokens) — then it is held back until later
    ids complete it. Decoding from a recent `prefix` (not from 0) keeps each push O(window), and decoding with
    one token of left context keeps SentencePiece-style leading-space handling right.
    """

    def __init__(self, tok: Tokenizer, skip_special_tokens: bool = True):
        self.tok = tok
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.prefix = 0
        self.read = 0

    def push(self, ids: Iterable[int]) -> str:
        self.ids.extend(int(i) for i in ids)
        prev = self.tok.decode(self.ids[self.prefix:self.read], self.skip)
        new = self.tok.decode(self.ids[self.prefix:], self.skip)
        if len(new) > len(prev) and not new.endswith("\ufffd"):
            delta = new[len(prev):]
            self.prefix, self.read = self.read, len(self.ids)
            return delta
        return ""

    def flush(self) -> str:
        """Everything not yet returned (an incomplete trailing character comes out as U+FFFD)."""
        prev = self.tok.decode(self.ids[self.prefix:self.read], self.skip)
        new = self.tok.decode(self.ids[self.prefix:], self.skip)
        self.prefix = self.read = len(self.ids)
        return new[len(prev):] if len(new) > len(prev) else ""
