"""Grammar-constrained sampling: JSON (any object, or one JSON Schema) and Lark grammars, via llguidance.

Why llguidance (compared on the package index and measured here; docs/structured-output.md has the numbers):
* MIT licence, one self-contained Rust wheel (~3 MB, abi3 manylinux x86-64 and aarch64 CPU wheels) with no Python
  dependencies; xgrammar (Apache-2.0) requires torch, transformers and triton, which the runtime never imports;
  outlines-core (Apache-2.0) compiles regular expressions only, so `json_object` (arbitrary nesting) has no exact
  form there, and it builds a whole-vocabulary index per schema up front;
* JSON Schema and Lark grammars compiled lazily (no per-schema index build: 1-13 ms per schema), a token mask in
  a median 0.04 ms for Qwen2.5's 151,936-row vocabulary on a 2-core CPU (bench/grammar_bench.py);
* maintained by Microsoft (guidance), and the grammar engine behind llama.cpp's and vLLM's llguidance backends.

The mask it writes is the int32 bitmask nanoqwen_rt.logits applies (`apply_token_bitmask`), the step the backends
share. `GrammarCompiler` holds the llguidance tokenizer (built once per Engine: 4-5 s for Qwen2.5's vocabulary on
2 quiet CPU cores) and makes one `GrammarConstraint` per generation.
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np

__all__ = ["GrammarError", "GrammarCompiler", "GrammarConstraint"]


#: How constrained JSON is laid out: json.dumps' separators and no other whitespace. llguidance's default allows
#: any run of whitespace between tokens, and a weak model can then fill its whole budget with newlines before the
#: JSON ends; a schema may still choose otherwise through its "x-guidance" options.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(ValueError):
    """A schema or grammar that llguidance refuses (the message is its reason), or llguidance missing."""


class GrammarConstraint:
    """One generation's grammar state (nanoqwen_rt.logits.TokenConstraint)."""

    def __init__(self, matcher):
        self._m = matcher

    def fill_bitmask(self, out: np.ndarray) -> None:
        self._m.unsafe_compute_mask_ptr(out.ctypes.data, out.nbytes)

    def accept(self, token_id: int) -> None:
        if not self._m.consume_token(int(token_id)):
            raise GrammarError(f"the grammar refused token {token_id}: {self._m.get_error()}")

    @property
    def complete(self) -> bool:
        return self._m.is_stopped()


class GrammarCompiler:
    """Compiles grammars against one model's tokenizer. `tokenizer_json`: the file's tokenizer.json text;
    `vocab_rows`: the logits' length (rows past the tokenizer's vocabulary are never allowed); `end_ids`: the ids
    that may end the output once the grammar is complete (the file's stop ids)."""

    def __init__(self, tokenizer_json: str, vocab_rows: int, end_ids: list[int]):
        try:
            import llguidance
        except ImportError:
            raise GrammarError("structured output needs the llguidance package (pip install llguidance)") from None
        self._ll = llguidance
        if not end_ids:
            raise GrammarError("the model has no end-of-sequence id, so a grammar could never end its output")
        self._tok = llguidance.LLTokenizer(tokenizer_json, n_vocab=int(vocab_rows), eos_token=list(end_ids))

    def _constraint(self, grammar: str) -> GrammarConstraint:
        # one compile: a matcher built from a bad grammar is in its error state with the message validate_grammar
        # gives (which would compile it a second time: 0.2-0.5 ms per request)
        m = self._ll.LLMatcher(self._tok, grammar, log_level=0)
        if m.is_error():
            raise GrammarError(m.get_error())
        return GrammarConstraint(m)

    def json(self, schema: dict[str, Any] | None = None) -> GrammarConstraint:
        """Any JSON object (schema None: OpenAI's json_object), or a value valid against `schema`."""
        try:
            g = self._ll.LLMatcher.grammar_from_json_schema(schema if schema is not None else {"type": "object"},
                                                            defaults=JSON_LAYOUT)
        except (ValueError, TypeError) as e:
            raise GrammarError(f"not a usable JSON schema: {e}") from None
        return self._constraint(g)

    def lark(self, grammar: str) -> GrammarConstraint:
        """A Lark grammar (llguidance's dialect: `%json {schema}` embeds a JSON Schema)."""
        return self._constraint(self._ll.LLMatcher.grammar_from_lark(grammar))


def schema_text(schema: dict) -> str:
    """A schema as compact JSON, for embedding in a Lark grammar."""
    return json.dumps(schema, separators=(",", ":"))
