"""Checks the register-A rule of csrc/dev/gemm_int4_wgmma.cu in the SASS: between an HGMMA that reads A from
registers and the WARPGROUP.DEPBAR that retires it, no instruction may write those registers.
    cuobjdump -sass build/dev/gemm_int4_wgmma | python3 csrc/dev/check_wgmma_sass.py
Prints one line per kernel (OK or the offending instructions); exit status 1 if any kernel breaks the rule."""
import re
import sys

WIDTH = {".64": 2, ".128": 4}


def dest_regs(ins):
    """registers an instruction writes (its first operand if it is a register), with the width of 64/128-bit ops"""
    m = re.match(r"\s*(@!?U?P\w+\s+)?([A-Z0-9_.]+)\s+(.*)", ins)
    if not m:
        return set()
    op, args = m.group(2), m.group(3)
    if op.startswith(("ST", "HGMMA", "WARPGROUP", "BAR", "BRA", "LDGSTS", "SYNCS", "RED", "ATOM", "EXIT", "NOP",
                      "DEPBAR", "MEMBAR", "ISETP", "FSETP", "PLOP3", "UTMA", "WARPSYNC", "BSYNC", "BSSY", "CALL", "RET")):
        return set()
    r = re.match(r"R(\d+)\b", args)
    if not r:
        return set()
    base, n = int(r.group(1)), 1
    for suf, w in WIDTH.items():
        if suf in op.split(".", 1)[-1:][0] if "." in op else False:
            n = w
    if op.startswith(("LDS", "LDG", "LD.", "LDL", "LDSM")):
        for suf, w in WIDTH.items():
            if suf in op:
                n = w
    if op.startswith(("IMAD.WIDE", "LEA.HI.X")) or ".WIDE" in op:
        n = 2
    return set(range(base, base + n))


def scan(instrs, lo, hi, pending, bad, follow_loops):
    """walks instrs[lo:hi] in address order; a backward branch taken with HGMMAs pending walks the loop body again
    with them pending (the k loop's next iteration)"""
    i = lo
    while i < hi:
        addr, ins = instrs[i]
        h = re.search(r"HGMMA\.\S+\s+R\d+,\s+R(\d+),", ins)
        if h:
            pending |= set(range(int(h.group(1)), int(h.group(1)) + 4))
        elif "WARPGROUP.DEPBAR" in ins:
            if re.search(r"gsb0,\s*0x0\b", ins):  # wait for all; a partial wait keeps every A register pending
                pending = set()
        else:
            if dest_regs(ins) & pending and ins.strip() not in bad:
                bad.append(ins.strip())
            b = re.search(r"\bBRA\s+(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)", ins)
            if b and follow_loops and pending:
                target = int(b.group(1), 16)
                if target <= addr:
                    t = next(j for j, (a, _) in enumerate(instrs) if a >= target)
                    scan(instrs, t, i, set(pending), bad, False)
        i += 1
    return pending


def check(instrs):
    bad = []
    scan(instrs, 0, len(instrs), set(), bad, True)
    return bad


def main():
    kernels, func = {}, None
    for line in sys.stdin:
        m = re.search(r"Function : (\S+)", line)
        if m:
            func = m.group(1)
            kernels[func] = []
            continue
        m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m and func is not None:
            kernels[func].append((int(m.group(1), 16), m.group(2)))
    bad_any = False
    for func, instrs in kernels.items():
        if "gemm_int4_wgmma" not in func:
            continue
        bad = check(instrs)
        name = re.sub(r"EEEvN2nq.*", "", func)
        print(f"{'OK  ' if not bad else 'BAD '} {name}" + ("" if not bad else "\n      " + "\n      ".join(bad[:6])))
        bad_any = bad_any or bool(bad)
    return 1 if bad_any else 0


if __name__ == "__main__":
    sys.exit(main())
