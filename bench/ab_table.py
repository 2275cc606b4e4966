"""The decode A/B lines of a device call's summary (bench/device_prelude.sh's nq_ab: "ab [LABEL ]VARIANT PROMPT repN:
decode (...) X ms/token ...;MBU (vs read-only / vs copy) A% / B% (floor F ms/token);") as one table: a row per
(label, prompt), a column per variant, each cell the runs' ms/token and their mean's change against the base variant
measured in the same call (the first variant seen, or --base).

    python3 bench/ab_table.py bench/runs/<date>_<call>/summary.txt [--base main34]

Runs that printed no decode line (a variant that failed or timed out) show as "-". Markdown, for bench/NOTES.md.
"""
from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict

LINE = re.compile(r"^ab (?:(?P<label>\S+) )?(?P<variant>\S+) (?P<prompt>\d+) rep(?P<rep>\d+):\s*(?P<rest>.*)$")
DECODE = re.compile(r"decode \([^)]*\) (?P<ms>[0-9.]+) ms/token")
MBU = re.compile(r"MBU \(vs read-only / vs copy\) (?P<mbu>[0-9.]+)%")


def parse(lines):
    """{(label, prompt): {variant: [(ms or None, mbu or None), ...]}} and the variants in order of appearance."""
    cells: dict[tuple[str, int], dict[str, list]] = defaultdict(lambda: defaultdict(list))
    order: list[str] = []
    for line in lines:
        m = LINE.match(line.strip())
        if not m:
            continue
        rest = m["rest"]
        d, u = DECODE.search(rest), MBU.search(rest)
        key = (m["label"] or "", int(m["prompt"]))
        cells[key][m["variant"]].append((float(d["ms"]) if d else None, float(u["mbu"]) if u else None))
        if m["variant"] not in order:
            order.append(m["variant"])
    return cells, order


def table(cells, order, base: str | None) -> str:
    base = base or (order[0] if order else None)
    head = "| case | " + " | ".join(order) + " |"
    out = [head, "|" + "---|" * (len(order) + 1)]
    for key in sorted(cells):
        label, prompt = key
        runs = cells[key]
        ref = [ms for ms, _ in runs.get(base, []) if ms is not None]
        ref_mean = sum(ref) / len(ref) if ref else None
        row = []
        for v in order:
            ms = [x for x, _ in runs.get(v, []) if x is not None]
            if not runs.get(v):
                row.append("")
                continue
            if not ms:
                row.append("-")
                continue
            text = " / ".join(f"{x:.3f}" for x in ms)
            if ref_mean and v != base:
                text += f" ({100 * (sum(ms) / len(ms) / ref_mean - 1):+.1f} %)"
            mbu = [u for _, u in runs[v] if u is not None]
            if v == base and mbu:
                text += f" (MBU {sum(mbu) / len(mbu):.1f} %)"
            row.append(text)
        out.append(f"| {(label + ' ') if label else ''}{prompt} | " + " | ".join(row) + " |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("summary", help="a device call's summary.txt")
    ap.add_argument("--base", help="the variant the changes are against (default: the first one seen)")
    a = ap.parse_args(argv)
    try:
        with open(a.summary, encoding="utf-8") as f:
            cells, order = parse(f)
    except OSError as e:
        print(f"ab_table: cannot read {a.summary}: {e.strerror}", file=sys.stderr)
        return 1
    if not cells:
        print(f"ab_table: no 'ab ...' lines in {a.summary}", file=sys.stderr)
        return 1
    if a.base and a.base not in order:
        print(f"ab_table: base variant {a.base!r} not in {a.summary} (variants: {', '.join(order)})", file=sys.stderr)
        return 1
    print(table(cells, order, a.base))
    return 0


if __name__ == "__main__":
    sys.exit(main())
