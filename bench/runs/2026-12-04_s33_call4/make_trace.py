"""Session 33 call 4 (experiment, never main): %globaltimer records in the decode attention as of 3de48ba (the
splits' merge in attn_merge_kernel) for session 30's chain trace. attn_decode_kernel: thread 0 of every block with
keys records t[0] entry, t[1] the cluster prologue done, t[2] the PDL wait resolved, t[3] q staged, t[4] tiles done,
t[5] the warps' O in shared memory, t[6] end (as bench/runs/2026-12-04_s30_call6/make_attn_trace.py, whose anchors
are the kernel before 3de48ba). attn_merge_kernel: thread 0 of every block records t[0] entry, t[1] the PDL wait
resolved, t[2] its group's partials folded, t[3] end (the tag "amerge", the record chain_trace.py here reads).
Exports nq_attn_trace and nq_amerge_trace. Usage, in a scratch copy of the tree: python3 make_trace.py
csrc/src/attention.cu"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))   # bench/
from trace_inject import SourceEdit, device_decls, export_fn  # noqa: E402

src = SourceEdit(sys.argv[1])
rep = src.rep

rep("""template <int D, int WARPS, bool CLUSTER>
__global__ void __launch_bounds__(WARPS * 32) attn_decode_kernel(const AttnArgs a) {
""", """// TRACE (dev only, never main): bench/runs/2026-12-04_s33_call4/make_trace.py
""" + device_decls("attn", "Attn", "unsigned h, split, sm, flags;")
    + device_decls("amerge", "AMerge", "unsigned h, n_used, sm, tok;") + """
template <int D, int WARPS, bool CLUSTER>
__global__ void __launch_bounds__(WARPS * 32) attn_decode_kernel(const AttnArgs a) {
  unsigned long long tt[7] = {};
  tt[0] = attn_gtimer();
  const int trace_on = threadIdx.x == 0 ? g_attn_trace_on : 0;
  unsigned trace_flags = 0;
  auto trace_end = [&]() {
    if (trace_on) {
      tt[6] = attn_gtimer();
      const unsigned i = atomicAdd(&g_attn_trace_n, 1u);
      if (i < kAttnTraceMax) {
        AttnTraceRec r;
        for (int q = 0; q < 7; q++) r.t[q] = tt[q];
        unsigned smid;
        asm volatile("mov.u32 %0, %smid;" : "=r"(smid));
        r.h = blockIdx.x; r.split = blockIdx.y; r.sm = smid; r.flags = trace_flags;
        g_attn_trace[i] = r;
      }
    }
  };
""")
rep("""  if (split >= (dsmem ? C : n_used)) return;
""", """  if (split >= (dsmem ? C : n_used)) return;
  trace_flags = (unsigned)n_used | (dsmem ? 256u : 0u) | ((unsigned)C << 9) | ((unsigned)WARPS << 14) |
                ((unsigned)n_keys << 18);
""")
rep("""    cluster_wait();
  }
#endif
  const int k0 = split * kps""", """    cluster_wait();
  }
#endif
  tt[1] = attn_gtimer();
  const int k0 = split * kps""")
rep("""  if (a.write_kv) {   // q, k and v of this step come from the kernel before
    pdl_wait();
    pdl_trigger();
  }
""", """  if (a.write_kv) {   // q, k and v of this step come from the kernel before
    pdl_wait();
    pdl_trigger();
  }
  tt[2] = attn_gtimer();
""")
rep("""  __syncthreads();   // q, knew, vnew staged
""", """  __syncthreads();   // q, knew, vnew staged
  tt[3] = attn_gtimer();
""")
rep("""  __syncthreads();   // every warp is done with its ring: obuf may overwrite it
""", """  __syncthreads();   // every warp is done with its ring: obuf may overwrite it
  tt[4] = attn_gtimer();
""")
rep("""  __syncthreads();   // the warps' O in obuf
""", """  __syncthreads();   // the warps' O in obuf
  tt[5] = attn_gtimer();
""")
rep("""      o2[1] = __floats2half2_rn(acc.z * iv, acc.w * iv);
    }
    return;
  }
#endif""", """      o2[1] = __floats2half2_rn(acc.z * iv, acc.w * iv);
    }
    trace_end();
    return;
  }
#endif""")
rep("""    a.part_ml[(ph0 + (size_t)tid * a.n_split + split) * 2 + 1] = S.inv[tid];
  }
}""", """    a.part_ml[(ph0 + (size_t)tid * a.n_split + split) * 2 + 1] = S.inv[tid];
  }
  trace_end();
}""")
# the merge kernel
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
  if (tid == 0 && g_amerge_trace_on) {
    mt[3] = amerge_gtimer();
    const unsigned i = atomicAdd(&g_amerge_trace_n, 1u);
    if (i < kAMergeTraceMax) {
      AMergeTraceRec r;
      for (int q = 0; q < 7; q++) r.t[q] = q < 4 ? mt[q] : 0ull;
      unsigned smid;
      asm volatile("mov.u32 %0, %smid;" : "=r"(smid));
      r.h = (unsigned)hq; r.n_used = (unsigned)n_merge; r.sm = smid; r.tok = (unsigned)t;
      g_amerge_trace[i] = r;
    }
  }
}""")
i = src.s.rindex("}  // namespace nq")
src.s = src.s[:i] + export_fn("attn", "Attn") + export_fn("amerge", "AMerge") + src.s[i:]
src.s = src.s.replace("#include <type_traits>\n", "#include <type_traits>\n#include <cstdio>\n#include <cstdlib>\n", 1)
src.save()
