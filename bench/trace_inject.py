"""Text for branch-only %globaltimer instrumentation of a product kernel (experiments only, never main): the
record's struct, its device buffer, counter and switch, the timer, and the exported dump function. Used by the
scripts that write a trace into a scratch copy of csrc (bench/runs/2026-12-04_s30_call6/make_attn_trace.py: the decode
attention; bench/runs/2026-12-04_s30_prep/make_merge_trace.py: inside its global merge;
bench/runs/2026-12-03_s25_prep/make_frag_trace.py: the decode GEMV)."""


def replace_once(s: str, old: str, new: str, where: str = "") -> str:
    """s with its one occurrence of old replaced by new (an anchor that moved fails loudly)."""
    n = s.count(old)
    if n != 1:
        raise SystemExit(f"trace_inject: {where}: anchor found {n} times: {old[:70]!r}")
    return s.replace(old, new)


class SourceEdit:
    """A source file's text for anchored edits: rep(old, new) replaces old's one occurrence (an anchor that moved fails
    loudly), save() writes the text back."""

    def __init__(self, path: str):
        self.path = path
        self.s = open(path).read()

    def rep(self, old: str, new: str) -> None:
        self.s = replace_once(self.s, old, new, self.path)

    def save(self) -> None:
        with open(self.path, "w") as f:
            f.write(self.s)


def device_decls(tag: str, Tag: str, fields: str) -> str:
    """struct <Tag>TraceRec {t[7]; fields}, g_<tag>_trace[1 << 18], its count and switch, <tag>_gtimer()"""
    return f"""struct {Tag}TraceRec {{
  unsigned long long t[7];
  {fields}
}};
constexpr unsigned k{Tag}TraceMax = 1u << 18;
__device__ {Tag}TraceRec g_{tag}_trace[k{Tag}TraceMax];
__device__ unsigned g_{tag}_trace_n;
__device__ int g_{tag}_trace_on;
__device__ __forceinline__ unsigned long long {tag}_gtimer() {{
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}}
"""


def export_fn(tag: str, Tag: str) -> str:
    """extern "C" nq_<tag>_trace(on, path): on = 1 starts recording (count reset), 0 stops; with a path, writes the
    records there and returns their count"""
    return f"""// TRACE (dev only): on = 1 starts recording (count reset), on = 0 stops; with a path, writes the records there
extern "C" __attribute__((visibility("default"))) int nq_{tag}_trace(int on, const char* path) {{
  if (path) {{
    unsigned n = 0;
    cudaDeviceSynchronize();
    cudaMemcpyFromSymbol(&n, g_{tag}_trace_n, 4);
    if (n > k{Tag}TraceMax) n = k{Tag}TraceMax;
    {Tag}TraceRec* v = ({Tag}TraceRec*)malloc(n * sizeof({Tag}TraceRec) + 1);
    if (n) cudaMemcpyFromSymbol(v, g_{tag}_trace, n * sizeof({Tag}TraceRec));
    FILE* f = fopen(path, "wb");
    if (!f) {{ free(v); return -1; }}
    fwrite(v, sizeof({Tag}TraceRec), n, f);
    fclose(f);
    free(v);
    return (int)n;
  }}
  unsigned z = 0;
  cudaMemcpyToSymbol(g_{tag}_trace_n, &z, 4);
  cudaMemcpyToSymbol(g_{tag}_trace_on, &on, 4);
  return 0;
}}

"""


def traced_decode(path: str, prompt: int, tag: str, new_tokens: int, dump: str) -> int:
    """Runs a product library built with a trace (NANOQWEN_LIB) on `path`: a warm-up generation, then nq_<tag>_trace
    on for one generation of new_tokens after the same random prompt (its prefill included), the records dumped to
    `dump`; returns their count"""
    return traced_decode_tags(path, prompt, {tag: dump}, new_tokens)[tag]


def traced_decode_tags(path: str, prompt: int, dumps: dict, new_tokens: int, optional: tuple = ()) -> dict:
    """traced_decode with several traces at once: dumps maps each tag to its dump file; a tag in `optional` that the
    library does not export is left out. Returns {tag: record count} of the tags traced."""
    import ctypes

    import numpy as np

    from nanoqwen_rt.engine import Engine
    from nanoqwen_rt.sampling import SamplingParams

    eng = Engine(path, device="cuda", max_context=prompt + 64, verify_checksums=False)
    be = eng.backend
    fns = {}
    for tag in dumps:
        fn = getattr(be._lib, f"nq_{tag}_trace", None)   # the product CDLL, built with the trace
        if fn is None:
            if tag in optional:
                continue
            raise SystemExit(f"trace_inject: the library has no nq_{tag}_trace (built without that trace?)")
        fn.argtypes = [ctypes.c_int, ctypes.c_char_p]
        fns[tag] = fn
    ids = np.random.default_rng(0).integers(0, 150000, size=prompt, dtype=np.int64).astype(np.int32)
    g = SamplingParams(temperature=0.0)
    list(be.generate_ids(ids, g, 8, ()))   # warm-up
    for fn in fns.values():
        fn(1, None)
    list(be.generate_ids(ids, g, new_tokens, ()))
    counts = {tag: fn(0, dumps[tag].encode()) for tag, fn in fns.items()}
    for fn in fns.values():
        fn(0, None)
    return counts
