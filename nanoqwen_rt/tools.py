"""Tool calls in Qwen2.5's format: the model answers `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`
(the chat template's tools section asks for exactly this). Parsed here into OpenAI `tool_calls`, whole answers
(`parse_tool_calls`) and streamed ones (`ToolCallStream`); `check_tools` validates OpenAI `tools` / `tool_choice`
(for the Engine and the server alike) and `tool_call_grammar` forces one call.

A block whose JSON does not parse, or lacks a string "name" / an object "arguments", is not a tool call: it stays in
the message content as the model wrote it, and the parse reports why (`error`), so the caller can tell the client
instead of failing the request.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from .grammar import JSON_LAYOUT

__all__ = ["TOOL_CALL_OPEN", "TOOL_CALL_CLOSE", "ParsedAnswer", "parse_tool_calls", "ToolCallStream",
           "InvalidTools", "check_tools", "forced_tool_name", "tool_call_grammar"]

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"


@dataclass
class ParsedAnswer:
    content: str                                     # text outside the tool calls (malformed blocks stay here)
    tool_calls: list[dict] = field(default_factory=list)   # OpenAI shape: {"id", "type", "function": {...}}
    errors: list[str] = field(default_factory=list)  # one line per block that was not a valid tool call


def _call(block: str) -> tuple[dict | None, str | None]:
    """One block's JSON → (OpenAI tool call, None) or (None, why not)."""
    try:
        obj = json.loads(block)
    except ValueError as e:
        return None, f"tool call is not valid JSON ({e})"
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None, "tool call has no string 'name'"
    args = obj.get("arguments", {})
    if isinstance(args, str):           # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None, f"tool call {obj['name']!r}: 'arguments' is a string that is not JSON"
    if not isinstance(args, dict):
        return None, f"tool call {obj['name']!r}: 'arguments' is not an object"
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": obj["name"], "arguments": json.dumps(args, ensure_ascii=False)}}, None


def parse_tool_calls(text: str) -> ParsedAnswer:
    """Split a whole answer into content and tool calls. An unclosed last block is parsed up to the end."""
    content, calls, errors = [], [], []
    pos = 0
    while True:
        i = text.find(TOOL_CALL_OPEN, pos)
        if i < 0:
            content.append(text[pos:])
            break
        content.append(text[pos:i])
        j = text.find(TOOL_CALL_CLOSE, i)
        end = len(text) if j < 0 else j + len(TOOL_CALL_CLOSE)
        call, err = _call(text[i + len(TOOL_CALL_OPEN): j if j >= 0 else len(text)])
        if call is not None:
            calls.append(call)
        else:
            errors.append(err)
            content.append(text[i:end])
        pos = end
    return ParsedAnswer("".join(content).strip() if calls else "".join(content), calls, errors)


class ToolCallStream:
    """Streaming form: `feed(text)` and `finish()` return events, in order: ("content", str) for text to show,
    ("tool_call", dict) for each complete call, ("error", str) for a malformed block (its text follows as
    content). Text that may be the start of `<tool_call>` is held back until it is known not to be."""

    def __init__(self):
        self._buf = ""
        self._in_call = False
        self.n_calls = 0
        self.errors: list[str] = []

    def feed(self, text: str) -> list[tuple[str, object]]:
        self._buf += text
        out: list[tuple[str, object]] = []
        while True:
            if not self._in_call:
                i = self._buf.find(TOOL_CALL_OPEN)
                if i < 0:
                    keep = _partial_suffix(self._buf, TOOL_CALL_OPEN)
                    safe = self._buf[:len(self._buf) - keep]
                    if safe and (self.n_calls == 0 or safe.strip()):
                        out.append(("content", safe))
                    self._buf = self._buf[len(safe):]
                    return out
                if i > 0 and (self.n_calls == 0 or self._buf[:i].strip()):
                    out.append(("content", self._buf[:i]))
                self._buf = self._buf[i:]
                self._in_call = True
            j = self._buf.find(TOOL_CALL_CLOSE)
            if j < 0:
                return out
            out += self._block(self._buf[:j + len(TOOL_CALL_CLOSE)], self._buf[len(TOOL_CALL_OPEN):j])
            self._buf = self._buf[j + len(TOOL_CALL_CLOSE):]
            self._in_call = False

    def finish(self) -> list[tuple[str, object]]:
        """The end of the answer: an unclosed block is parsed as it is; held-back text comes out."""
        rest, self._buf = self._buf, ""
        if self._in_call:
            self._in_call = False
            return self._block(rest, rest[len(TOOL_CALL_OPEN):])
        return [("content", rest)] if rest and (self.n_calls == 0 or rest.strip()) else []

    def _block(self, raw: str, inner: str) -> list[tuple[str, object]]:
        call, err = _call(inner)
        if call is not None:
            self.n_calls += 1
            return [("tool_call", call)]
        self.errors.append(err)
        return [("error", err), ("content", raw)]


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of marker."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


class InvalidTools(ValueError):
    """`tools` / `tool_choice` malformed: `param` names which, `code` is the OpenAI error code."""

    def __init__(self, param: str, message: str, code: str = "invalid_value"):
        super().__init__(message)
        self.param, self.code = param, code


def check_tools(tools, tool_choice=None) -> tuple[list[dict] | None, str | dict]:
    """OpenAI `tools` / `tool_choice`, checked once for the Engine and the server: returns (tools, choice), tools
    None when there are none (choice then "none"), choice "auto" when tools are given without one. InvalidTools
    names what is wrong."""
    if tools is None or (isinstance(tools, (list, tuple)) and len(tools) == 0):
        if tool_choice not in (None, "none", "auto"):
            raise InvalidTools("tool_choice", "'tool_choice' names a tool but 'tools' is empty")
        return None, "none"
    if not isinstance(tools, (list, tuple)):
        raise InvalidTools("tools", "'tools' must be a list", code="invalid_type")
    names = set()
    for j, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not (isinstance(t, dict) and t.get("type") == "function" and isinstance(fn, dict)
                and isinstance(fn.get("name"), str) and fn["name"]):
            raise InvalidTools("tools", f"tool {j} must be {{'type': 'function', 'function': {{'name': ...}}}}",
                               code="invalid_type")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise InvalidTools("tools", f"tool {j}: 'parameters' must be a JSON schema object", code="invalid_type")
        names.add(fn["name"])
    if tool_choice is None:
        tool_choice = "auto"
    if isinstance(tool_choice, dict):
        fn = tool_choice.get("function")
        if not (tool_choice.get("type") == "function" and isinstance(fn, dict) and fn.get("name") in names):
            raise InvalidTools("tool_choice", "'tool_choice' must name one of the tools in 'tools'")
    elif not isinstance(tool_choice, str) or tool_choice not in ("none", "auto", "required"):
        raise InvalidTools("tool_choice", "'tool_choice' must be 'none', 'auto', 'required' or "
                                          "{'type': 'function', 'function': {'name': ...}}")
    return list(tools), tool_choice


def forced_tool_name(tool_choice: str | dict) -> str | None:
    """The tool a checked `tool_choice` forces: its name for {"type": "function", ...}, None otherwise."""
    return tool_choice["function"]["name"] if isinstance(tool_choice, dict) else None


def tool_call_grammar(tools: list[dict], name: str | None = None,
                      marker_ids: tuple[int, int] | None = None) -> str:
    """A Lark grammar (llguidance dialect) for exactly one tool call of Qwen2.5's form: of the tool `name`, or of
    any of `tools` (tool_choice "required"). The arguments follow each tool's JSON-schema `parameters`.

    The markers: where the tokenizer has `<tool_call>` / `</tool_call>` as added tokens (Qwen2.5's; `marker_ids`
    their ids), llguidance matches them by id (`<[id]>`): the one token the model was trained to write. Where it
    has none (the embedded demo model), the grammar spells them as text, which the ordinary byte-level pieces
    produce. The grammar fixes the structure either way; the markers are kept as text rather than dropped so the
    answer reads the same on both kinds of tokenizer and one parser (`parse_tool_calls`, `ToolCallStream`) serves
    forced and free answers alike, for the price of a few forced tokens."""
    alts = []
    for t in tools:
        fn = t["function"]
        if name is not None and fn["name"] != name:
            continue
        alts.append({"type": "object", "properties": {"name": {"const": fn["name"]},
                                                      "arguments": fn.get("parameters") or {"type": "object"}},
                     "required": ["name", "arguments"], "additionalProperties": False})
    if not alts:
        raise ValueError(f"no tool named {name!r} among the tools" if name is not None else "no tools to call")
    schema = dict(alts[0]) if len(alts) == 1 else {"anyOf": alts}
    schema["x-guidance"] = JSON_LAYOUT
    if marker_ids is not None:
        open_, close = (f"<[{int(i)}]>" for i in marker_ids)
    else:
        open_, close = json.dumps(TOOL_CALL_OPEN), json.dumps(TOOL_CALL_CLOSE)
    return (f'start: {open_} "\\n" call "\\n" {close}\n'
            "call: %json " + json.dumps(schema, separators=(",", ":")) + "\n")
