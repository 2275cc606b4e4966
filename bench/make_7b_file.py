#!/usr/bin/env python3
"""Write a random Qwen2.5-Coder-7B-shaped .nanoqwen file directly (no checkpoint, no quantizer), for benchmarks
and full-size GPU tests on the device machine.

    python3 bench/make_7b_file.py OUT.nanoqwen [--layers 28] [--quant int4|int4-asym|none] [--group-size 128] [--seed 0]

Contents (shapes: nanoqwen_bench.measure.QWEN25_CODER_7B; untied lm_head, q/k/v biases):
* linear weights (q/k/v/o/gate/up/down): int4g layout 1 — i.i.d. codes q = u - 8 drawn from INT4_CODE_SLOTS
  (16 equally likely slots: a bell-shaped, exactly zero-mean distribution on -6..6, like round-to-nearest codes
  of Gaussian weights), and f16 scales s = base(K) * exp(0.2 z - 0.02), z ~ N(0, 1) per group,
  base(K) = 1 / sqrt(E[q^2] K), so a GEMV of a unit-variance input has unit-variance output
  (E[exp(0.4 z - 0.04)] = 1). Zero mean matters: codes uniform on 0..15 (mean q = -0.5) give every row the same
  non-zero mean, so each GEMV adds ~0.1 sqrt(K) x (mean of its input) to every output — a common mode that grows
  ~6x per layer at K = 3584 until the final hidden state points along (1, ..., 1) and greedy decoding repeats
  one token forever (seen on the H200). With --quant none: f16 N(0, 1/K). With --quant int4-asym: int4g layout 2
  (spec 9.5) holding the same weights as layout 1 with the same seed: each group gets a zero point z = 8 + d,
  d uniform in {-1, 0, 1}, and its codes u + d (u in 2..14, so u + d stays in 1..15 and the words shift nibble-wise
  without carries), so s * (u + d - z) = s * (u - 8): the layout-2 kernels' timing on the same model.
* embeddings f16 N(0, 1); lm_head f16 N(0, (LOGIT_STD^2)/hidden) (logits of std ~LOGIT_STD after the final
  norm); RMSNorm weights f16 1 + 0.1 z; q/k/v biases f16 0.1 z. Hidden states stay O(1) through the layers.
* blobs: the real Qwen2 tokenizer (tokenizer.json built here from bench/assets/qwen2-tokenizer/vocab.json +
  merges.txt, with Qwen2.5's 22 added tokens), Qwen2.5's ChatML chat template, generation_config,
  tokenizer_config, provenance.

Deterministic for a given (--seed, --layers, --quant, --group-size) whatever the thread count: every chunk of
rows draws from its own PCG64 stream seeded by (seed, tensor index, chunk index). Normal variates come from a
65536-entry table of exact N(0, 1) quantiles indexed by random 16-bit words (one gather per value: ~10x faster
than drawing and casting floats, and the tails are cut at 4.3 sigma, which is harmless here). Generation runs
on all cores, one tensor ahead of the (single-threaded, streaming) writer.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # repo root, when not installed

from nanoqwen_format.constants import LAYOUT_INT4_ROWMAJOR_K8_ASYM  # noqa: E402
from nanoqwen_format import (BlobKind, DType, ModelConfig, NanoqwenFormatError, NanoqwenWriter,  # noqa: E402
                             TensorSpec, expected_tensors)
from nanoqwen_bench.measure import QWEN25_CODER_7B  # noqa: E402
from nanoqwen_format.shapes import QWEN25_SHAPES  # noqa: E402

ASSETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets", "qwen2-tokenizer")

# -- weight statistics ------------------------------------------------------------------------------------
# 16 equally likely values of q = u - 8; symmetric, so the mean is exactly 0. Shape ~ rtn codes of N(0, 1) groups
# of 128 (s = absmax / 7 ~ 0.4): P(q=0) 1/8, P(|q|=1) 1/4, P(|q|=2) 1/4, then 3, 4 and a tail value 6.
INT4_CODE_SLOTS = (0, 0, 1, -1, 1, -1, 2, -2, 2, -2, 3, -3, 4, -4, 6, -6)
INT4_CODE_SECOND_MOMENT = sum(q * q for q in INT4_CODE_SLOTS) / len(INT4_CODE_SLOTS)   # E[q^2] = 142/16
SCALE_JITTER = 0.2               # sigma of the per-group log-normal factor on the int4 scales
LOGIT_STD = 3.0                  # std of lm_head logits for a unit-rms final hidden state
NORM_WEIGHT_STD = 0.1            # RMSNorm weights 1 + this * z
BIAS_STD = 0.1                   # q/k/v biases
CHUNK_BYTES = 8 << 20            # target output bytes of one generation job (its temporaries stay in the heap)

# -- tokenizer / template -------------------------------------------------------------------------------------
QWEN2_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_BASE_VOCAB = 151643        # ids 0..151642 are BPE tokens; added tokens follow
# Qwen2.5's added tokens, ids 151643.. in order: (content, special)
QWEN25_ADDED_TOKENS = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True), ("<|quad_start|>", True),
    ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False),
]

# Qwen2.5(-Coder)-Instruct's chat template (ChatML, default system prompt, tool calls)
QWEN25_CHAT_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
    "    {%- endif %}\n"
    "    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are "
    "provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- \"\\n\" }}\n"
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or "
    "(message.role == \"assistant\" and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n"
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n"
    "            {{- tool_call.name }}\n"
    "            {{- '\", \"arguments\": ' }}\n"
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)

# Qwen2.5-Coder-7B-Instruct's generation_config.json
GENERATION_CONFIG = {"bos_token_id": 151643, "pad_token_id": 151643, "do_sample": True,
                     "eos_token_id": [151645, 151643], "repetition_penalty": 1.05, "temperature": 0.7,
                     "top_p": 0.8, "top_k": 20}
TOKENIZER_CONFIG = {"add_prefix_space": False, "bos_token": None, "eos_token": "<|im_end|>",
                    "pad_token": "<|endoftext|>", "unk_token": None, "errors": "replace",
                    "model_max_length": 131072, "split_special_tokens": False,
                    "clean_up_tokenization_spaces": False, "tokenizer_class": "Qwen2Tokenizer"}


class MakeFileError(RuntimeError):
    """Bad arguments or missing assets (the message says which)."""


def build_qwen2_tokenizer_json(assets: str = ASSETS) -> str:
    """tokenizer.json (as str) of the real Qwen2/Qwen2.5 byte-level BPE tokenizer, from vocab.json + merges.txt.

    Byte-level BPE, NFC normalizer, Qwen2's split regex then byte-level mapping, no prefix space, and Qwen2.5's
    22 added tokens at ids 151643..151664 (special ones are skipped by decode(skip_special_tokens=True)).
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    vocab_p, merges_p = os.path.join(assets, "vocab.json"), os.path.join(assets, "merges.txt")
    for p in (vocab_p, merges_p):
        if not os.path.isfile(p):
            raise MakeFileError(f"tokenizer asset missing: {p}")
    vocab, merges = models.BPE.read_file(vocab_p, merges_p)
    if len(vocab) != QWEN2_BASE_VOCAB:
        raise MakeFileError(f"{vocab_p}: expected {QWEN2_BASE_VOCAB} tokens, found {len(vocab)}")
    tok = Tokenizer(models.BPE(vocab, merges, dropout=None, unk_token=None, continuing_subword_prefix="",
                               end_of_word_suffix="", fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    for i, (content, special) in enumerate(QWEN25_ADDED_TOKENS):   # one at a time: ids follow this order
        t = AddedToken(content, special=special, normalized=False, lstrip=False, rstrip=False, single_word=False)
        (tok.add_special_tokens if special else tok.add_tokens)([t])
        got = tok.token_to_id(content)
        if got != QWEN2_BASE_VOCAB + i:
            raise MakeFileError(f"added token {content!r}: expected id {QWEN2_BASE_VOCAB + i}, got {got}")
    return tok.to_str()


# -- random weights -------------------------------------------------------------------------------------
def _normal_table() -> np.ndarray:
    """float32 (65536,): the N(0, 1) quantiles at (i + 0.5) / 65536 — exact normal, 16-bit resolution."""
    nd = statistics.NormalDist()
    return np.array([nd.inv_cdf((i + 0.5) / 65536.0) for i in range(65536)], dtype=np.float32)


def _code_word_table() -> np.ndarray:
    """uint16 (65536,): maps 16 random bits to 4 nibbles u = 8 + INT4_CODE_SLOTS[4 random bits] each.

    Applied to both halves of a random uint32 word it gives 8 i.i.d. codes (the nibble order inside the word is
    then irrelevant)."""
    slots_u = np.array([8 + q for q in INT4_CODE_SLOTS], dtype=np.uint16)      # (16,) values 2..14
    x = np.arange(65536, dtype=np.uint32)
    out = np.zeros(65536, dtype=np.uint32)
    for i in range(4):
        out |= slots_u[(x >> (4 * i)) & 0xF].astype(np.uint32) << (4 * i)
    return out.astype(np.uint16)


def _u16(rng: np.random.Generator, n: int) -> np.ndarray:
    """n random uint16 words (n rounded up to a multiple of 4 internally)."""
    return rng.bit_generator.random_raw((n + 3) // 4).view(np.uint16)[:n]


def int4_base_scale(k: int) -> float:
    """Scale giving unit output variance for unit-variance input over K codes drawn from INT4_CODE_SLOTS."""
    return (INT4_CODE_SECOND_MOMENT * k) ** -0.5


class Plan:
    """What to write: config, specs (file order), and how each tensor is generated."""

    def __init__(self, cfg: ModelConfig, quant: str, group_size: int, seed: int):
        if quant not in ("int4", "int4-asym", "none"):
            raise MakeFileError(f"--quant must be int4, int4-asym or none, got {quant!r}")
        self.cfg, self.quant, self.group_size, self.seed = cfg, quant, group_size, seed
        self.specs: list[TensorSpec] = []
        for name, shape in expected_tensors(cfg).items():
            if quant != "none" and name.endswith("_proj.weight"):
                if shape[1] % group_size or shape[1] % 32:
                    raise MakeFileError(f"{name}: K={shape[1]} not a multiple of group size {group_size} and 32")
                self.specs.append(TensorSpec(name, DType.INT4G, shape, group_size,
                                             LAYOUT_INT4_ROWMAJOR_K8_ASYM if quant == "int4-asym" else 0))
            else:
                self.specs.append(TensorSpec(name, DType.F16, shape))
        z = _normal_table()
        h = cfg.hidden_size
        self.tables = {   # f16 (65536,) value tables: one gather per generated value
            "embed": z.astype(np.float16),
            "lm_head": (z * (LOGIT_STD / np.sqrt(h))).astype(np.float16),
            "norm": (1.0 + NORM_WEIGHT_STD * z).astype(np.float16),
            "bias": (BIAS_STD * z).astype(np.float16),
            "jitter": np.exp(SCALE_JITTER * z - SCALE_JITTER ** 2 / 2).astype(np.float32),   # mean-square 1
        }
        self.code_words = _code_word_table()                                   # (65536,) uint16
        self._free: dict[tuple, list] = {}
        self._f16_linear_tables: dict[int, np.ndarray] = {}
        for s in self.specs:
            if s.dtype == DType.F16 and s.name.endswith("_proj.weight"):
                k = s.shape[1]
                self._f16_linear_tables.setdefault(k, (z / np.sqrt(k)).astype(np.float16))

    def kind(self, name: str) -> str:
        if name == "model.embed_tokens.weight":
            return "embed"
        if name == "lm_head.weight":
            return "lm_head"
        if name.endswith("norm.weight"):
            return "norm"
        if name.endswith(".bias"):
            return "bias"
        return "linear"

    def total_bytes(self) -> int:
        from nanoqwen_format import tensor_nbytes
        return sum(tensor_nbytes(s.dtype, s.shape, s.group_size) for s in self.specs)

    # output buffers are recycled (layers repeat shapes): fresh GB-sized arrays cost more in page faults than
    # their generation
    def alloc(self, spec: TensorSpec):
        key = (spec.dtype, spec.shape, spec.group_size)
        free = self._free.setdefault(key, [])
        return free.pop() if free else self._new(spec)

    def release(self, spec: TensorSpec, out) -> None:
        self._free.setdefault((spec.dtype, spec.shape, spec.group_size), []).append(out)

    def _new(self, spec: TensorSpec):
        if spec.dtype == DType.INT4G:
            n, k = spec.shape
            parts = (np.empty((n, k // 8), dtype=np.uint32),                 # qweight (N, K/8)
                     np.empty((n, k // spec.group_size), dtype=np.float16))  # scales (N, K/g)
            if spec.layout_id == LAYOUT_INT4_ROWMAJOR_K8_ASYM:
                parts += (np.empty((n, k // spec.group_size), dtype=np.uint8),)   # zero points (N, K/g)
            return parts
        return (np.empty(spec.shape, dtype=np.float16),)

    def row_chunks(self, spec: TensorSpec) -> list[tuple[int, int]]:
        n = spec.shape[0]
        row_bytes = max(1, (spec.shape[1] // 2 if spec.dtype == DType.INT4G else 2 * int(np.prod(spec.shape[1:]))))
        step = max(1, CHUNK_BYTES // row_bytes)
        return [(r, min(n, r + step)) for r in range(0, n, step)]

    def fill(self, ti: int, ci: int, spec: TensorSpec, out, r0: int, r1: int) -> None:
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, ti, ci])))
        if spec.dtype == DType.INT4G:
            q, s = out[0], out[1]
            rows = r1 - r0
            halves = 2 * rows * q.shape[1]                                      # 16-bit halves of the words
            np.take(self.code_words, _u16(rng, halves), out=q[r0:r1].reshape(-1).view(np.uint16), mode="wrap")
            jit = self.tables["jitter"][_u16(rng, rows * s.shape[1])].reshape(rows, -1)
            s[r0:r1] = (jit * np.float32(int4_base_scale(spec.shape[1]))).astype(np.float16)
            if len(out) == 3:   # layout 2: zero point 8 + d per group, every code of the group + d (module doc)
                d = rng.integers(-1, 2, size=(rows, s.shape[1]), dtype=np.int64)
                out[2][r0:r1] = (8 + d).astype(np.uint8)
                words = np.repeat(d, spec.group_size // 8, axis=1) * 0x11111111      # d added to all 8 nibbles
                q[r0:r1] = ((q[r0:r1].astype(np.int64) + words) & 0xFFFFFFFF).astype(np.uint32)
            return
        kind = self.kind(spec.name)
        table = self._f16_linear_tables[spec.shape[1]] if kind == "linear" else self.tables[kind]
        (a,) = out
        flat_rows = a.reshape(a.shape[0], -1) if a.ndim > 1 else a.reshape(1, -1)
        if a.ndim == 1:       # small 1-D tensors: one job
            # indices < 65536 = len(table): "wrap" never applies, it only skips the slow bounds-checking path
            np.take(table, _u16(rng, a.shape[0]), out=a, mode="wrap")
            return
        m = (r1 - r0) * flat_rows.shape[1]
        np.take(table, _u16(rng, m), out=flat_rows[r0:r1].reshape(-1), mode="wrap")


def make_file(out_path: str, cfg: ModelConfig, quant: str = "int4", group_size: int = 128, seed: int = 0,
              threads: int | None = None, progress: bool | None = None, assets: str = ASSETS) -> dict:
    """Write the random model to out_path (atomically, via NanoqwenWriter). Returns timing/size stats."""
    t0 = time.perf_counter()
    plan = Plan(cfg, quant, group_size, seed)
    tok_json = build_qwen2_tokenizer_json(assets)
    t_tok = time.perf_counter() - t0
    threads = threads or os.cpu_count() or 1
    blobs = [(BlobKind.TOKENIZER_JSON, tok_json.encode()),
             (BlobKind.CHAT_TEMPLATE, QWEN25_CHAT_TEMPLATE.encode()),
             (BlobKind.GENERATION_CONFIG, json.dumps(GENERATION_CONFIG).encode()),
             (BlobKind.TOKENIZER_CONFIG, json.dumps(TOKENIZER_CONFIG).encode()),
             (BlobKind.PROVENANCE, json.dumps({
                 "tool": "bench/make_7b_file.py", "synthetic": True, "weights": "random",
                 "shape": shape_name(cfg), "n_layers": cfg.n_layers, "quant": quant,
                 "group_size": group_size if quant != "none" else None, "seed": seed,
                 "tokenizer": "Qwen2 vocab.json + merges.txt (Apache-2.0)"}).encode())]
    if progress is None:
        progress = sys.stderr.isatty()
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=plan.total_bytes(), unit="B", unit_scale=True, desc="writing", file=sys.stderr)
    pending: dict[int, tuple[object, list[Future]]] = {}
    specs = plan.specs
    t_wait = 0.0

    def submit(pool, ti):
        spec = specs[ti]
        out = plan.alloc(spec)
        chunks = plan.row_chunks(spec) if len(spec.shape) > 1 else [(0, spec.shape[0])]
        futs = [pool.submit(plan.fill, ti, ci, spec, out, r0, r1) for ci, (r0, r1) in enumerate(chunks)]
        pending[ti] = (out, futs)

    with ThreadPoolExecutor(max_workers=threads) as pool, \
            NanoqwenWriter(out_path, cfg, specs, [k for k, _ in blobs]) as w:
        submit(pool, 0)
        for ti, spec in enumerate(specs):
            if ti + 1 < len(specs):
                submit(pool, ti + 1)          # generate the next tensor while this one is written
            out, futs = pending.pop(ti)
            tw = time.perf_counter()
            for f in futs:
                f.result()
            t_wait += time.perf_counter() - tw
            if spec.dtype == DType.INT4G:
                w.write_int4(spec.name, *out)
            else:
                w.write_tensor(spec.name, out[0])
            if bar is not None:
                bar.update(sum(a.nbytes for a in out))
            plan.release(spec, out)
        for kind, data in blobs:
            w.write_blob(kind, data)
    if bar is not None:
        bar.close()
    return {"path": out_path, "bytes": os.path.getsize(out_path), "seconds": time.perf_counter() - t0,
            "tokenizer_seconds": t_tok, "waiting_for_generation_seconds": t_wait, "threads": threads}


def qwen7b_config(layers: int = 28) -> ModelConfig:
    return shape_config("7B", layers)


def shape_config(shape: str, layers: int | None = None) -> ModelConfig:
    """The 7B's config with the shape fields of Qwen2.5 size `shape` (nanoqwen_format.shapes.QWEN25_SHAPES: hidden,
    intermediate, heads, head_dim, layers, vocab), always untied: issue 15's per-size decode cases read an f16
    lm_head of their own. layers: None = the size's own count."""
    if shape not in QWEN25_SHAPES:
        raise MakeFileError(f"--shape must be one of {', '.join(QWEN25_SHAPES)}, got {shape!r}")
    sh = QWEN25_SHAPES[shape]
    layers = sh.n_layers if layers is None else layers
    if layers < 1:
        raise MakeFileError(f"--layers must be >= 1, got {layers}")
    return ModelConfig(**{**QWEN25_CODER_7B, "n_layers": layers, "hidden_size": sh.hidden,
                          "intermediate_size": sh.intermediate, "n_heads": sh.n_heads, "n_kv_heads": sh.n_kv_heads,
                          "head_dim": sh.head_dim, "vocab_rows": sh.vocab, "tied_embeddings": False})


def shape_name(cfg: ModelConfig) -> str:
    """"Qwen2.5-Coder-<size>" of the size whose shape fields cfg has (the layer count aside)."""
    for name, sh in QWEN25_SHAPES.items():
        if (cfg.hidden_size, cfg.intermediate_size, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == \
                (sh.hidden, sh.intermediate, sh.n_heads, sh.n_kv_heads, sh.head_dim):
            return f"Qwen2.5-Coder-{name}"
    return "custom"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="output .nanoqwen path")
    ap.add_argument("--shape", default="7B", help=f"Qwen2.5 size whose shapes to use ({', '.join(QWEN25_SHAPES)}); "
                    "the lm_head is untied f16 at every size")
    ap.add_argument("--layers", type=int, default=None, help="layers (default: the size's)")
    ap.add_argument("--quant", default="int4", choices=["int4", "int4-asym", "none"])
    ap.add_argument("--group-size", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--verify", action="store_true", help="reopen the file with checksum verification, timed")
    a = ap.parse_args(argv)
    try:
        stats = make_file(a.out, shape_config(a.shape, a.layers), a.quant, a.group_size, a.seed, a.threads,
                          progress=False if a.quiet else None)
    except (MakeFileError, NanoqwenFormatError, OSError) as e:
        print(f"make_7b_file: {e}", file=sys.stderr)
        return 2
    if not a.quiet:
        print(f"wrote {stats['path']}: {stats['bytes'] / 1e9:.3f} GB in {stats['seconds']:.1f} s "
              f"({stats['threads']} threads, {stats['waiting_for_generation_seconds']:.1f} s waiting for "
              f"generation, tokenizer {stats['tokenizer_seconds']:.1f} s)")
    if a.verify:
        from nanoqwen_format import open_file
        t = time.perf_counter()
        try:
            with open_file(a.out, verify_checksums=True) as f:
                n = len(f.tensors)
        except NanoqwenFormatError as e:
            print(f"make_7b_file: verification failed: {e}", file=sys.stderr)
            return 1
        print(f"verified {n} tensors + blobs (open + CRC32C) in {time.perf_counter() - t:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
