"""Figures of `nanoqwen bench` results, drawn from the result JSON alone (so a GPU run recorded elsewhere can be
plotted anywhere): `plot(result, "out.png")`, `nanoqwen bench --plot out.png`, or
`python -m nanoqwen_bench.plot RUN.json [RUN2.json ...] -o out.png`.

Panels, each drawn only when the result holds its numbers:
* decode time per token: the Engine's ms/token beside the torch peers' chains (same GPU, same shapes), with the
  floor the read ceiling allows (bytes per token / read bandwidth);
* bandwidth: GB/s achieved by the Engine and by each peer against the read-only ceiling and the copy bandwidth,
  each bar labelled with its MBU (achieved / read ceiling);
* ms/token against decode context length, when several runs at different prompt lengths are given (one run of
  the bench measures one context length).
Throughput against concurrency is not drawn: the server generates one sequence at a time and the bench does not
measure concurrency.

matplotlib is optional (`pip install 'nanoqwen[plot]'`); without it PlotError says so in one line. The figure is
written to a temp file beside the target and renamed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Mapping, Sequence

from .timing import BenchError

__all__ = ["PlotError", "FORMATS", "plot", "require_matplotlib", "check_output_path", "main"]

#: output formats, by file extension (what matplotlib's Agg/vector backends write without extra software)
FORMATS = ("png", "svg", "pdf")
#: the peers' chains as the bench names them, with their legend labels
PEER_LABELS = (("torch_int4", "torch int4\nGEMV chain"), ("torch_int4_f16_lm_head", "torch int4,\nfp16 lm_head"),
               ("cublas_fp16", "cuBLAS fp16\nGEMV chain"))
ENGINE_LABEL = "nanoqwen\ndecode"


class PlotError(BenchError):
    """The figure cannot be drawn (matplotlib missing, a result without numbers, a bad output path)."""


def require_matplotlib():
    """The matplotlib module, or PlotError with the install command."""
    try:
        import matplotlib
        return matplotlib
    except ImportError:
        raise PlotError("matplotlib is not installed: pip install 'nanoqwen[plot]' (or matplotlib) to draw "
                        "--plot figures") from None


def check_output_path(path: str) -> str:
    """The output format for `path` (its extension), or PlotError; checked before a long bench run."""
    ext = os.path.splitext(os.fspath(path))[1].lower().lstrip(".")
    if ext not in FORMATS:
        raise PlotError(f"{path}: the plot file must end in one of .{', .'.join(FORMATS)}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise PlotError(f"{path}: no such folder {folder}")
    return ext


def _number(d: Mapping, key: str) -> float | None:
    v = d.get(key) if isinstance(d, Mapping) else None
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _bars(result: Mapping) -> tuple[list[str], list[float | None], list[float | None]]:
    """(labels, ms, GB/s) of the Engine (if measured) and each measured peer, in a fixed order."""
    labels, ms, gbps = [], [], []
    eng = result.get("engine")
    if isinstance(eng, Mapping) and _number(eng, "ms_per_token") is not None:
        labels.append(ENGINE_LABEL)
        ms.append(_number(eng, "ms_per_token"))
        gbps.append(_number(eng, "achieved_GBps"))
    peers = result.get("peers") if isinstance(result.get("peers"), Mapping) else {}
    for key, label in PEER_LABELS:
        p = peers.get(key)
        if isinstance(p, Mapping) and _number(p, "median_ms") is not None:
            labels.append(label)
            ms.append(_number(p, "median_ms"))
            gbps.append(_number(p, "GBps"))
    return labels, ms, gbps


def _context_points(results: Sequence[Mapping]) -> list[tuple[float, float]]:
    """(mean decode context, ms/token) of every run that has both, sorted by context."""
    pts = []
    for r in results:
        eng = r.get("engine")
        if isinstance(eng, Mapping):
            c, ms = _number(eng, "mean_context"), _number(eng, "ms_per_token")
            if c is not None and ms is not None:
                pts.append((c, ms))
    return sorted(pts)


def _title(result: Mapping) -> str:
    parts = [str(result.get("gpu") or "unknown device")]
    eng = result.get("engine")
    if isinstance(eng, Mapping) and "prompt_tokens" in eng:
        parts.append(f"{eng['prompt_tokens']}-token prompt, {eng.get('new_tokens', '?')} new tokens")
    parts.append(f"{result.get('date_utc', '?')} UTC, commit {result.get('commit', '?')}")
    return "nanoqwen bench: " + " · ".join(parts)


def plot(result: Mapping | Sequence[Mapping], path: str) -> list[str]:
    """Draw the figures of one bench result (a run_bench dict) or of several runs (a list: the first is the one
    whose bars are drawn; all of them give the ms/token-vs-context curve) into `path` (.png/.svg/.pdf), written
    atomically. Returns the titles of the panels drawn. PlotError when nothing can be drawn."""
    runs = list(result) if isinstance(result, Sequence) and not isinstance(result, (str, bytes)) else [result]
    if not runs or not all(isinstance(r, Mapping) for r in runs):
        raise PlotError("a bench result is a JSON object (or a list of them), as `nanoqwen bench --json` writes")
    fmt = check_output_path(path)
    require_matplotlib()
    from matplotlib.figure import Figure

    main_run = runs[0]
    labels, ms, gbps = _bars(main_run)
    bw = main_run.get("bandwidth") if isinstance(main_run.get("bandwidth"), Mapping) else {}
    read, copy = _number(bw, "read_GBps"), _number(bw, "copy_GBps")
    ctx = _context_points(runs)
    panels = []
    if labels:
        panels.append("decode time per token")
    if any(g is not None for g in gbps):
        panels.append("bandwidth and MBU")
    if len({c for c, _ in ctx}) >= 2:
        panels.append("ms/token against context length")
    if not panels:
        raise PlotError("the result has no engine or peer timings to plot (expected 'engine.ms_per_token' or "
                        "'peers.<chain>.median_ms', as `nanoqwen bench --json` writes)")

    fig = Figure(figsize=(5.2 * len(panels), 4.6), layout="constrained")
    fig.suptitle(_title(main_run), fontsize=10)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    colors = ["#2f6db3" if lab == ENGINE_LABEL else "#9aa4b1" for lab in labels]
    for ax, name in zip(axes, panels):
        ax.set_title(name, fontsize=11)
        ax.grid(axis="y", alpha=0.3)
        if name == "decode time per token":
            bars = ax.bar(labels, ms, color=colors)
            ax.bar_label(bars, fmt="%.2f", fontsize=8)
            floor = _number(main_run.get("engine") or {}, "floor_ms_per_token")
            if floor is not None:
                ax.axhline(floor, color="#c0392b", ls="--", lw=1, label=f"floor at the read ceiling {floor:.2f} ms")
                ax.legend(fontsize=8, loc="upper left")
            ax.set_ylabel("ms per token (lower is better)")
        elif name == "bandwidth and MBU":
            vals = [g if g is not None else 0.0 for g in gbps]
            bars = ax.bar(labels, vals, color=colors)
            ax.bar_label(bars, labels=[(f"{g / read:.0%} MBU" if read else f"{g:.3g} GB/s") if g is not None
                                       else "n/a" for g in gbps], fontsize=8)
            for level, text, style in ((read, "read-only ceiling", "--"), (copy, "copy (read+write)", ":")):
                if level is not None:
                    ax.axhline(level, color="#c0392b", ls=style, lw=1, label=f"{text} {level:.0f} GB/s")
            if read is not None or copy is not None:
                ax.legend(fontsize=8, loc="upper left")
            if read is None:
                why = (main_run.get("skipped") or {}).get("bandwidth", "not measured")
                ax.text(0.5, 0.92, f"no read ceiling: {why}"[:90], transform=ax.transAxes, ha="center",
                        fontsize=7, wrap=True)
            ax.set_ylabel("GB/s read per token step (higher is better)")
            top = max([v for v in vals] + [read or 0, copy or 0])
            ax.set_ylim(0, top * 1.25 if top > 0 else 1)      # room for the legend above the lines
        else:
            xs, ys = zip(*ctx)
            ax.plot(xs, ys, marker="o", color="#2f6db3")
            ax.set_xlabel("mean decode context (tokens)")
            ax.set_ylabel("ms per token")
            ax.set_ylim(bottom=0)
        ax.tick_params(axis="x", labelsize=8)

    fd, tmp = tempfile.mkstemp(prefix=".tmp-plot-", suffix="." + fmt, dir=os.path.dirname(os.path.abspath(path)))
    os.close(fd)
    try:
        fig.savefig(tmp, format=fmt, dpi=120)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return panels


def main(argv: list[str] | None = None) -> int:
    """python -m nanoqwen_bench.plot RUN.json [RUN2.json ...] -o OUT.png"""
    ap = argparse.ArgumentParser(prog="python -m nanoqwen_bench.plot", description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="result JSON files (`nanoqwen bench --json`); the first gives the bars")
    ap.add_argument("-o", "--output", required=True, help="figure file (.png, .svg or .pdf)")
    a = ap.parse_args(argv)
    try:
        results = []
        for p in a.runs:
            try:
                with open(p) as f:
                    results.append(json.load(f))
            except (OSError, ValueError) as e:
                raise PlotError(f"{p}: cannot read a bench result: {type(e).__name__}: {e}") from None
        panels = plot(results if len(results) > 1 else results[0], a.output)
    except PlotError as e:
        print(f"nanoqwen bench plot: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print(f"wrote {a.output}: {', '.join(panels)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
