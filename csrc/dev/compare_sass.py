"""Compare the SASS of libnanoqwen's GEMV / GEMM kernels between two source trees: per kernel the registers, spills,
instruction count, and whether the instruction sequence is identical (kernel-parameter offsets aside) or has the
same opcodes. Kernel names are matched without the anonymous-namespace hash; an instantiation `<..., false>` (the
layout-1 build of a ZP template) is matched to the base tree's name without it.
    git archive REV csrc | tar -x -C /tmp/base      # a tree to compare against
    python3 csrc/dev/compare_sass.py /tmp/base .    # [--cuobjdump PATH] [--arch 90a,80] [--files gemv,gemm]
--files names other translation units of csrc/src (e.g. attention,batch,int4_frag) by their stem.
Needs nvcc and cuobjdump (no GPU). Where the toolkit lacks cuobjdump (this project's CPU machine: nvcc only), PyPI's
wheels carry it and the nvdisasm it calls: `pip download --no-deps -d /tmp/cu nvidia-cuda-cuobjdump
nvidia-cuda-nvdisasm`, unzip both, chmod +x their nvidia/cu13/bin/*, and put that folder first in PATH."""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile

FILES = "gemv,gemm"


def build(root, arch, out, cuobjdump, files):
    res = {}
    for f in files:
        cubin = os.path.join(out, f"{f}.{arch}.cubin")
        p = subprocess.run(["nvcc", "-O3", "-DNDEBUG", "-std=c++17", "--expt-relaxed-constexpr", "-lineinfo",
                            "-Xptxas=-v", f"-arch=sm_{arch}", "-cubin", f"-I{root}/csrc/include", f"-I{root}/csrc/src",
                            f"{root}/csrc/src/{f}.cu", "-o", cubin], capture_output=True, text=True)
        if p.returncode:
            sys.exit(f"nvcc failed on {root}/csrc/src/{f}.cu:\n{p.stderr[-2000:]}")
        sass = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True, check=True).stdout
        res[f] = (p.stderr, sass)
    return res


def parse(ptxas, sass):
    info = collections.defaultdict(dict)
    cur = None
    for line in ptxas.splitlines():
        m = re.search(r"Compiling entry function '(\S+)'", line) or re.search(r"Function properties for (\S+)", line)
        if m:
            cur = m.group(1)
        m = re.search(r"Used (\d+) registers", line)
        if m and cur:
            info[cur]["regs"] = int(m.group(1))
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and cur:
            info[cur]["spill"] = (int(m.group(1)), int(m.group(2)))
    seq = collections.defaultdict(list)
    cur = None
    for line in sass.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = m.group(1)
            continue
        m = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(.*?);", line)
        if m and cur:
            seq[cur].append(re.sub(r"c\[0x0\]\[0x[0-9a-f]+\]", "c[0x0][P]", m.group(1)))
    names = subprocess.run(["c++filt"], input="\n".join(seq), capture_output=True, text=True).stdout.split("\n")
    out = {}
    for raw, dn in zip(seq, names):
        key = re.sub(r"_GLOBAL__N__\w+|\(anonymous namespace\)", "anon", dn).replace(", false>", ">")
        key = re.sub(r"\(.*\)$", "", key.replace("nq::anon::", ""))
        out[key] = dict(info.get(raw, {}), seq=seq[raw])
    return out


def opcodes(seq):
    return [x.split()[1] if x.startswith("@") else x.split()[0] for x in seq]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("new")
    ap.add_argument("--arch", default="90a,80")
    ap.add_argument("--files", default=FILES, help="translation units of csrc/src, by stem")
    ap.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "cuobjdump")
    a = ap.parse_args()
    files = a.files.split(",")
    with tempfile.TemporaryDirectory() as d:
        for arch in a.arch.split(","):
            for sub in ("b", "n"):
                os.makedirs(os.path.join(d, sub), exist_ok=True)
            b = build(a.base, arch, os.path.join(d, "b"), a.cuobjdump, files)
            n = build(a.new, arch, os.path.join(d, "n"), a.cuobjdump, files)
            for f in files:
                kb, kn = parse(*b[f]), parse(*n[f])
                print(f"== {f}.cu sm_{arch}")
                for k in sorted(set(kb) | set(kn)):
                    desc = lambda e: f"{len(e['seq']):5d} ins {e.get('regs')} regs spill {e.get('spill')}"  # noqa: E731
                    if k in kb and k in kn:
                        verdict = ("identical SASS (parameter offsets aside)" if kb[k]["seq"] == kn[k]["seq"] else
                                   "same opcodes" if opcodes(kb[k]["seq"]) == opcodes(kn[k]["seq"]) else
                                   "DIFFERENT opcodes")
                        print(f"  {k:60s} {desc(kb[k])} | {desc(kn[k])}: {verdict}")
                    elif k in kn:
                        print(f"  {k:60s} new: {desc(kn[k])}")
                    else:
                        print(f"  {k:60s} only in the base tree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
