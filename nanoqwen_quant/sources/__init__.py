"""Reading checkpoints that are already quantized: GPTQ and AWQ safetensors directories, and GGUF files.

Every source becomes an `ImportedCheckpoint`, the same interface the converter and `nanoqwen-verify --source`
use for plain Hugging Face checkpoints (nanoqwen_quant.hf.Checkpoint):

* `read_rows(name, a, b)` gives the source's own float32 values: the exact dequantization of a packed tensor
  (GPTQ/AWQ: float32(s) * (q - z), exact in float32; GGUF: the `gguf` package's dequantizer), so verify compares
  against what the source means.
* `int4_tensor(name, g, mode, layouts)` gives (qweight, scales) in layout 1 or (qweight, scales, zeros) in layout 2:
  a lossless repack where the source's codes and scales are already ours (4-bit, group g along K in k order, finite
  f16 scales >= 0; zero 8 everywhere: layout 1, zero points in 0..15: layout 2 (AWQ, GPTQ sym: false), when
  `layouts` allows it: both by default, layout 1 alone with nanoqwen-convert --int4-layout 1), else our quantizer applied to the exact dequantization, in layout 1 (the "requantized"
  tensors, whose error is recorded).
* `exact_int4(name, layouts)` says which tensors have a lossless repack: (group size, layout id), or None.

gptq.py / awq.py: the packed formats (unpacking + exactness checks); gguf_file.py: GGUF files and Ollama blobs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from nanoqwen_format import LAYOUT_INT4_ROWMAJOR_K8, LAYOUT_INT4_ROWMAJOR_K8_ASYM, expected_tensors
from nanoqwen_format.constants import INT4_LAYOUTS

from ..errstats import stats_plain
from ..hf import (EXTRA_FILES, IGNORED_TENSOR, SOURCE_DTYPES, Checkpoint, ConvertError, Source, SourceTensor,
                  _read_json, checked_tensor, discover_tensors, model_config_from_hf)
from ..quantize import QuantizationError, dequantize, quantize

IMPORT_METHODS = ("gptq", "awq")


@dataclass
class ImportedTensor:
    """One tensor whose values come from a decoder rather than from plain safetensors bytes."""
    name: str
    shape: tuple[int, ...]
    encoding: str                                   # "gptq 4-bit g128", "awq 4-bit g128", "gguf Q4_K", ...
    dequantize: Callable[[], np.ndarray]            # -> float32 `shape`, the source's exact values
    # -> (qweight, scales) for exact_layout 1, (qweight, scales, zeros) for exact_layout 2 (spec §9.2, §9.5)
    exact: Callable[[], tuple[np.ndarray, ...]] | None = None
    exact_group: int | None = None                  # group size of `exact`
    reason: str = ""                                # why there is no exact repack ("" when there is)
    exact_layout: int = LAYOUT_INT4_ROWMAJOR_K8     # the int4g layout id of `exact`
    rows: Callable[[int, int], np.ndarray] | None = None   # rows [a, b) alone, when the decoder can (GGUF)


@dataclass
class ImportedCheckpoint(Checkpoint):
    imported: dict[str, ImportedTensor] = field(default_factory=dict)
    import_info: dict = field(default_factory=dict)            # format facts, for provenance
    requant_stats: dict[str, dict] = field(default_factory=dict)   # name -> {"snr_db", "rel_rmse"} (filled lazily)
    _cache: tuple[str, np.ndarray] | None = None               # the last dequantized tensor (row-block reads)
    _keep: tuple = ()              # objects that must live as long as the checkpoint (temp metadata dir, GGUF map)

    def _values(self, name: str) -> np.ndarray:
        if self._cache is None or self._cache[0] != name:
            self._cache = None                                  # drop the previous tensor before building the next
            w = self.imported[name].dequantize()
            if w.dtype != np.float32 or tuple(w.shape) != tuple(self.imported[name].shape):
                raise ConvertError(f"tensor {name!r}: decoder gave {w.dtype} {w.shape}, expected float32 "
                                   f"{self.imported[name].shape}")
            self._cache = (name, w)
        return self._cache[1]

    def read_raw_rows(self, name: str, start: int, stop: int) -> np.ndarray:
        t = self.imported.get(name)
        if t is None:
            return super().read_raw_rows(name, start, stop)
        if t.rows is not None:                                  # row blocks: no whole-tensor float32 copy
            return t.rows(start, stop)
        return self._values(name)[start:stop]                  # float32 ("F32" in self.tensors)

    def read_rows(self, name: str, start: int, stop: int) -> np.ndarray:
        if name in self.imported:
            return self.read_raw_rows(name, start, stop)
        return super().read_rows(name, start, stop)

    def exact_int4(self, name: str, layouts=INT4_LAYOUTS) -> tuple[int, int] | None:
        t = self.imported.get(name)
        if t is None or t.exact is None or t.exact_layout not in layouts:
            return None
        return t.exact_group, t.exact_layout

    def int4_tensor(self, name: str, group_size: int, mode: str, layouts=INT4_LAYOUTS
                    ) -> tuple[np.ndarray, ...] | None:
        t = self.imported.get(name)
        if t is None:
            return None
        if self.exact_int4(name, layouts) is not None and t.exact_group == group_size:
            return t.exact()
        w = self._values(name)
        try:
            q, s = quantize(w, group_size, mode)
        except QuantizationError as e:
            raise ConvertError(f"tensor {name!r}: {e}") from None
        self.requant_stats[name] = requant_error(w, q, s, group_size)
        return q, s

    def import_summary(self, specs_int4: dict[str, tuple[int, int]], layouts=INT4_LAYOUTS) -> dict:
        """What the converter reports: counts of exact / requantized int4 tensors (specs_int4: name -> (group size,
        layout id) of the tensors written as int4; layouts: those the exact path could write), reasons, and the
        measured requantization error."""
        exact = [n for n, gl in specs_int4.items() if self.exact_int4(n, layouts) == gl]
        req = [n for n in specs_int4 if n in self.imported and n not in exact]
        reasons: dict[str, int] = {}
        for n in req:
            t = self.imported[n]
            if t.reason:
                r = t.reason
            elif t.exact_layout not in layouts:
                r = (f"asymmetric (zero points), kept exact only in int4 layout {t.exact_layout}, which "
                     f"--int4-layout {'/'.join(map(str, layouts))} excludes")
            else:
                r = f"source group {t.exact_group} != requested group"
            reasons[r] = reasons.get(r, 0) + 1
        out = dict(self.import_info, exact_int4=len(exact),
                   exact_int4_asym=sum(specs_int4[n][1] == LAYOUT_INT4_ROWMAJOR_K8_ASYM for n in exact),
                   requantized_int4=len(req), requantize_reasons=reasons)
        snrs = [self.requant_stats[n]["snr_db"] for n in req if n in self.requant_stats]
        if snrs:
            out["requant_snr_db_min"] = min(snrs)
            out["requant_snr_db_mean"] = float(np.mean([s for s in snrs if math.isfinite(s)] or [math.inf]))
            out["requant_rel_rmse_max"] = max(self.requant_stats[n]["rel_rmse"] for n in req
                                              if n in self.requant_stats)
        return out


def requant_error(w: np.ndarray, q: np.ndarray, s: np.ndarray, group_size: int) -> dict:
    """SNR (dB) and relative RMSE of layout-1 (q, s) against the float32 values w it was quantized from."""
    st = stats_plain(w, dequantize(q, s, group_size), 0.0, 0.0)
    sig, err2 = float(st[0]), float(st[1])
    snr = math.inf if err2 == 0 else (10 * math.log10(sig / err2) if sig > 0 else -math.inf)
    return {"snr_db": snr, "rel_rmse": math.sqrt(err2 / sig) if sig > 0 else (0.0 if err2 == 0 else math.inf)}


def read_tensor(t: SourceTensor) -> np.ndarray:
    """A whole safetensors tensor of any integer/float dtype in its own dtype (I32, F16, BF16 as uint16 bits...)."""
    dt = {"I32": "<i4", "U32": "<u4", "I16": "<i2", "F16": "<f2", "BF16": "<u2", "F32": "<f4", "I64": "<i8",
          "U8": "u1", "I8": "i1"}.get(t.dtype)
    if dt is None:
        raise ConvertError(f"{t.file}: tensor {t.name!r} has dtype {t.dtype}, not readable here")
    a = np.empty(int(np.prod(t.shape, dtype=np.int64)), np.dtype(dt))
    try:
        with open(t.file, "rb") as fh:
            fh.seek(t.offset)
            got = fh.readinto(memoryview(a).cast("B"))
    except OSError as e:
        raise ConvertError(f"{t.file}: cannot read tensor {t.name!r}: {e}") from None
    if got != a.nbytes:
        raise ConvertError(f"{t.file}: tensor {t.name!r} is truncated (read {got} of {a.nbytes} bytes)")
    return a.reshape(t.shape)


def scales_f32(t: SourceTensor) -> np.ndarray:
    """A scales tensor (F16 / BF16 / F32) as float32, exactly."""
    from ..hf import to_float32
    if t.dtype not in SOURCE_DTYPES:
        raise ConvertError(f"{t.file}: scales {t.name!r} have dtype {t.dtype}; expected F16, BF16 or F32")
    return to_float32(read_tensor(t), t.dtype)


def load_quantized(source: Source, cfg: dict) -> ImportedCheckpoint:
    """A GPTQ or AWQ checkpoint directory (config.json with quantization_config)."""
    from . import awq, gptq
    d = source.path
    qc = cfg["quantization_config"]
    if not isinstance(qc, dict):
        raise ConvertError("config.json: quantization_config must be an object")
    method = str(qc.get("quant_method", "")).lower()
    if method not in IMPORT_METHODS:
        raise ConvertError(f"config.json: quantization_config.quant_method {qc.get('quant_method')!r} is not "
                           f"supported (supported: {', '.join(IMPORT_METHODS)}); convert the original "
                           f"bf16/f16/f32 checkpoint")
    fmt = gptq.GPTQParams.from_config(qc) if method == "gptq" else awq.AWQParams.from_config(qc)
    gen = _read_json(d / "generation_config.json", "generation config") \
        if (d / "generation_config.json").exists() else None
    mc = model_config_from_hf({k: v for k, v in cfg.items() if k != "quantization_config"},
                              gen if isinstance(gen, dict) else None)
    found = discover_tensors(d)
    want = expected_tensors(mc)
    tensors: dict[str, SourceTensor] = {}
    imported: dict[str, ImportedTensor] = {}
    used: set[str] = set()
    for name, shape in want.items():
        prefix = name[:-len(".weight")] if name.endswith(".weight") else None
        if name not in found and prefix is not None and prefix + ".qweight" in found:
            parts = {p: found[prefix + "." + p] for p in fmt.PARTS if prefix + "." + p in found}
            imp = fmt.open_linear(name, tuple(shape), parts)
            imported[name] = imp
            used.update(t.name for t in parts.values())
            tensors[name] = SourceTensor(name, "F32", tuple(shape), parts["qweight"].file, 0,
                                         sum(t.nbytes for t in parts.values()))
            continue
        tensors[name] = checked_tensor(d, found, name, shape,
                                       f" (neither {name!r} nor its {method} {prefix}.qweight)")
    for n, t in found.items():
        if n in want or n in used or IGNORED_TENSOR.match(n) or (mc.tied_embeddings and n == "lm_head.weight"):
            continue
        # quantizers write a zero bias buffer for linears that have none (e.g. o_proj): harmless when all zero
        if n.endswith(".bias") and n[:-len(".bias")] + ".weight" in imported and t.dtype in SOURCE_DTYPES:
            from ..hf import to_float32
            if not np.any(to_float32(read_tensor(t), t.dtype)):
                continue
            raise ConvertError(f"{d}: tensor {n!r} is a non-zero bias the {mc.arch} architecture does not have")
        raise ConvertError(f"{d}: unexpected tensor {n!r} for a {method} {mc.arch} checkpoint; unsupported variant?")
    extras = {f: d / f for f in EXTRA_FILES if (d / f).exists()}
    info = {"format": method, **fmt.describe()}
    return ImportedCheckpoint(source=source, hf_config=cfg, config=mc, tensors=tensors, extras=extras,
                              imported=imported, import_info=info)
