"""Fill-in-the-middle (FIM) prompts in Qwen2.5-Coder's documented format, built as token ids.

File level:   <|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>
Repo level:   <|repo_name|>{repo}\\n<|file_sep|>{path}\\n{content}\\n ... <|file_sep|>{path}\\n<fim file-level prompt>

The model writes the middle and ends it with one of Qwen2.5-Coder's FIM end tokens (its reference example stops on
`<|endoftext|>`, `<|im_end|>` and the six FIM / repo markers; `FIM_STOP_TOKENS`).

The markers are added (not special) tokens, so text that merely contains "<|fim_suffix|>" would encode to the
marker itself. The prompt is therefore assembled from ids: the markers by id, each piece of user text encoded on
its own. For text without marker strings the ids equal those of the joined prompt text; with them, the user's text
cannot move the FIM structure (its marker-like strings still encode to the marker ids, as any Qwen tokenizer does).
"""
from __future__ import annotations

from typing import Sequence

from .tokenizer import Tokenizer, TokenizerError

__all__ = ["FIM_PREFIX", "FIM_SUFFIX", "FIM_MIDDLE", "FIM_PAD", "REPO_NAME", "FILE_SEP", "FIM_STOP_TOKENS",
           "NoFimTokens", "fim_prompt_ids", "fim_stop_ids"]

FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE, FIM_PAD = "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>"
REPO_NAME, FILE_SEP = "<|repo_name|>", "<|file_sep|>"
#: the tokens that end a FIM middle (Qwen2.5-Coder's FIM example passes exactly these as eos_token_id)
FIM_STOP_TOKENS = ("<|endoftext|>", "<|im_end|>", FIM_PREFIX, FIM_MIDDLE, FIM_SUFFIX, FIM_PAD, REPO_NAME, FILE_SEP)


class NoFimTokens(TokenizerError):
    """The tokenizer lacks the FIM (or, for the repository form, the repo / file) marker tokens."""


def _marker_ids(tok: Tokenizer, names: Sequence[str], what: str) -> list[int]:
    ids = [tok.token_to_id(n) for n in names]
    missing = [n for n, i in zip(names, ids) if i is None]
    if missing:
        raise NoFimTokens(f"this model's tokenizer has no {what} tokens ({', '.join(missing)} missing): "
                          f"it was not trained for fill-in-the-middle")
    return [int(i) for i in ids]


def fim_prompt_ids(tok: Tokenizer, prefix: str, suffix: str, *, repo_name: str | None = None,
                   files: Sequence[tuple[str, str]] = (), path: str | None = None) -> list[int]:
    """Token ids of the FIM prompt for the text between `prefix` and `suffix`.

    Repository form when `repo_name` is given: `files` are the other files as (path, content) pairs, in the order
    the model should read them, and `path` is the path of the file being edited (the one prefix/suffix belong
    to). A newline ends each file's content unless it already ends with one. Raises NoFimTokens when the
    tokenizer lacks a marker, TokenizerError for text that is not valid Unicode.
    """
    pre, suf, mid = _marker_ids(tok, (FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE), "fill-in-the-middle")
    ids: list[int] = []
    if repo_name is not None:
        repo, sep = _marker_ids(tok, (REPO_NAME, FILE_SEP), "repository-level")
        if path is None:
            raise ValueError("the repository form needs the path of the file being edited")
        ids += [repo] + tok.encode(repo_name + "\n")
        for fpath, content in files:
            ids += [sep] + tok.encode(fpath + "\n" + content + ("" if content.endswith("\n") else "\n"))
        ids += [sep] + tok.encode(path + "\n")
    elif files or path is not None:
        raise ValueError("files and path belong to the repository form: give repo_name too")
    return ids + [pre] + tok.encode(prefix) + [suf] + tok.encode(suffix) + [mid]


def fim_stop_ids(tok: Tokenizer) -> tuple[int, ...]:
    """The file's default stop ids plus every FIM end token its tokenizer has."""
    out = list(tok.stop_token_ids)
    for name in FIM_STOP_TOKENS:
        i = tok.token_to_id(name)
        if i is not None and int(i) not in out:
            out.append(int(i))
    return tuple(out)
