"""The one entry point that opens any source checkpoint: a GGUF file (or Ollama blob), a GPTQ/AWQ-quantized
Hugging Face directory (nanoqwen_quant.sources), or a plain one (nanoqwen_quant.hf). The readers depend on hf.py's
shared types; this module depends on all of them, so no reader imports another's dispatcher."""
from __future__ import annotations

import os

from .hf import Checkpoint, load_hf, read_hf_config, resolve_source
from .sources import load_quantized
from .sources.gguf_file import load_gguf


def load_checkpoint(src: str | os.PathLike, revision: str | None = None) -> Checkpoint:
    """Open a checkpoint (local dir, GGUF file or hub id): config, tensor locations, checked against the config."""
    source = resolve_source(src, revision)
    if source.path.is_file():                         # resolve_source only lets GGUF files through
        return load_gguf(source)
    cfg = read_hf_config(source)
    if cfg.get("quantization_config"):
        return load_quantized(source, cfg)
    return load_hf(source, cfg)
