#!/usr/bin/env python3
"""Train the embedded default model `models/tiny-py/` from scratch, reproducibly, on a GPU or the CPU.

    python models/train_tiny_py.py --device cuda --out models/tiny-py     # ~2 min on one H200 (the shipped model)
    python models/train_tiny_py.py --device cpu --threads 2 --out /tmp/x  # the same on 2 cores: hours

What it does (every step is deterministic given --seed and the running interpreter's standard library):

1. Data: every `.py` file of this interpreter's standard library (`sysconfig.get_paths()["stdlib"]`), excluding any
   path with a `test`, `tests`, `idlelib` or `site-packages` component and files over 200 KB, sorted by relative path.
   A file is held out when the first 8 bytes of sha256(relative path) mod 10000 < 500 (about 5 %). The split
   (files, size limit, rule) is nanoqwen_quant/stdlib_split.py's, shared with the calibration and evaluation texts.
2. Tokenizer: byte-level BPE (Qwen2's pre-tokenizer split regex, see SPLIT_REGEX, + ByteLevel, ByteLevel decoder, no normalizer so
   every string round-trips exactly), vocab 4096 including 9 added tokens: the 3 ChatML ones and Qwen2.5-Coder's
   six fill-in-the-middle / repository markers (same strings as Qwen's; like Qwen's, not "special", so they are
   decoded as text), trained on the training files only.
3. Chat examples: top-level functions (≤ 1500 chars) of a fixed ~1 in 2 subset of training files are wrapped in a
   ChatML exchange ("Write a Python function named X." → its source, then <|im_end|>), so that `chat` answers with
   code and stops. They are mixed into the training stream; the held-out loss is on plain held-out files only.
4. Fill-in-the-middle examples, in Qwen2.5-Coder's PSM order:
   `<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>{middle}<|endoftext|>`. Every training file is cut
   into chunks of whole lines (≤ FIM_CHUNK_CHARS characters), each chunk is split into prefix / middle / suffix
   (fim_split: half at two uniformly random character positions, half after the indentation of a line and at the
   end of that line or of one of the next two; random.Random seeded by --seed), and each part is tokenized on its
   own, as nanoqwen_rt.fim builds the prompt at inference. A fixed FIM_FRACTION of every batch's windows start at a
   FIM example (the rest are windows of the plain stream), so each such window holds one whole example.
5. Model: Qwen2ForCausalLM, hidden 256, 4 layers, 4 query heads / 2 KV heads (head_dim 64), MLP 768, tied
   embeddings, rope_theta 1e4, qkv bias, eager attention; trained in float32 with AdamW + linear warmup + cosine
   decay on random 256-token windows, deterministic: torch.use_deterministic_algorithms, and on CUDA
   CUBLAS_WORKSPACE_CONFIG=:4096:8 (cuBLAS's documented condition for reproducible results).
6. Saved in float16 (FP16 keeps 3 more mantissa bits than bf16 and every weight of this model is far inside fp16
   range, which the script checks), with tokenizer files, a ChatML chat template, generation_config.json,
   heldout_files.txt and training_info.json (Python version, device, threads, library versions, sizes, losses).
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import json
import math
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_THREADS = 2


def _threads_from_argv(argv: list[str]) -> int:
    """--threads as given on the command line (read before torch / tokenizers start their thread pools)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--threads", type=int, default=DEFAULT_THREADS)
    return max(1, pre.parse_known_args(argv)[0].threads)


# Size every thread pool before numpy / torch / tokenizers start theirs (imported as a module, e.g. by the tests:
# the default).
_THREADS = str(_threads_from_argv(sys.argv[1:]) if __name__ == "__main__" else DEFAULT_THREADS)
os.environ.setdefault("OMP_NUM_THREADS", _THREADS)
os.environ.setdefault("MKL_NUM_THREADS", _THREADS)
os.environ.setdefault("RAYON_NUM_THREADS", _THREADS)
# Sleep, don't spin, at OpenMP barriers: on a shared 2-core machine spinning threads made a step 3-8x slower.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
# cuBLAS gives bitwise reproducible results only with a fixed workspace (CUDA documentation, "Results
# reproducibility"); torch.use_deterministic_algorithms refuses cuBLAS calls without it. Set before CUDA starts.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# ---- data selection: the split is nanoqwen_quant.stdlib_split's (shared with the calibration and evaluation texts)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nanoqwen_quant.stdlib_split import is_heldout, list_stdlib_files, read_text, stdlib_root  # noqa: E402

# ---- tokenizer -------------------------------------------------------------------------------------------------
VOCAB_SIZE = 4096
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2
EOT, IM_START, IM_END = SPECIAL_TOKENS
# Qwen2.5-Coder's fill-in-the-middle and repository markers, ids 3..8 (Qwen2.5's own ids differ; the strings are
# what nanoqwen_rt.fim looks up). Not special, as in Qwen2.5's tokenizer: decoding keeps their text.
FIM_TOKENS = ("<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")
FIM_PREFIX, FIM_MIDDLE, FIM_SUFFIX = FIM_TOKENS[:3]
ADDED_TOKENS = SPECIAL_TOKENS + FIM_TOKENS
# Qwen2's pre-tokenizer split pattern (Qwen2.5's tokenizer.json: digits one by one, newline runs kept whole) with
# one change: punctuation runs do not swallow the newlines after them (Qwen2 has ` ?[^\s\p{L}\p{N}]+[\r\n]*`).
# With Qwen2's rule `):\n` is one token in training, so a prompt ending in `def f(n):` ends in a token the model
# has almost never seen last, and a tiny model answers `):` again; without it, prompt and training agree.
SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen2-Instruct's ChatML template (the non-tool part of Qwen2.5's), default system prompt included.
DEFAULT_SYSTEM = "You are a helpful assistant."
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\n" + DEFAULT_SYSTEM + "<|im_end|>\\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CHAT_EXAMPLE_PER_10K_FILES = 5000  # ~1 in 2 training files contribute their functions as chat examples
CHAT_EXAMPLE_MAX_CHARS = 1500
# A FIM example's source chunk: whole lines, at most this many characters (~190 tokens at 3.1 characters per token,
# so prefix + suffix + middle + 4 markers fit one 257-token training window; longer examples are dropped).
FIM_CHUNK_CHARS = 600
# Share of each batch's windows that are FIM examples: half (StarCoder's FIM rate); with
# DEFAULTS' 3000 steps plain completion (run, chat, the server) still sees 24,000 windows.
FIM_FRACTION = 0.5
# Share of the FIM chunks split at line boundaries (fim_split): a model this small trained on character-level splits
# alone began every middle as the rest of a word ("elf" after `    `), the wrong guess at an editor's cursor.
FIM_LINE_SPLIT_SHARE = 0.5
# A line-split middle is 1 to this many lines (uniform): the completions an editor asks for.
FIM_LINE_MAX_LINES = 3
# Held-out FIM examples scored at the end (loss of the middle + <|endoftext|> tokens), for training_info.json.
FIM_HELDOUT_EXAMPLES = 256

# ---- model -----------------------------------------------------------------------------------------------------
MODEL_CONFIG = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    hidden_act="silu",
    initializer_range=0.02,
    use_sliding_window=False,
    attention_dropout=0.0,
)
SAVE_DTYPE = torch.float16

# ---- training defaults ------------------------------------------------------------------------------------------
# 3000 steps: 24,000 plain windows, ~2 epochs of the plain stream (the 700 of the CPU-trained model, 0.9 epochs,
# left the held-out loss still falling), and as many FIM windows; 1.5 minutes on one H200.
DEFAULTS = dict(seed=1234, steps=3000, batch_size=16, context=256, lr=3e-3, min_lr_ratio=0.1, warmup=30,
                weight_decay=0.1, grad_clip=1.0, eval_every=100, eval_windows=64, threads=DEFAULT_THREADS)
DEVICES = ("cpu", "cuda")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def wants_chat_examples(rel: str) -> bool:
    h = int.from_bytes(hashlib.sha256(("chat:" + rel).encode("utf-8")).digest()[:8], "little")
    return h % 10000 < CHAT_EXAMPLE_PER_10K_FILES


def chat_examples(text: str) -> list[str]:
    """ChatML documents built from the top-level functions of one source file."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    docs = []
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name.startswith("_"):
            continue
        src = ast.get_source_segment(text, node)
        if not src or len(src) > CHAT_EXAMPLE_MAX_CHARS:
            continue
        docs.append(
            f"{IM_START}system\n{DEFAULT_SYSTEM}{IM_END}\n"
            f"{IM_START}user\nWrite a Python function named {node.name}.{IM_END}\n"
            f"{IM_START}assistant\n{src}{IM_END}\n"
        )
    return docs


def fim_chunks(text: str) -> list[str]:
    """The text cut into consecutive runs of whole lines, each at most FIM_CHUNK_CHARS characters (a longer line is
    a chunk of its own and is cut at FIM_CHUNK_CHARS)."""
    chunks, cur = [], ""
    for line in text.splitlines(keepends=True):
        while len(line) > FIM_CHUNK_CHARS:
            if cur:
                chunks.append(cur)
                cur = ""
            chunks.append(line[:FIM_CHUNK_CHARS])
            line = line[FIM_CHUNK_CHARS:]
        if len(cur) + len(line) > FIM_CHUNK_CHARS:
            chunks.append(cur)
            cur = ""
        cur += line
    if cur.strip():
        chunks.append(cur)
    return [c for c in chunks if c.strip()]


def fim_split(c: str, rng: random.Random) -> tuple[int, int]:
    """Where the middle of chunk `c` starts and ends, drawn from `rng`. A FIM_LINE_SPLIT_SHARE of the chunks are cut
    where an editor's cursor usually is: the middle starts after the indentation of a random line and ends at the
    end of that line or of one of the next FIM_LINE_MAX_LINES - 1 (the suffix then starts with the newline); the
    others at two uniformly random character positions (the split of StarCoder's FIM training)."""
    if rng.random() < FIM_LINE_SPLIT_SHARE:
        starts = [0] + [k + 1 for k, ch in enumerate(c) if ch == "\n" and k + 1 < len(c)]
        s = starts[rng.randrange(len(starts))]
        i = s + len(c[s:]) - len(c[s:].lstrip(" \t"))                 # after the line's indentation
        ends = ([k for k in range(i, len(c)) if c[k] == "\n"] + [len(c)])[:FIM_LINE_MAX_LINES]
        return i, ends[rng.randrange(len(ends))]
    i, j = sorted((rng.randint(0, len(c)), rng.randint(0, len(c))))
    return i, j


def fim_examples(texts: list[str], tok, rng: random.Random, max_tokens: int) -> list[list[int]]:
    """PSM token sequences <|fim_prefix|> prefix <|fim_suffix|> suffix <|fim_middle|> middle <|endoftext|> of every
    chunk of `texts` (split by fim_split, drawn from `rng` in order); each part is encoded on its own, as
    nanoqwen_rt.fim encodes a prompt. Examples longer than max_tokens are dropped."""
    ids = {t: tok.token_to_id(t) for t in (FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE, EOT)}
    parts = []
    for text in texts:
        for c in fim_chunks(text):
            i, j = fim_split(c, rng)
            parts += [c[:i], c[j:], c[i:j]]          # prefix, suffix, middle
    enc = tok.encode_batch(parts)
    out = []
    for k in range(0, len(enc), 3):
        pre, suf, mid = enc[k].ids, enc[k + 1].ids, enc[k + 2].ids
        ex = [ids[FIM_PREFIX]] + pre + [ids[FIM_SUFFIX]] + suf + [ids[FIM_MIDDLE]] + mid + [ids[EOT]]
        if len(ex) <= max_tokens:
            out.append(ex)
    return out


def train_tokenizer(texts: list[str]):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False, trim_offsets=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, use_regex=False, trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(ADDED_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    # The trainer makes every added token special; Qwen2.5's FIM markers are not (decoding keeps their text).
    spec = json.loads(tok.to_str())
    for t in spec["added_tokens"]:
        if t["content"] in FIM_TOKENS:
            t["special"] = False
    tok = Tokenizer.from_str(json.dumps(spec, ensure_ascii=False))
    assert tok.get_vocab_size() == VOCAB_SIZE, tok.get_vocab_size()
    for i, s in enumerate(ADDED_TOKENS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    return tok


def cosine_lr(step: int, a) -> float:
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    t = (step - a.warmup) / max(1, a.steps - a.warmup)
    return a.lr * (a.min_lr_ratio + (1 - a.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


@torch.no_grad()
def heldout_loss(model, stream: torch.Tensor, context: int, max_windows: int | None,
                 device: torch.device) -> tuple[float, int]:
    """Mean next-token NLL (nats/token) over consecutive windows of `context` predicted tokens.

    Window i holds tokens [i*context, (i+1)*context + 1): every token after the first is predicted exactly once.
    """
    model.eval()
    n_windows = (len(stream) - 1) // context
    if max_windows is not None:
        n_windows = min(n_windows, max_windows)
    total, count = 0.0, 0
    bs = 16
    for w0 in range(0, n_windows, bs):
        ws = range(w0, min(n_windows, w0 + bs))
        x = torch.stack([stream[i * context:(i + 1) * context + 1] for i in ws]).to(device)  # (b, context + 1)
        logits = model(input_ids=x[:, :-1]).logits.float()  # (b, context, vocab)
        nll = F.cross_entropy(logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1), reduction="sum")
        total += nll.item()
        count += x[:, 1:].numel()
    model.train()
    return total / count, count


@torch.no_grad()
def fim_middle_loss(model, examples: list[list[int]], middle_id: int, device: torch.device) -> tuple[float, int]:
    """Mean NLL (nats/token) of the middle and its closing <|endoftext|> given prefix and suffix, over `examples`
    (one forward pass each: the examples differ in length)."""
    model.eval()
    total, count = 0.0, 0
    for ex in examples:
        x = torch.tensor(ex, dtype=torch.long, device=device)[None]  # (1, n)
        m = ex.index(middle_id)                                      # targets: positions after <|fim_middle|>
        logits = model(input_ids=x[:, :-1]).logits.float()[0, m:]   # (n - 1 - m, vocab)
        total += F.cross_entropy(logits, x[0, m + 1:], reduction="sum").item()
        count += len(ex) - 1 - m
    model.train()
    return total / count, count


def atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix="." + path.name + ".")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def finalize_files(ckpt: Path) -> None:
    """Make the saved files readable by every consumer; idempotent.

    transformers ≥ 5 writes rope theta only inside `rope_parameters` and the dtype as `dtype`; readers written for
    transformers 4.x (and simple converters) look for top-level `rope_theta` / `torch_dtype`, so both spellings are
    stored (transformers 5 loads the file unchanged). The temp dir is created 0700, so permissions are widened.
    """
    cfg_path = ckpt / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["rope_theta"] = MODEL_CONFIG["rope_theta"]
    cfg["torch_dtype"] = str(SAVE_DTYPE).replace("torch.", "")
    atomic_write_text(cfg_path, json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    # transformers ≥ 5 no longer writes special_tokens_map.json; older loaders and tools still read it.
    special = {"additional_special_tokens": [IM_START, IM_END], "eos_token": EOT, "pad_token": EOT}
    atomic_write_text(ckpt / "special_tokens_map.json", json.dumps(special, indent=2) + "\n")
    os.chmod(ckpt, 0o755)
    for f in ckpt.iterdir():
        os.chmod(f, 0o644)


def save_checkpoint(model, tok, out: Path, info: dict, heldout: list[str]) -> None:
    """Write the HF checkpoint into a temp dir beside `out`, then swap it in."""
    from transformers import GenerationConfig, PreTrainedTokenizerFast

    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix="." + out.name + ".tmp"))

    half = model.to("cpu", SAVE_DTYPE)
    max_abs = max(p.detach().abs().max().item() for p in half.parameters())
    assert math.isfinite(max_abs) and max_abs < 6e4, f"weights leave fp16 range: {max_abs}"
    half.config.dtype = SAVE_DTYPE  # transformers ≥ 5 ("torch_dtype" before)
    half.save_pretrained(tmp, safe_serialization=True)
    model.float()

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOT, pad_token=EOT, bos_token=None, unk_token=None,
        additional_special_tokens=[IM_START, IM_END], model_max_length=MODEL_CONFIG["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(tmp)
    # Ask for the Qwen2 class where this transformers can load it from our files (the brief's rule).
    cfg_path = tmp / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "Qwen2Tokenizer"
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg["add_bos_token"] = False
    cfg["add_prefix_space"] = False
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    try:
        from transformers import AutoTokenizer

        t2 = AutoTokenizer.from_pretrained(tmp)
        ok = t2.encode("def f(x):\n    return x") == tok.encode("def f(x):\n    return x").ids
        assert ok, "Qwen2Tokenizer encodes differently"
    except Exception as e:  # fall back to the generic fast class
        log(f"Qwen2Tokenizer does not load our files ({e!r}); using PreTrainedTokenizerFast")
        cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
        cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    info["tokenizer_class"] = cfg["tokenizer_class"]

    gen = GenerationConfig(
        bos_token_id=tok.token_to_id(EOT),
        eos_token_id=[tok.token_to_id(EOT), tok.token_to_id(IM_END)],
        pad_token_id=tok.token_to_id(EOT),
        do_sample=False,
        max_new_tokens=128,
    )
    gen.save_pretrained(tmp)
    (tmp / "heldout_files.txt").write_text("".join(r + "\n" for r in heldout), encoding="utf-8")
    (tmp / "training_info.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    finalize_files(tmp)

    if out.exists():
        old = Path(tempfile.mkdtemp(dir=out.parent, prefix="." + out.name + ".old"))
        os.replace(out, old / "x")
        os.replace(tmp, out)
        import shutil

        shutil.rmtree(old)
    else:
        os.replace(tmp, out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "tiny-py")
    ap.add_argument("--device", choices=DEVICES, default="cpu",
                    help="where the model trains (cuda: the first GPU); data and tokenizer are prepared on the CPU")
    for k, v in DEFAULTS.items():
        ap.add_argument("--" + k.replace("_", "-"), type=type(v), default=v)
    ap.add_argument("--probe-seconds", type=float, default=0.0,
                    help="measure training steps/s for this many seconds, print it, and exit (nothing saved)")
    a = ap.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("train_tiny_py: --device cuda, but torch sees no CUDA device", file=sys.stderr)
        return 2
    device = torch.device(a.device)

    t_start = time.time()
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    torch.set_float32_matmul_precision("highest")      # float32 matmuls stay float32 (no TF32 on the GPU)
    # warn_only: an operation without a deterministic implementation is named (recorded in training_info.json as
    # nondeterministic_ops) instead of ending the run; two short runs with the same seed tell whether it mattered.
    torch.use_deterministic_algorithms(True, warn_only=True)
    nondeterministic = record_nondeterminism_warnings()

    root = stdlib_root()
    files = list_stdlib_files(root)
    train_files, heldout_files, train_texts, heldout_texts = [], [], [], []
    for rel in files:
        text = read_text(root, rel)
        if text is None or not text.strip():
            continue
        (heldout_files if is_heldout(rel) else train_files).append(rel)
        (heldout_texts if is_heldout(rel) else train_texts).append(text)
    log(f"python {platform.python_version()} stdlib {root}: {len(train_files)} train files, "
        f"{len(heldout_files)} held-out files, {sum(map(len, train_texts)) / 1e6:.1f} M train chars")

    tok = train_tokenizer(train_texts)
    log(f"tokenizer trained ({tok.get_vocab_size()} tokens)")

    chat_docs = []
    for rel, text in zip(train_files, train_texts):
        if wants_chat_examples(rel):
            chat_docs.extend(chat_examples(text))
    # Interleave files and chat examples in a seeded order; every document ends with <|endoftext|>.
    docs = [t + EOT for t in train_texts] + [d + EOT for d in chat_docs]
    g = torch.Generator().manual_seed(a.seed)
    order = torch.randperm(len(docs), generator=g).tolist()
    enc = tok.encode_batch([docs[i] for i in order])
    train_stream = torch.tensor([t for e in enc for t in e.ids], dtype=torch.long)  # (n_train_tokens,)
    heldout_enc = tok.encode_batch([t + EOT for t in heldout_texts])
    heldout_stream = torch.tensor([t for e in heldout_enc for t in e.ids], dtype=torch.long)  # (n_heldout_tokens,)
    log(f"{len(chat_docs)} chat examples; train tokens {len(train_stream):,}, held-out tokens {len(heldout_stream):,}"
        f" ({sum(map(len, heldout_texts)) / len(heldout_stream):.2f} chars/token)")

    # FIM examples: the training files' chunks in a seeded order, concatenated; a FIM window starts at an example.
    fim = fim_examples(train_texts, tok, random.Random(f"{a.seed}:fim"), a.context + 1)
    fim_order = torch.randperm(len(fim), generator=g).tolist()
    fim_stream = torch.tensor([t for i in fim_order for t in fim[i]], dtype=torch.long)  # (n_fim_tokens,)
    fim_starts, pos = [], 0
    for i in fim_order:
        if pos + a.context + 1 <= len(fim_stream):
            fim_starts.append(pos)
        pos += len(fim[i])
    fim_starts = torch.tensor(fim_starts, dtype=torch.long)  # (n_fim_windows,)
    fim_heldout = fim_examples(heldout_texts, tok, random.Random(f"{a.seed}:fim-heldout"), a.context + 1)
    fim_heldout = fim_heldout[:FIM_HELDOUT_EXAMPLES]
    n_fim = round(a.batch_size * FIM_FRACTION)
    log(f"{len(fim):,} FIM examples ({len(fim_stream):,} tokens); {n_fim} of {a.batch_size} windows per batch; "
        f"{len(fim_heldout)} held-out FIM examples")

    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**MODEL_CONFIG, bos_token_id=tok.token_to_id(EOT), eos_token_id=tok.token_to_id(EOT),
                         pad_token_id=tok.token_to_id(EOT))
    # eager attention (matmul, softmax, matmul): deterministic on CUDA with the fixed cuBLAS workspace, on both
    # devices the same operations; sdpa's float32 CUDA kernel (memory-efficient attention) has a non-deterministic
    # backward.
    config._attn_implementation = "eager"
    model = Qwen2ForCausalLM(config)                     # initialised on the CPU from the seed, then moved
    n_params = sum(p.numel() for p in model.parameters())
    model.to(device)
    log(f"model: {n_params:,} parameters (tied embeddings counted once), training on {a.device}"
        f"{' (' + torch.cuda.get_device_name(device) + ')' if a.device == 'cuda' else ''}, {a.threads} CPU threads")

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=a.lr, betas=(0.9, 0.95), eps=1e-8)

    n_starts = len(train_stream) - a.context - 1
    model.train()
    t0 = time.time()
    history = []
    steps = a.steps
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = cosine_lr(step, a)
        starts = torch.randint(0, n_starts, (a.batch_size - n_fim,), generator=g)
        fstarts = fim_starts[torch.randint(0, len(fim_starts), (n_fim,), generator=g)]
        x = torch.stack([train_stream[s:s + a.context + 1] for s in starts.tolist()]
                        + [fim_stream[s:s + a.context + 1] for s in fstarts.tolist()])  # (batch, context + 1)
        x = x.to(device)
        logits = model(input_ids=x[:, :-1]).logits  # (batch, context, vocab)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip)
        opt.step()
        if a.probe_seconds and time.time() - t0 > a.probe_seconds:
            lv = loss.item()                         # waits for the device
            sps = (step + 1) / (time.time() - t0)
            log(f"probe: {step + 1} steps in {time.time() - t0:.1f} s = {sps:.3f} steps/s; loss {lv:.3f}; "
                f"setup took {t0 - t_start:.1f} s")
            return 0
        if step % 10 == 0:
            log(f"step {step}/{steps} loss {loss.item():.4f} lr {cosine_lr(step, a):.2e} "
                f"{(step + 1) / (time.time() - t0):.3f} steps/s")
        if (step + 1) % a.eval_every == 0 and step + 1 < steps:
            hl, _ = heldout_loss(model, heldout_stream, a.context, a.eval_windows, device)
            history.append({"step": step + 1, "train_loss": loss.item(), "heldout_loss_subset": hl})
            log(f"step {step + 1}: held-out loss (first {a.eval_windows} windows) {hl:.4f}")
    final_train_loss = loss.item()
    train_seconds = time.time() - t0

    hl32, n_tok = heldout_loss(model, heldout_stream, a.context, None, device)
    log(f"final held-out loss fp32: {hl32:.4f} nats/token (ppl {math.exp(hl32):.2f}) over {n_tok:,} tokens")
    model16 = Qwen2ForCausalLM(config)
    model16.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    model16.to(SAVE_DTYPE).float()  # round-trip through the saved dtype
    model16.to(device)
    hl16, _ = heldout_loss(model16, heldout_stream, a.context, None, device)
    log(f"final held-out loss after fp16 rounding: {hl16:.4f} nats/token (ppl {math.exp(hl16):.2f})")
    fim16, n_fim_tok = fim_middle_loss(model16, fim_heldout, tok.token_to_id(FIM_MIDDLE), device)
    log(f"held-out FIM middle loss (fp16 weights): {fim16:.4f} nats/token over {n_fim_tok:,} tokens")

    info = {
        "python_version": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "stdlib_root": str(root),
        "device": a.device,
        "device_name": torch.cuda.get_device_name(device) if a.device == "cuda" else platform.processor() or "cpu",
        "cuda_version": torch.version.cuda if a.device == "cuda" else None,
        "cpu_threads": a.threads,
        "deterministic": {"use_deterministic_algorithms": True,
                          "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
                          "float32_matmul_precision": torch.get_float32_matmul_precision(),
                          "attention": config._attn_implementation,
                          "nondeterministic_ops": sorted(nondeterministic)},
        "n_train_files": len(train_files),
        "n_heldout_files": len(heldout_files),
        "n_chat_examples": len(chat_docs),
        "n_train_tokens": len(train_stream),
        "fim": {"format": "PSM: <|fim_prefix|>prefix<|fim_suffix|>suffix<|fim_middle|>middle<|endoftext|>",
                "chunk_chars": FIM_CHUNK_CHARS, "line_split_share": FIM_LINE_SPLIT_SHARE,
                "line_split_max_lines": FIM_LINE_MAX_LINES,
                "fraction_of_windows": FIM_FRACTION, "windows_per_batch": n_fim,
                "n_examples": len(fim), "n_tokens": len(fim_stream), "n_heldout_examples": len(fim_heldout),
                "heldout_middle_tokens": n_fim_tok, "heldout_middle_loss_saved_dtype": fim16},
        "n_heldout_tokens_scored": n_tok,
        "n_parameters": n_params,
        "save_dtype": str(SAVE_DTYPE).replace("torch.", ""),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items() if k not in ("out",)},
        "train_seconds": round(train_seconds, 1),
        "tokens_seen": steps * a.batch_size * a.context,
        "final_train_loss": final_train_loss,
        "heldout_loss_fp32": hl32,
        "heldout_ppl_fp32": math.exp(hl32),
        "heldout_loss_saved_dtype": hl16,
        "heldout_ppl_saved_dtype": math.exp(hl16),
        "heldout_eval": f"consecutive {a.context}-token windows over the held-out files, each followed by "
                        f"<|endoftext|>, concatenated in heldout_files.txt order; every token after the first "
                        f"predicted once",
        "history": history,
        "torch_version": torch.__version__,
        "library_versions": _library_versions(),
    }
    save_checkpoint(model16, tok, a.out, info, heldout_files)
    log(f"saved {a.out} ({sum(f.stat().st_size for f in a.out.iterdir()) / 1e6:.2f} MB); "
        f"total {time.time() - t_start:.0f} s")
    return 0


def record_nondeterminism_warnings() -> set[str]:
    """The first lines of the warnings torch gives (under use_deterministic_algorithms(warn_only=True)) for an
    operation without a deterministic implementation, collected as they are shown; every warning is still shown."""
    import warnings
    seen: set[str] = set()
    show = warnings.showwarning

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if "deterministic" in str(message).lower():
            seen.add(str(message).splitlines()[0])
        show(message, category, filename, lineno, file, line)

    warnings.showwarning = showwarning
    return seen


def _library_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version
    out = {}
    for name in ("torch", "transformers", "tokenizers", "safetensors"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


if __name__ == "__main__":
    sys.exit(main())
