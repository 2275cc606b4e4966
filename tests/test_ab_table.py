"""bench/ab_table.py: a device call's nq_ab lines as one table, each variant's mean against the base measured in the
same call."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SUMMARY = """\
t 1796418028 start
ab main34 512 rep1: decode (64 greedy tokens) 1.500 ms/token = 666.7 tokens/s;MBU (vs read-only / vs copy) 70.0% / 72.0% (floor 1.021 ms/token);
ab fast 512 rep1: decode (64 greedy tokens) 1.200 ms/token = 833.3 tokens/s;MBU (vs read-only / vs copy) 85.0% / 87.0% (floor 1.021 ms/token);
ab main34 512 rep2: decode (64 greedy tokens) 1.500 ms/token = 666.7 tokens/s;MBU (vs read-only / vs copy) 72.0% / 72.0% (floor 1.021 ms/token);
ab fast 512 rep2: decode (64 greedy tokens) 1.300 ms/token = 769.2 tokens/s;MBU (vs read-only / vs copy) 80.0% / 82.0% (floor 1.021 ms/token);
ab hung 512 rep1: 
ab 0.5B main34 4500 rep1: decode (64 greedy tokens) 0.500 ms/token = 2000.0 tokens/s;MBU (vs read-only / vs copy) 20.0% / 21.0% (floor 0.106 ms/token);
"""


def _module():
    spec = importlib.util.spec_from_file_location("ab_table", ROOT / "bench" / "ab_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_table_against_the_first_variant(tmp_path, capsys):
    ab = _module()
    path = tmp_path / "summary.txt"
    path.write_text(SUMMARY)
    assert ab.main([str(path)]) == 0
    rows = {line.split(" | ")[0]: line for line in capsys.readouterr().out.splitlines()}
    assert rows["| case"] == "| case | main34 | fast | hung |"
    # fast: mean 1.25 against 1.5 (-16.7 %); the base shows its mean MBU; a run without a decode line is "-"
    assert rows["| 512"] == "| 512 | 1.500 / 1.500 (MBU 71.0 %) | 1.200 / 1.300 (-16.7 %) | - |"
    assert rows["| 0.5B 4500"] == "| 0.5B 4500 | 0.500 (MBU 20.0 %) |  |  |"


def test_errors_are_one_line(tmp_path, capsys):
    ab = _module()
    assert ab.main([str(tmp_path / "missing.txt")]) == 1
    empty = tmp_path / "empty.txt"
    empty.write_text("t 1 start\n")
    assert ab.main([str(empty)]) == 1
    path = tmp_path / "summary.txt"
    path.write_text(SUMMARY)
    assert ab.main([str(path), "--base", "nope"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("ab_table: ") for line in err)
