"""nanoqwen_bench.plot: figures drawn from a bench result JSON alone. Checked on a real CPU bench run (through
`nanoqwen bench --plot`), on the recorded GPU run bench/peers_last.json, and on several runs (the ms/token against
context curve); the failures (no matplotlib, a bad path, a result with nothing to draw, a failing save) are one
named error and leave no partial file."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

import nanoqwen_rt.cli.commands as cli
from nanoqwen_bench import plot as bplot
from nanoqwen_bench.plot import ENGINE_LABEL, PlotError, plot

pytest.importorskip("matplotlib", reason="matplotlib (nanoqwen[plot]) is needed to draw the figures")

REPO = Path(__file__).resolve().parent.parent
RECORDED = REPO / "bench" / "peers_last.json"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the PNG header; asserts it is a PNG."""
    raw = path.read_bytes()
    assert raw[:8] == PNG_MAGIC, f"{path} is not a PNG"
    return int.from_bytes(raw[16:20], "big"), int.from_bytes(raw[20:24], "big")


def _no_temp_files(folder: Path) -> None:
    assert not [p.name for p in folder.iterdir() if p.name.startswith(".tmp-")]


def test_cli_bench_plot_on_the_cpu(model_path, tmp_path):
    """`nanoqwen bench --plot` on the CPU: a real run, its JSON, and a figure of that JSON."""
    out, js = tmp_path / "bench.png", tmp_path / "bench.json"
    r = CliRunner().invoke(cli.main, ["bench", model_path, "--no-peers", "--device", "cpu", "--prompt-tokens", "8",
                                      "--new-tokens", "4", "--repeats", "1", "--json", str(js), "--plot", str(out)],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.stderr
    w, h = _png_size(out)
    assert w > 300 and h > 200
    result = json.loads(js.read_text())
    # The CPU run has the engine's numbers but no GPU ceiling: the bars are the engine's own.
    labels, ms, gbps = bplot._bars(result)
    assert labels == [ENGINE_LABEL]
    assert ms == [result["engine"]["ms_per_token"]] and gbps == [result["engine"]["achieved_GBps"]]
    assert plot(result, str(tmp_path / "again.svg")) == ["decode time per token", "bandwidth and MBU"]
    assert (tmp_path / "again.svg").read_text().lstrip().startswith("<?xml")
    _no_temp_files(tmp_path)


def test_recorded_gpu_run(tmp_path):
    """bench/peers_last.json (an H200 run with the ceilings and the three peers) draws both panels; the bars are
    the recorded numbers, engine first."""
    result = json.loads(RECORDED.read_text())
    labels, ms, gbps = bplot._bars(result)
    assert labels[0] == ENGINE_LABEL and len(labels) == 4
    assert ms[0] == result["engine"]["ms_per_token"]
    assert ms[1:] == [result["peers"][k]["median_ms"] for k in ("torch_int4", "torch_int4_f16_lm_head",
                                                                 "cublas_fp16")]
    assert gbps[0] == result["engine"]["achieved_GBps"]
    out = tmp_path / "gpu.png"
    assert plot(result, str(out)) == ["decode time per token", "bandwidth and MBU"]
    _png_size(out)


def test_peers_only_result(tmp_path):
    """A peers-only result (bench/peers.py: no engine part) still draws the peers' bars."""
    result = json.loads(RECORDED.read_text())
    del result["engine"]
    labels, _, _ = bplot._bars(result)
    assert ENGINE_LABEL not in labels and len(labels) == 3
    assert plot(result, str(tmp_path / "peers.png")) == ["decode time per token", "bandwidth and MBU"]


def test_several_runs_add_the_context_curve(tmp_path):
    base = json.loads(RECORDED.read_text())
    runs = []
    for ctx, ms in ((576.5, 3.28), (2112.5, 3.6), (8256.5, 4.4)):     # made-up sweep: shape of the panel only
        r = json.loads(json.dumps(base))
        r["engine"].update(mean_context=ctx, ms_per_token=ms)
        runs.append(r)
    assert bplot._context_points(runs[::-1]) == [(576.5, 3.28), (2112.5, 3.6), (8256.5, 4.4)]
    assert plot(runs, str(tmp_path / "sweep.png"))[-1] == "ms/token against context length"


def test_failures_are_named_and_leave_no_file(tmp_path, monkeypatch):
    good = json.loads(RECORDED.read_text())
    with pytest.raises(PlotError, match="must end in one of"):
        plot(good, str(tmp_path / "out.jpg"))
    with pytest.raises(PlotError, match="no such folder"):
        plot(good, str(tmp_path / "missing" / "out.png"))
    with pytest.raises(PlotError, match="no engine or peer timings"):
        plot({"gpu": "x", "skipped": {}}, str(tmp_path / "empty.png"))
    with pytest.raises(PlotError, match="JSON object"):
        plot(["not a result"], str(tmp_path / "bad.png"))
    assert list(tmp_path.iterdir()) == []

    # A save that fails half-way leaves the previous figure untouched and no temp file.
    target = tmp_path / "keep.png"
    target.write_bytes(b"previous figure")
    from matplotlib.figure import Figure

    def broken_save(self, fname, **kw):
        Path(fname).write_bytes(b"half a PNG")
        raise OSError("disk full")
    monkeypatch.setattr(Figure, "savefig", broken_save)
    with pytest.raises(OSError, match="disk full"):
        plot(good, str(target))
    assert target.read_bytes() == b"previous figure"
    _no_temp_files(tmp_path)


def test_missing_matplotlib_is_one_line_before_the_run(model_path, tmp_path, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)      # import matplotlib -> ImportError
    with pytest.raises(PlotError, match=r"pip install 'nanoqwen\[plot\]'"):
        plot(json.loads(RECORDED.read_text()), str(tmp_path / "x.png"))
    r = CliRunner().invoke(cli.main, ["bench", model_path, "--no-peers", "--device", "cpu", "--plot",
                                      str(tmp_path / "x.png")], catch_exceptions=False)
    assert r.exit_code == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "matplotlib is not installed" in lines[0], r.stderr
    assert "TTFT" not in r.stdout, "the bench ran although its figure could not be drawn"
    assert not os.listdir(tmp_path)
