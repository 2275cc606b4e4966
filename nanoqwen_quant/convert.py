"""nanoqwen-convert: Hugging Face checkpoint (dir or hub id) → .nanoqwen file.

Defaults: q/k/v/o/gate/up/down → int4 g128 rtn (layout 1); embeddings, norms, biases, lm_head → f16. An already
quantized source (GPTQ, AWQ) keeps its own codes where an int4 layout holds them exactly: symmetric ones in layout
1, asymmetric ones (AWQ, GPTQ sym: false) in layout 2 (zero points; --int4-layout 1 requantizes those into layout 1
instead, for a runtime that runs layout 1 only).
Streams one tensor at a time, int4 tensors in row blocks (peak RSS ≈ the largest f16 tensor + one block).
The output is written to a temp file beside OUT and renamed on success (NanoqwenWriter), so an error, Ctrl-C,
SIGTERM or SIGHUP leaves nothing at OUT; temp files that killed converters left beside OUT are removed on the next
run. OUT is refused (check_output) when it is or lies inside the source, is not a regular file, or exists
without --force.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import signal
import stat
import sys
import threading
from pathlib import Path

import click
import numpy as np

from nanoqwen_format import (LAYOUT_INT4_ROWMAJOR_K8, BlobKind, DType, NanoqwenFormatError, NanoqwenWriter,
                             TensorSpec, expected_tensors)
from nanoqwen_format.constants import INT4_LAYOUTS
from nanoqwen_format.writer import file_kind, remove_stale_temp_files

from .hf import EXTRA_FILES, Checkpoint, ConvertError
from .load import load_checkpoint
from .cast import to_f16_bits
from .one_line_errors import OneLineErrorCommand
from .quantize import K_MULTIPLE, QuantizationError, can_quantize, check_shape, quantize
from .sources import ImportedCheckpoint

INT4_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
GROUP_SIZES = (32, 64, 128)                 # what the CLI offers (the format also allows 256)
MODES = ("rtn", "mse", "gptq")              # gptq: calibration forward pass + error feedback (nanoqwen_quant.gptq)
#: --int4-layout: the int4g layouts the converter may write. "auto": layout 1 for what it quantizes itself and for
#: symmetric sources, layout 2 for asymmetric sources' exact codes; "1": layout 1 only (asymmetric sources are
#: requantized, as before layout 2 existed: for runtimes that run layout 1 only)
INT4_LAYOUT_CHOICES = {"auto": INT4_LAYOUTS, "1": (LAYOUT_INT4_ROWMAJOR_K8,)}
BLOCK_ELEMS = 8 * 1024 * 1024               # float32 elements per row block (32 MiB) read + quantized at once
BUFFER_REUSE_BYTES = 64 * 1024 * 1024      # keep f16 buffers this large for the next tensor of the same shape
UNWIND_SIGNALS = (signal.SIGTERM, signal.SIGHUP)   # handled like Ctrl-C: the temp file goes, exit 128 + signum
EXIT_SIGNAL_BASE = 128                      # the shell's convention: a command ended by signal N exits 128 + N


class OutputRefused(ConvertError):
    """-o names a path the converter will not write: the source itself or a path inside it, something that is
    not a regular file, an existing file without --force, or a file/directory it cannot write."""


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived: unwinds like KeyboardInterrupt (the writer removes its temp file)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def unwind_on_signals(signals=UNWIND_SIGNALS):
    """Raise Terminated in the main thread on each of `signals` whose handler is the default (a signal the
    caller ignores, such as SIGHUP under nohup, stays ignored). A second signal while unwinding is ignored so
    that the cleanup runs to the end. Restores the previous handlers on exit."""
    fired = []

    def handler(signum, frame):
        if not fired:
            fired.append(signum)
            raise Terminated(signum)

    # Once a signal has fired, objects that the unwinding tears down half-built (numba's llvmlite refs interrupted
    # in their constructor: "Exception ignored in ObjectRef.__del__ ... AttributeError") would print a traceback
    # beside the one-line error; they are the unwinding's debris, so they stay quiet. Before a signal, as before.
    prev_hook = sys.unraisablehook

    def quiet_after_signal(unraisable):
        if not fired:
            prev_hook(unraisable)

    old = {}
    if threading.current_thread() is threading.main_thread():     # only the main thread may set handlers
        for s in signals:
            if signal.getsignal(s) is signal.SIG_DFL:
                old[s] = signal.signal(s, handler)
        sys.unraisablehook = quiet_after_signal
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if sys.unraisablehook is quiet_after_signal:
            sys.unraisablehook = prev_hook


def _is_within(path: str, root: str) -> bool:
    return path == root or os.path.commonpath([path, root]) == root


def check_output(out, *, force: bool = False) -> Path:
    """Refuse (OutputRefused) an output path that is not a regular file, that exists without `force`, that is
    read-only, or whose directory is missing or not writable. Returns the path. Touches nothing."""
    shown = os.fspath(out)
    out = Path(out)
    if not out.name or shown.endswith(os.sep):
        raise OutputRefused(f"output {shown!r} is a directory; give a file name such as model.nanoqwen")
    parent = out.parent
    if not parent.exists():
        raise OutputRefused(f"output directory {str(parent)!r} does not exist")
    if not parent.is_dir():
        raise OutputRefused(f"output {shown!r}: {str(parent)!r} is not a directory")
    try:
        st = os.lstat(out)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise OutputRefused(f"output {shown!r}: {e.strerror or e}") from None
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            raise OutputRefused(f"output {shown!r} is a symbolic link (to {os.readlink(out)!r}); refusing to replace "
                                f"it: give the real path, or remove the link first")
        if stat.S_ISDIR(st.st_mode):
            raise OutputRefused(f"output {shown!r} is a directory; give a file name such as model.nanoqwen")
        if not stat.S_ISREG(st.st_mode):
            raise OutputRefused(f"output {shown!r} is {file_kind(st.st_mode)}, not a regular file; refusing to "
                                f"replace it")
        if not force:
            raise OutputRefused(f"output {shown!r} already exists; pass --force to replace it")
        if not st.st_mode & 0o222 or not os.access(out, os.W_OK):
            raise OutputRefused(f"output {shown!r} is read-only (mode {stat.S_IMODE(st.st_mode):04o}); --force "
                                f"replaces only a file you may write: make it writable or remove it first")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputRefused(f"output directory {str(parent)!r} is not writable")
    return out


def check_output_not_source(out, sources) -> None:
    """Refuse (OutputRefused) an output that is one of `sources` (files or directories) or lies inside a
    source directory, comparing real paths (symbolic links resolved: of the output's directory, and of the
    output itself when it is a link)."""
    out = Path(out)
    here = os.path.join(os.path.realpath(out.parent), out.name)
    targets = {here: f"output {str(out)!r}"}
    if os.path.islink(out):
        targets[os.path.realpath(out)] = f"output {str(out)!r} (a link to {os.path.realpath(out)})"
    for src in sources:
        src = Path(src)
        if not src.exists():
            continue
        real = os.path.realpath(src)
        for t, what in targets.items():
            if t == real:
                raise OutputRefused(f"{what} is the source {str(src)!r} ({real}); refusing to overwrite the "
                                    f"checkpoint being converted")
            if src.is_dir() and _is_within(t, real):
                raise OutputRefused(f"{what} lies inside the source directory {str(src)!r} ({real}); write it "
                                    f"elsewhere")


def _source_paths(ckpt: Checkpoint) -> list[Path]:
    """What converting `ckpt` reads: its directory, every weight file and every metadata file."""
    return [ckpt.source.path, *sorted({t.file for t in ckpt.tensors.values()}), *ckpt.extras.values()]


def converter_version() -> str:
    try:
        from importlib.metadata import version
        return version("nanoqwen")
    except Exception:  # pragma: no cover - running from a source tree without install
        return "0+unknown"


def is_int4_linear(name: str) -> bool:
    parts = name.split(".")
    return len(parts) >= 2 and parts[-1] == "weight" and parts[-2] in INT4_LINEARS


def group_size_that_fits(shapes) -> int | None:
    """The largest group size the CLI offers that int4 can use for every (N, K) shape, or None."""
    return next((g for g in sorted(GROUP_SIZES, reverse=True) if all(can_quantize(sh, g) for sh in shapes)), None)


def plan_tensors(ckpt: Checkpoint, *, quant: str, group_size: int, lm_head: str, fallback_f16: bool,
                 layouts=INT4_LAYOUTS) -> list[TensorSpec]:
    """TensorSpec per tensor, in expected_tensors order. An int4 tensor the source already stores as an int4
    layout in disguise (GPTQ / AWQ 4-bit: symmetric as layout 1, asymmetric as layout 2, among `layouts`) keeps
    the source's group size, whatever --group-size says, and takes that layout: repacking is lossless,
    requantizing to another group only adds error (so --group-size's shape rule does not apply to it). Other
    shapes that int4 cannot hold at group_size raise ConvertError, or stay f16 with fallback_f16."""
    specs = []
    for name, shape in expected_tensors(ckpt.config).items():
        want_int4 = quant == "int4" and (is_int4_linear(name) or (name == "lm_head.weight" and lm_head == "int4"))
        exact = ckpt.exact_int4(name, layouts) if want_int4 else None
        if exact:
            specs.append(TensorSpec(name, DType.INT4G, shape, group_size=exact[0], layout_id=exact[1]))
            continue
        if want_int4 and not can_quantize(shape, group_size):
            if not fallback_f16:
                try:
                    check_shape(shape, group_size, name)
                except QuantizationError as e:
                    g = group_size_that_fits([shape])
                    hint = f"--group-size {g} or " if g else ""
                    raise ConvertError(f"{e}; use {hint}--fallback-f16 (keeps such tensors in f16)") from None
            want_int4 = False
        if want_int4:
            specs.append(TensorSpec(name, DType.INT4G, shape, group_size=group_size))
        else:
            specs.append(TensorSpec(name, DType.F16, shape))
    return specs


def _rows_per_block(shape: tuple[int, ...]) -> int:
    per_row = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
    return max(1, BLOCK_ELEMS // max(per_row, 1))


def _fill_f16(ckpt: Checkpoint, name: str, a: int, b: int, out_rows: np.ndarray) -> None:
    """Rows [a, b) of a source tensor → out_rows float16 (b - a, ...), refusing values f16 cannot hold."""
    t = ckpt.tensors[name]
    raw = ckpt.read_raw_rows(name, a, b)
    if t.dtype == "F16":
        out_rows[...] = raw
        bad = int(np.count_nonzero(~np.isfinite(raw)))
    else:
        _, bad = to_f16_bits(raw, out=out_rows.view(np.uint16))      # bf16 bits or float32 → f16, RNE
    if bad:
        raise ConvertError(f"tensor {name!r}: {bad} values are non-finite or outside the float16 range "
                           f"(|w| >= 65520); cannot store as f16")


def _provenance_bytes(provenance: dict) -> bytes:
    return json.dumps(provenance, indent=1, sort_keys=True).encode()


def _read_extra(path: Path) -> bytes:
    """A checkpoint's side file (tokenizer, configs, template) as bytes; a directory or an unreadable file is a
    one-line ConvertError."""
    try:
        return path.read_bytes()
    except OSError as e:
        raise ConvertError(f"{path}: cannot read: {e.strerror or e}") from None


def _blobs(ckpt: Checkpoint, provenance: dict) -> list[tuple[BlobKind, bytes]]:
    out = []
    tok = ckpt.extras.get("tokenizer.json")
    if tok is not None:
        data = _read_extra(tok)
        try:
            json.loads(data)
        except ValueError as e:
            raise ConvertError(f"{tok}: not valid JSON ({e})") from None
        out.append((BlobKind.TOKENIZER_JSON, data))
    tcfg_path = ckpt.extras.get("tokenizer_config.json")
    tcfg_bytes = _read_extra(tcfg_path) if tcfg_path is not None else None
    tmpl = None
    jinja = ckpt.dir / "chat_template.jinja"
    if jinja.exists():   # transformers >= 4.50 saves it apart, and a template file takes priority over the config's
        try:
            tmpl = _read_extra(jinja).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConvertError(f"{jinja}: not valid UTF-8 ({e})") from None
    if tcfg_bytes is not None:
        try:
            tcfg = json.loads(tcfg_bytes.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise ConvertError(f"{tcfg_path}: not valid JSON ({e})") from None
        if tmpl is None:
            tmpl = tcfg.get("chat_template") if isinstance(tcfg, dict) else None
            if isinstance(tmpl, list):   # named templates: [{"name": "default", "template": ...}, ...]
                named = {t.get("name"): t.get("template") for t in tmpl if isinstance(t, dict)}
                tmpl = named.get("default")
    if isinstance(tmpl, str):
        out.append((BlobKind.CHAT_TEMPLATE, tmpl.encode("utf-8")))
    gen = ckpt.extras.get("generation_config.json")
    if gen is not None:
        out.append((BlobKind.GENERATION_CONFIG, _read_extra(gen)))
    out.append((BlobKind.PROVENANCE, _provenance_bytes(provenance)))
    if tcfg_bytes is not None:
        out.append((BlobKind.TOKENIZER_CONFIG, tcfg_bytes))
    return out


def _progress(total: int, enabled: bool):
    from tqdm import tqdm
    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="convert", dynamic_ncols=True,
                disable=not (enabled and sys.stderr.isatty()), file=sys.stderr)


def convert_checkpoint(src, out, *, quant: str = "int4", group_size: int = 128, mode: str = "rtn",
                       lm_head: str = "fp16", revision: str | None = None, progress: bool = False,
                       fallback_f16: bool = False, force: bool = False, log=None, calib_text: str | None = None,
                       hessians: dict | None = None, int4_layout: str = "auto") -> Path:
    """Convert a Hugging Face checkpoint (local dir or hub repo id) to a .nanoqwen file at `out`; returns out.
    Raises ConvertError (one-line message) for anything the user must fix; OutputRefused (before anything is
    read or written) for an output path check_output / check_output_not_source refuse. An existing regular
    file at `out` is replaced only with force=True. log(message): one line each for what the user should know
    (stale temp files removed; with progress, linears kept f16 and what an imported GPTQ / AWQ / GGUF source
    became). mode gptq: calibrates on calib_text (default: nanoqwen_quant.calibrate's), or uses `hessians`
    (weight name → H) from calibration_hessians. int4_layout (INT4_LAYOUT_CHOICES): "auto" keeps an asymmetric
    source's codes exactly in layout 2, "1" requantizes them into layout 1."""
    if quant not in ("int4", "none"):
        raise ConvertError(f"quant: expected 'int4' or 'none', found {quant!r}")
    if mode not in MODES:
        raise ConvertError(f"mode: expected one of {MODES}, found {mode!r}")
    if lm_head not in ("fp16", "int4"):
        raise ConvertError(f"lm_head: expected 'fp16' or 'int4', found {lm_head!r}")
    if quant == "int4" and group_size not in GROUP_SIZES:
        raise ConvertError(f"group_size: expected one of {GROUP_SIZES}, found {group_size!r}")
    if int4_layout not in INT4_LAYOUT_CHOICES:
        raise ConvertError(f"int4_layout: expected one of {tuple(INT4_LAYOUT_CHOICES)}, found {int4_layout!r}")
    layouts = INT4_LAYOUT_CHOICES[int4_layout]
    check_output_not_source(out, [Path(src).expanduser()])
    out = check_output(out, force=force)
    ckpt = load_checkpoint(src, revision)
    check_output_not_source(out, _source_paths(ckpt))      # a hub snapshot, files that are links elsewhere
    specs = plan_tensors(ckpt, quant=quant, group_size=group_size, lm_head=lm_head, fallback_f16=fallback_f16,
                         layouts=layouts)
    n_int4 = sum(s.dtype == DType.INT4G for s in specs)
    provenance = {
        "source": ckpt.source.source,
        "source_is_hub": ckpt.source.is_hub,
        "revision": ckpt.source.revision,
        "commit": ckpt.source.commit,
        "converter": "nanoqwen-convert",
        "converter_version": converter_version(),
        "quantizer": {"quant": quant, "group_size": group_size if n_int4 else None, "mode": mode if n_int4 else None,
                      "lm_head": "int4" if any(s.name == "lm_head.weight" and s.dtype == DType.INT4G for s in specs)
                      else "fp16", "int4_layout": int4_layout if n_int4 else None, "fallback_f16": [s.name for s in specs if s.dtype == DType.F16
                                                    and is_int4_linear(s.name)] if quant == "int4" else []},
        "source_dtypes": sorted({t.dtype for t in ckpt.tensors.values()}),
        "architecture": (ckpt.hf_config.get("architectures") or [ckpt.config.arch])[0],
        "date": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "source_files": {p.name: p.stat().st_size for p in sorted({t.file for t in ckpt.tensors.values()})},
        "missing_metadata": [f for f in EXTRA_FILES if f not in ckpt.extras],
    }
    blobs = _blobs(ckpt, provenance)           # the provenance blob is encoded again after the tensors (import)
    removed = remove_stale_temp_files(out.parent)
    if removed and log is not None:
        log(f"removed {len(removed)} temp file(s) left by converters that no longer run: "
            + ", ".join(f"{p} ({n / 2**20:.1f} MiB)" for p, n in removed))
    if n_int4 and mode == "gptq" and hessians is None:      # hessians given: calibration done by the caller
        from .calibrate import calibration_hessians, calibration_workdir, check_hessians_fit
        check_hessians_fit(ckpt.config)                      # refuse before converting anything
        with calibration_workdir(out) as td:                # the f16 copy is as large as the source: same disk
            f16 = convert_checkpoint(src, Path(td) / "calibration-f16.nanoqwen", quant="none", revision=revision)
            hessians = calibration_hessians(f16, calib_text)
    bar = _progress(ckpt.source_nbytes, progress)
    try:
        with NanoqwenWriter(out, ckpt.config, specs, [k for k, _ in blobs]) as w:
            bufs: dict = {}
            for spec in specs:
                _convert_tensor(ckpt, spec, w, mode, bar, bufs, hessians, layouts)
            bufs.clear()
            if isinstance(ckpt, ImportedCheckpoint):     # its requantization errors are known only now
                provenance["import"] = ckpt.import_summary(
                    {s.name: (s.group_size, s.layout_id) for s in specs if s.dtype == DType.INT4G}, layouts)
                blobs = [(k, _provenance_bytes(provenance) if k == BlobKind.PROVENANCE else d) for k, d in blobs]
            for kind, data in blobs:
                w.write_blob(kind, data)
    except NanoqwenFormatError as e:
        raise ConvertError(f"writing {out}: {e}") from None
    except QuantizationError as e:
        raise ConvertError(str(e)) from None
    except OSError as e:
        raise ConvertError(f"writing {out}: {e.strerror or e}") from None
    finally:
        bar.close()
    if progress and log is not None:
        for line in conversion_notes(ckpt, specs, quant, mode, provenance.get("import"), group_size):
            log(line)
    return out


def fallback_note(fell: list[TensorSpec], n_linears: int, group_size: int) -> str:
    """The line saying which linears --fallback-f16 kept in f16 and why: K not a multiple of 32 (no group size
    can hold them) or only not of the group size asked for (then the largest group size that holds them all)."""
    ks = sorted({s.shape[1] for s in fell})
    why = []
    if bad32 := [k for k in ks if k % K_MULTIPLE]:
        why.append(f"in_features K = {', '.join(map(str, bad32))} is not a multiple of {K_MULTIPLE}, which int4 "
                   f"needs at every group size")
    if badg := [k for k in ks if not k % K_MULTIPLE]:
        why.append(f"in_features K = {', '.join(map(str, badg))} is not a multiple of the group size {group_size}")
    g = group_size_that_fits([s.shape for s in fell])
    hint = f"; --group-size {g} stores them in int4" if g else ""
    return (f"note: {len(fell)} of {n_linears} linear tensors stay f16 although int4 was asked for "
            f"(--fallback-f16): {'; '.join(why)}{hint}; e.g. {fell[0].name}")


def conversion_notes(ckpt: Checkpoint, specs: list[TensorSpec], quant: str, mode: str = "rtn",
                     import_info: dict | None = None, group_size: int = 128) -> list[str]:
    """Lines for the user: linears that stayed f16 although int4 was asked for, and what an imported
    (already quantized) source became: exact repacks vs requantized tensors with their measured error."""
    lines = []
    fell = [s for s in specs if quant == "int4" and s.dtype == DType.F16 and is_int4_linear(s.name)]
    if fell:
        lines.append(fallback_note(fell, sum(is_int4_linear(s.name) for s in specs), group_size))
    if import_info is not None:                   # provenance["import"] of an already-quantized source
        info = import_info
        groups = sorted({s.group_size for s in specs if s.dtype == DType.INT4G and ckpt.exact_int4(s.name)})
        asym = info.get("exact_int4_asym", 0)
        lines.append(f"import: {info['format']} source: {info['exact_int4']} int4 tensors repacked losslessly"
                     + (f" (group size {', '.join(map(str, groups))} from the source)" if groups else "")
                     + (f", {asym} of them in the asymmetric layout 2 (the source's zero points)" if asym else "")
                     + f", {info['requantized_int4']} requantized by our quantizer")
        if info.get("tokenizer") not in (None, "rebuilt"):
            lines.append(f"import: tokenizer not rebuilt from the GGUF metadata: {info['tokenizer']}")
        for reason, n in info["requantize_reasons"].items():
            lines.append(f"import: requantized {n}: {reason}")
        if "requant_snr_db_min" in info:
            lines.append(f"import: requantization error vs the source's dequantized weights: SNR min "
                         f"{info['requant_snr_db_min']:.2f} dB, mean {info['requant_snr_db_mean']:.2f} dB, "
                         f"max rel-RMSE {info['requant_rel_rmse_max']:.4g} (nanoqwen-verify --source gives it "
                         f"per tensor)")
            # bench/RESULTS.md "Imported checkpoints": mse gives 0.47-0.95 of rtn's KL on requantized GPTQ / AWQ
            # sources; on GGUF sources (other block sizes and grids) it measured worse perplexity than rtn on both
            # trained checkpoints, so no hint there
            if mode == "rtn" and info["format"] in ("gptq", "awq"):
                lines.append("import: hint: --mode mse requantizes a GPTQ / AWQ source with less loss (measured: "
                             "0.47-0.95 of rtn's KL against the source)")
    return lines


def _convert_tensor(ckpt: Checkpoint, spec: TensorSpec, w: NanoqwenWriter, mode: str, bar, bufs: dict,
                    hessians: dict | None = None, layouts=INT4_LAYOUTS) -> None:
    """Read one source tensor in row blocks and write it as spec says. bufs: reusable f16 buffers by shape.
    hessians (mode gptq): input Hessian by weight name; a tensor without one (lm_head) is quantized with mse.
    layouts: the int4g layouts an exact import may use (plan_tensors chose spec's)."""
    t = ckpt.tensors[spec.name]
    rows = t.shape[0]
    step = _rows_per_block(t.shape)
    qmode = "mse" if mode == "gptq" else mode            # gptq without a Hessian for this tensor: mse scales
    h = hessians.get(spec.name) if hessians is not None and spec.dtype == DType.INT4G else None
    # an already-quantized source (sources/): its exact repack, or its own requantization (with the error recorded)
    # unless a Hessian asks for GPTQ, which the generic path below runs on the exact dequantized rows
    if spec.dtype == DType.INT4G and (h is None or ckpt.exact_int4(spec.name, layouts) == (spec.group_size,
                                                                                          spec.layout_id)) \
            and (packed := ckpt.int4_tensor(spec.name, spec.group_size, qmode, layouts)) is not None:
        w.write_int4(spec.name, *packed)
        bar.update(t.nbytes)
    elif spec.dtype == DType.INT4G:
        n, k = spec.shape
        g = spec.group_size
        qweight = np.empty((n, k // 8), np.uint32)       # (N, K/8) packed codes
        scales = np.empty((n, k // g), np.float16)        # (N, K/g)
        prepared = None
        if h is not None:
            from .gptq import gptq_prepare
            prepared = gptq_prepare(h)                    # once per tensor; rows are independent in GPTQ
        for a in range(0, rows, step):
            b = min(rows, a + step)
            block = ckpt.read_rows(spec.name, a, b)
            try:
                if prepared is not None:
                    from .gptq import GPTQ_SCALE_MODE, gptq_quantize
                    qweight[a:b], scales[a:b] = gptq_quantize(block, h, g, GPTQ_SCALE_MODE, prepared=prepared)
                else:
                    quantize(block, g, qmode, out=(qweight[a:b], scales[a:b]))
            except QuantizationError as e:
                raise QuantizationError(f"tensor {spec.name!r} rows {a}..{b}: {e}") from None
            bar.update((b - a) * t.row_bytes)
        w.write_int4(spec.name, qweight, scales)
    else:
        arr = bufs.pop(spec.shape, None)                  # reuse the embed buffer for lm_head: fewer page faults
        if arr is None:
            arr = np.empty(spec.shape, np.float16)
        for a in range(0, rows, step):
            b = min(rows, a + step)
            _fill_f16(ckpt, spec.name, a, b, arr[a:b])
            bar.update((b - a) * t.row_bytes)
        w.write_tensor(spec.name, arr)
        if arr.nbytes >= BUFFER_REUSE_BYTES:
            bufs[spec.shape] = arr


def _inode(path) -> tuple | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _outcome(out, before) -> str:
    """What an interrupted run left at OUT: the rename is the commit, so a new inode there is a complete file
    (a signal can land between the rename and the return)."""
    now = _inode(out)
    return "no output written" if now is None or now == before else f"{out} was written completely before it"


def fail(msg: str, code: int = 2) -> None:
    click.echo(f"nanoqwen-convert: error: {msg}", err=True)
    sys.exit(code)


@click.command(name="nanoqwen-convert", cls=OneLineErrorCommand,
               context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("src")
@click.option("-o", "--output", "out", required=True, type=click.Path(),
              help="output .nanoqwen file (written atomically); refused when it is or lies inside SRC, or is not "
                   "a regular file")
@click.option("--force", is_flag=True, help="replace an existing OUT (a regular file you may write; never a link, "
              "directory, device or SRC itself)")
@click.option("--quant", type=click.Choice(["int4", "none"]), default="int4", show_default=True,
              help="int4: linear layers in INT4; none: f16 everywhere")
@click.option("--group-size", type=click.Choice([str(g) for g in GROUP_SIZES]), default="128", show_default=True)
@click.option("--mode", type=click.Choice(list(MODES)), default="rtn", show_default=True,
              help="rtn: absmax scale; mse: per-group clipping search (slower, lower error); gptq: mse scales, "
              "codes chosen with a calibration text's input statistics, act-order (slowest; prints its expected time)")
@click.option("--calib-text", type=click.Path(dir_okay=False, exists=True), default=None,
              help="--mode gptq: calibration text file (default: Python standard-library files)")
@click.option("--lm-head", type=click.Choice(["fp16", "int4"]), default="fp16", show_default=True)
@click.option("--int4-layout", type=click.Choice(list(INT4_LAYOUT_CHOICES)), default="auto", show_default=True,
              help="auto: an asymmetric GPTQ / AWQ source keeps its codes and zero points exactly (int4 layout 2); "
              "1: requantize such sources into the symmetric layout 1 (for a runtime that reads layout 1 only)")
@click.option("--revision", default=None, help="hub revision (branch, tag or commit) when SRC is a repo id")
@click.option("--fallback-f16", is_flag=True, help="store linears whose shape int4 cannot hold as f16 "
              "instead of refusing")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="quantizer threads (default: all cores)")
@click.option("-q", "--quiet", is_flag=True, help="no progress bar or summary")
def main(src, out, force, quant, group_size, mode, lm_head, revision, fallback_f16, threads, quiet, calib_text,
         int4_layout):
    """Convert a Qwen2/Llama checkpoint SRC to OUT.nanoqwen. SRC: a Hugging Face directory or hub repo id
    (bf16/f16/f32; GPTQ / AWQ 4-bit: repacked losslessly, symmetric ones into int4 layout 1, asymmetric ones into
    layout 2, act-order ones requantized), or a GGUF file / Ollama blob (requantized).

    \b
    Exit status: 0 written; 2 refused (bad SRC, bad OUT, a checkpoint that cannot be converted); 3 internal
    error; 130 / 143 / 129 after SIGINT / SIGTERM / SIGHUP (the temp file is removed, OUT is untouched)."""
    import time
    from .quantize import set_threads
    t0 = time.perf_counter()
    before = _inode(out)
    try:
        with unwind_on_signals():
            set_threads(threads)
            text = None
            if calib_text is not None:
                try:
                    text = Path(calib_text).read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError) as e:
                    raise ConvertError(f"--calib-text {calib_text}: {getattr(e, 'strerror', None) or e}") from None
            if mode == "gptq" and quant == "int4" and not quiet:
                from .calibrate import gptq_time_estimate
                click.echo(gptq_time_estimate(src, revision, threads), err=True)
            path = convert_checkpoint(src, out, quant=quant, group_size=int(group_size), mode=mode,
                                      lm_head=lm_head, revision=revision, progress=not quiet,
                                      fallback_f16=fallback_f16, force=force, calib_text=text,
                                      int4_layout=int4_layout,
                                      log=lambda m: click.echo(f"nanoqwen-convert: {m}", err=True))
    except KeyboardInterrupt:
        fail(f"interrupted; {_outcome(out, before)}", EXIT_SIGNAL_BASE + signal.SIGINT)
    except Terminated as e:
        fail(f"terminated by {signal.Signals(e.signum).name}; {_outcome(out, before)}", EXIT_SIGNAL_BASE + e.signum)
    except ConvertError as e:
        fail(str(e))
    except MemoryError:
        fail("out of memory")
    if not quiet:
        from nanoqwen_format import open_file
        with open_file(path, verify_checksums=False) as f:
            missing = (f.blob_json(BlobKind.PROVENANCE) or {}).get("missing_metadata") or []
            tied = f.config.tied_embeddings
        if lm_head == "int4" and quant == "int4" and tied:
            click.echo("warning: --lm-head int4 has no effect: embeddings are tied (no lm_head tensor); the shared "
                       "embedding stays f16", err=True)
        if missing:
            need = " (nanoqwen needs tokenizer.json to tokenize)" if "tokenizer.json" in missing else ""
            click.echo(f"warning: {src} has no {', '.join(missing)}; the file carries none{need}", err=True)
        size = os.path.getsize(path)
        click.echo(f"wrote {path} ({size / 2**20:.1f} MiB) in {time.perf_counter() - t0:.1f} s", err=True)


if __name__ == "__main__":  # pragma: no cover
    main()
