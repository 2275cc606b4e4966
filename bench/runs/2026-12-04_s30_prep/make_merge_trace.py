"""Session 30, prepared for the next session (experiment, never main): %globaltimer points inside the decode
attention's global merge (merge_last_split, csrc/src/attention.cu as of d9bb5a3), recorded by thread 0 of the LAST
split block of each (token, KV head) only: t[0] the merge entered (the block's partials stored by thread 0), t[1] the
counter's atomic and its barrier done, t[2] the splits' (m, l) loaded, t[3] the split weights computed, t[4] thread
0's outputs written. Exports nq_amerge_trace (bench/trace_inject.py's export_fn). Run AFTER
bench/runs/2026-12-04_s30_call6/make_attn_trace.py on the same file (bench/runs/2026-12-04_s30_call6/chain_trace.py reads both, and the decode
GEMVs' records of bench/runs/2026-12-03_s25_prep/make_frag_trace.py). Usage, in a scratch copy of the tree:
python3 make_merge_trace.py csrc/src/attention.cu
Session 31 (fcb7b1b) computes the weights by a warp a head straight from global memory: where the file has that
merge, t[2] = t[3] = the weights computed (their (m, l) loads are no longer a phase of their own).
Session 33 (3de48ba on) merges in attn_merge_kernel: where the file has it, thread 0 of every merge block records
t[0] entry, t[1] the PDL wait resolved, t[2] its group's partials folded, t[3] end (t[4] = 0, which chain_trace.py
reads as this form), with n_used = the partials merged."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))   # bench/
from trace_inject import SourceEdit, device_decls, export_fn  # noqa: E402

src = SourceEdit(sys.argv[1])
rep = src.rep


def record(points: int, h: str, n_used: str) -> str:
    """thread 0's record of its `points` timer readings mt[0..points-1] (the last taken here), with h and n_used"""
    return f"""  if (tid == 0 && g_amerge_trace_on) {{
    mt[{points - 1}] = amerge_gtimer();
    const unsigned i = atomicAdd(&g_amerge_trace_n, 1u);
    if (i < kAMergeTraceMax) {{
      AMergeTraceRec r;
      for (int q = 0; q < 7; q++) r.t[q] = q < {points} ? mt[q] : 0ull;
      unsigned smid;
      asm volatile("mov.u32 %0, %smid;" : "=r"(smid));
      r.h = (unsigned){h}; r.n_used = (unsigned){n_used}; r.sm = smid; r.tok = (unsigned)t;
      g_amerge_trace[i] = r;
    }}
  }}
"""


def export_and_save():
    i = src.s.rindex("}  // namespace nq")
    src.s = src.s[:i] + export_fn("amerge", "AMerge") + src.s[i:]
    src.save()


if "attn_merge_kernel(" in src.s:   # session 33 on: the merge kernel
    rep("""template <int D>
__global__ void __launch_bounds__(kMergeThreads) attn_merge_kernel(""", """// TRACE (dev only, never main): bench/runs/2026-12-04_s30_prep/make_merge_trace.py
""" + device_decls("amerge", "AMerge", "unsigned h, n_used, sm, tok;") + """
template <int D>
__global__ void __launch_bounds__(kMergeThreads) attn_merge_kernel(""")
    rep("""  pdl_trigger();
  pdl_wait();
  constexpr int CH = D / 4, NG = kMergeThreads / CH;""", """  unsigned long long mt[4] = {};
  mt[0] = amerge_gtimer();
  pdl_trigger();
  pdl_wait();
  mt[1] = amerge_gtimer();
  constexpr int CH = D / 4, NG = kMergeThreads / CH;""")
    rep("""  __shared__ float4 g_acc[NG][CH];""", """  mt[2] = amerge_gtimer();
  __shared__ float4 g_acc[NG][CH];""")
    rep("""  o2[1] = __floats2half2_rn(o.z * iv, o.w * iv);
}""", """  o2[1] = __floats2half2_rn(o.z * iv, o.w * iv);
""" + record(4, "hq", "n_merge") + "}")
    export_and_save()
    sys.exit(0)

# the last split block's merge (merge_last_split, before 3de48ba)
rep("""template <int D, int THREADS>
__device__ __forceinline__ void merge_last_split(""", """// TRACE (dev only, never main): bench/runs/2026-12-04_s30_prep/make_merge_trace.py
""" + device_decls("amerge", "AMerge", "unsigned h, n_used, sm, tok;") + """
template <int D, int THREADS>
__device__ __forceinline__ void merge_last_split(""")
warp_weights = "if (lane == 0) inv[g] = 1.f / ll;" in src.s   # session 31's merge
entry = "float* inv, int& last) {\n  const int tid = threadIdx.x;\n"
rep(entry, entry + """  unsigned long long mt[5] = {};
  mt[0] = amerge_gtimer();
""")
rep("""  if (tid == 0) last = atomic_add_acq_rel_gpu(&a.counters[t * a.n_kv + h], 1) == n_used - 1;
  __syncthreads();
  if (!last) return;
""", """  if (tid == 0) last = atomic_add_acq_rel_gpu(&a.counters[t * a.n_kv + h], 1) == n_used - 1;
  __syncthreads();
  mt[1] = amerge_gtimer();
  if (!last) return;
""")
if warp_weights:
    rep("""    if (lane == 0) inv[g] = 1.f / ll;
  }
  __syncthreads();
""", """    if (lane == 0) inv[g] = 1.f / ll;
  }
  __syncthreads();
  mt[2] = mt[3] = amerge_gtimer();
""")
else:   # session 30's merge: the (m, l) staged in shared memory, then one thread a head
    ml_loaded = "    l[g][sp] = __ldcg(a.part_ml + r * 2 + 1);\n  }\n  __syncthreads();\n"
    rep(ml_loaded, ml_loaded + "  mt[2] = amerge_gtimer();\n")
    weights = "    inv[tid] = 1.f / ll;\n  }\n  __syncthreads();\n"
    rep(weights, weights + "  mt[3] = amerge_gtimer();\n")
rep("""  if (tid == 0) a.counters[t * a.n_kv + h] = 0;
}""", """  if (tid == 0) a.counters[t * a.n_kv + h] = 0;
""" + record(5, "h", "n_used") + "}")
export_and_save()
